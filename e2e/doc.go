// Package e2e holds the process-level tests of the idem command (SPEC §10–§11): they
// build the idem binary once per test run, start real `idem payments` processes on
// loopback ports over real SQLite files and PostgreSQL databases, and talk HTTP to them.
//
// The processes are built without -race by default: a race-built binary with the pure
// Go SQLite driver is several times slower, and the library packages already run their
// own tests under -race. Set IDEM_E2E_RACE=1 to build the processes with -race too.
// IDEM_E2E_BIN names a prebuilt binary to use instead of building one.
package e2e
