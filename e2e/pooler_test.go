package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/load"
	"github.com/idem-go/idem/internal/pgtest"
)

// bouncerPoolSize is the server connections of the tests' PgBouncer, per database: the
// processes of a test share them, whatever their own pools.
const bouncerPoolSize = 4

// bouncedPostgresStore returns the URL of a fresh database of its own (postgresStore)
// behind a private PgBouncer in transaction mode, in pgx's exec mode mode: what
// docs/operations.md says to run behind a PgBouncer that keeps no prepared statements.
func bouncedPostgresStore(t *testing.T, mode string) string {
	t.Helper()
	return pgtest.WithExecMode(t, pgtest.Bouncer(t, postgresStore(t), bouncerPoolSize), mode)
}

// loadExactlyOnce runs idem load against url with concurrent duplicates (each key from
// four workers at once) on endpoint, and fails the test unless exactly-once holds and
// no request got a 5xx.
func loadExactlyOnce(t *testing.T, url string, endpoint load.Endpoint, unkeyedAPI bool) {
	t.Helper()
	ctx := context.Background()
	res, err := load.Run(ctx, load.Config{URL: url, Concurrency: 16, Requests: 400,
		ConcurrentDuplicates: 4, Endpoint: endpoint, UnkeyedAPI: unkeyedAPI})
	if err != nil {
		t.Fatalf("load %s: %v", endpoint, err)
	}
	v, err := load.Verify(ctx, res)
	if err != nil {
		t.Fatalf("verify %s: %v", endpoint, err)
	}
	t.Logf("%s: %d requests, statuses %v, conflicts %v, %d replayed; %s", endpoint, res.Summary.Requests,
		res.Summary.Status, res.Summary.ConflictCodes, res.Summary.Replayed, v.Line())
	if v.Result != load.ExactlyOnceOK || v.Created == 0 {
		t.Fatalf("%s: %s (%d created)\n%s", endpoint, v.Line(), v.Created, strings.Join(v.Discrepancies, "\n"))
	}
	if res.Summary.Errors > 0 {
		t.Errorf("%s: %d connection errors", endpoint, res.Summary.Errors)
	}
	for status, n := range res.Summary.Status {
		if strings.HasPrefix(status, "5") {
			t.Errorf("%s: %d answers %s behind PgBouncer, want none", endpoint, n, status)
		}
	}
}

// TestPaymentsBehindPgBouncerExecutesEachKeyOnce runs `idem payments` on a PostgreSQL
// store reached through PgBouncer in transaction mode (cache_describe) and loads it
// with concurrent duplicates: the lease path (POST /v1/charges: claim, steps, InTx) and
// the ClaimInHandler path (POST /v1/orders: Respond, whose replays stop at the
// record). No 5xx, exactly once. Before issue 36 the first try got thousands of 5xx:
// Respond prepared its statements by name, which a transaction pooler does not keep.
func TestPaymentsBehindPgBouncerExecutesEachKeyOnce(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--store", bouncedPostgresStore(t, "cache_describe"))
	loadExactlyOnce(t, s.URL(), load.EndpointCharges, false)
	loadExactlyOnce(t, s.URL(), load.EndpointOrders, false)
}

// TestProxyBehindPgBouncerExecutesEachKeyOnce runs `idem proxy` with its records in
// PostgreSQL reached through PgBouncer in transaction mode (exec), in front of `idem
// payments --disable-idempotency` (no keys of its own), and loads it with concurrent
// duplicates: each key reaches the upstream once (idem load --unkeyed-api: every charge
// is one that an answer named), and no request gets a 5xx. Before
// issue 36 the proxy answered every keyed request 503 behind PgBouncer.
func TestProxyBehindPgBouncerExecutesEachKeyOnce(t *testing.T) {
	t.Parallel()
	api := startServer(t, "--store", sqliteStore(t), "--disable-idempotency")
	px := newCommand(t, "proxy", "--upstream", api.URL(), "--store", bouncedPostgresStore(t, "exec"))
	px.start("127.0.0.1:0")
	loadExactlyOnce(t, px.URL(), load.EndpointCharges, true) // the API records the derived key, not the client's
}
