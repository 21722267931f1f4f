package sqlite

import "testing"

// ClaimSynchronous returns PRAGMA synchronous on the connection that writes claims.
func ClaimSynchronous(t *testing.T, s *Store) int {
	t.Helper()
	var n int
	if err := s.claimDB.QueryRow(`PRAGMA synchronous`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// MigrationCount is the number of embedded migrations.
func MigrationCount(t testing.TB) int {
	t.Helper()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	return len(ms)
}
