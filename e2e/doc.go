// Package e2e holds the process-level tests of the idem command (SPEC §10–§11): they
// build the idem binary once per test run, start real `idem payments` processes on
// loopback ports over real SQLite files, PostgreSQL databases (one fresh database per
// test on the shared server, dropped at cleanup) and Redis, and talk HTTP to them.
// processor_test.go adds `idem processor`, a card processor on an SQLite file of its
// own, and SIGKILLs payments while it waits on it (SPEC §13): the tests read the
// processor's records to kill at that moment, and count its charges. proxy_test.go
// runs `idem proxy` processes in front of upstreams that are not Go (testdata/upstream.js
// on Node.js, testdata/upstream.py on Python, each counting its requests and effects and
// optionally deduplicating by key) and SIGKILLs a proxy while the upstream works on its
// request (SPEC §17); without node or python3 those tests skip, and fail under CI=true.
// unfinished_test.go stops the processor (SIGSTOP) in the middle of a charge for
// longer than the charge's TTL, and checks that the charge is finished once, under its
// first processor key, by the client's retry or the completer, and what an operator
// sees of it meanwhile (issue 20).
//
// The processes are built without -race by default, by scripts/build-static as the
// Docker image's binary is (one build serves the process tests and the Docker test,
// within 10 minutes): a race-built binary with the pure Go SQLite driver is several
// times slower, and the library packages already run their own tests under -race. Set
// IDEM_E2E_RACE=1 to build the processes with -race too.
// IDEM_E2E_BIN names a prebuilt binary to use instead of building one.
//
// The outage tests stop a PostgreSQL cluster of their own (initdb and pg_ctl from
// /usr/lib/postgresql/*/bin, run as the postgres OS user when the tests run as root),
// never the shared server; without initdb they skip, and fail under CI=true.
//
// skew_test.go runs the previous release beside this build on one store (issue 46,
// SPEC §20): internal/release builds it from the repository's own history (by its
// commit, not its tag) into ~/.cache/idem/release; in a clone without that history
// (a shallow one) the test skips, and fails under CI=true.
//
// Tests wait on signals, not sleeps: a server's listening line on stderr, an in-flight
// record read from the store, an endpoint polled with a deadline. The only sleeps are
// part of a scenario (a TTL to outlive, a duplicate sent while a holder is slow, a kill
// at a random moment).
package e2e
