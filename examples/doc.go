// Package examples holds idem's runnable examples, each a module of its own (go.mod with
// a replace of the root module), so that the root module never requires a web framework:
// the quick starts of the README and docs/library.md (sqlite, postgres, postgres-sql,
// mysql, redis), the framework examples (chi, gin, echo, fiber), and payouts, the hard case
// of docs/foreign-effects.md: a handler that reserves funds in PostgreSQL and calls a
// bank, with a step, a derived key, the route's resume function, the completer, and a
// crash test that SIGKILLs it under retrying clients. Each is a whole program a
// user can copy out of the repository: it imports the standard library, idem's public
// packages and its framework or driver only, and its tests are its own.
//
// The framework examples mount idem once the framework has matched the route, so that
// idem's Observer labels its events (idemprom's metrics, idemotel's spans) with the
// route instead of route="": chi inline (r.With), where chi has set Request.Pattern; gin
// and echo through a small adapter that sets Request.Pattern from the matched route and
// runs the route's handler inside idem, writing to its capture; Fiber, whose adaptor's
// request has no pattern, with RouteOptions.Name.
//
// The tests of this package run each example's vet and tests on a copy outside the
// repository, check that no example imports an internal package of idem, and run `idem
// check` against the framework examples and the SQLite quick start, so that the
// README's test command and CI cover them.
package examples
