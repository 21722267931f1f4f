// Package idem makes non-idempotent HTTP requests safe to retry: a client sends
// `Idempotency-Key: <random id>` with a POST or PATCH, and the server executes the
// operation at most once per (scope, key) and replays the same response to every retry,
// across restarts, crashes and any number of processes sharing one [Store].
//
// The package holds the pieces that do not depend on any database: the net/http
// middleware, the record state machine ([Decide]), key parsing ([ParseKey]), request
// fingerprinting ([FingerprintRequest]), the [Store] interface that every backend
// implements, and the errors of SPEC §9. It imports the standard library only; the
// stores live in their own packages (store/sqlite, store/postgres, store/redis,
// store/memory) so that importing idem links none of their drivers.
//
// A request goes through these steps (see docs/state-machine.md):
//
//  1. The key is parsed and the request fingerprinted (method, path, sorted query,
//     canonical body).
//  2. One atomic store operation claims (scope, key): it inserts an in-flight record
//     with a fresh lock token and lease, or reports the record that is already there.
//  3. The handler runs while a heartbeat renews the lease; its response is captured.
//  4. The response is stored (completing the record) or the key is released, both
//     fenced by the lock token. SQL stores can complete the record inside the
//     application's own transaction (SPEC §7), so the business writes and the stored
//     response commit together or not at all.
package idem
