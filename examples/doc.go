// Package examples holds idem's runnable examples, each a module of its own (go.mod
// with a replace of the root module), so that the root module never requires a web
// framework: the README's quick starts (sqlite, postgres, postgres-sql, redis), each a
// whole program a user can copy, and the framework examples (chi, gin, echo, fiber).
// What the framework examples share is in internal/, with the checks every example's
// test runs. The test of this package runs each example's own tests, so that the
// README's test command and CI cover them.
package examples
