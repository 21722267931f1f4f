package postgres

// KeyLock is the advisory lock (pg_advisory_xact_lock(class, id)) that a ClaimInHandler
// claim of (scope, key) holds until its transaction ends, for tests that stand in for
// a concurrent claim.
func KeyLock(scope, key string) (class, id int32) { return keyLockClass, keyLockID(scope, key) }
