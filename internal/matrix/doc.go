// Package matrix is idem's configuration-matrix suite (SPEC §16): one table-driven test
// over every supported combination of store × route kind × helper × mounting, plus the
// core API (Do, DoTx), the queue consumer and gRPC on their own axes. Every cell sends a
// sequential retry and 16 concurrent duplicates of one key and asserts exactly one of
// three outcomes:
//
//   - exactly once: one effect, and every answer is the first execution's response
//     (replays marked Idempotent-Replayed: true, byte for byte) or an in-flight 409;
//     no error is logged;
//   - refused at construction: building the route (or the interceptor) panics, naming
//     the option and what to use instead;
//   - loud on the first request: no answer is a 2xx and none says it was replayed, and
//     an error naming the route (or method) is logged.
//
// Each cell's expected outcome is written once, in cells.go; docs/combinations.md is
// generated from it (go test -run TestCombinationsDocument -update) and the suite
// fails when the document and the table differ. A new option, store, helper or adapter
// is not done until it has its column here.
//
// It is a module of its own so that the frameworks it mounts idem in (chi, gin) stay out
// of the root module's requirements; the root module's docs tests run it.
package matrix
