// Package examples holds idem's framework examples: chi, gin, echo and fiber, each a
// runnable module of its own (go.mod with a replace of the root module), so that the
// root module never requires a web framework. What they share is in internal/. The
// test of this package runs each example's own tests, so that the README's test
// command and CI cover them.
package examples
