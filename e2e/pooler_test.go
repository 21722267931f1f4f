package e2e

import (
	"context"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultproxy"
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
	res, err := load.Run(context.Background(), load.Config{URL: url, Concurrency: 16, Requests: 400,
		ConcurrentDuplicates: 4, Endpoint: endpoint, UnkeyedAPI: unkeyedAPI})
	if err != nil {
		t.Fatalf("load %s: %v", endpoint, err)
	}
	if failed := verifyExactlyOnce(t, res, endpoint); failed > 0 {
		t.Errorf("%s: %d answers 5xx behind PgBouncer, want none", endpoint, failed)
	}
}

// verifyExactlyOnce fails the test unless the load res executed each of its keys
// once and no request failed to connect, and returns how many answers were 5xx.
func verifyExactlyOnce(t *testing.T, res *load.Result, endpoint load.Endpoint) int64 {
	t.Helper()
	ctx := context.Background()
	v, err := load.Verify(ctx, res)
	if err != nil {
		t.Fatalf("verify %s: %v", endpoint, err)
	}
	t.Logf("%s: %d requests, statuses %v, conflicts %v, %d replayed; %s", endpoint, res.Summary.Requests,
		res.Summary.Status, res.Summary.ConflictCodes, res.Summary.Replayed, v.Line())
	if v.Result != load.ExactlyOnceOK || v.Created == 0 {
		t.Fatalf("%s: %s (%d created)\n%s", endpoint, v.Line(), v.Created, strings.Join(v.Discrepancies, "\n"))
	}
	var failed int64
	for status, n := range res.Summary.Status {
		if strings.HasPrefix(status, "5") {
			failed += n
		}
	}
	if n := res.Summary.Errors - failed; n > 0 { // Errors counts the 5xx too
		t.Errorf("%s: %d connection errors", endpoint, n)
	}
	return failed
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

// switchWarning is what the WARN of a store pool that left pgx's default exec mode
// behind a pooler says (postgres.ConfigurePool).
const switchWarning = "new connections run default_query_exec_mode=cache_describe instead of cache_statement"

// wantOneSwitch fails the test unless s logged the switch of its pool once.
func wantOneSwitch(t *testing.T, s *server) {
	t.Helper()
	if n := strings.Count(s.output(), switchWarning); n != 1 {
		t.Errorf("%d WARNs of a switch of the exec mode, want 1:\n%s", n, s.output())
	}
}

// TestPaymentsBehindPgBouncerWithThePlainURL runs `idem payments` with the store URL
// it ran with straight to PostgreSQL, no exec mode in it, through PgBouncer in
// transaction mode, and loads it as TestPaymentsBehindPgBouncerExecutesEachKeyOnce
// does: no 5xx, exactly once, one WARN that says the store's pool switched its mode;
// `idem keys list` and `idem migrate` work with that URL too. Issue 46 counted 13,418
// 503s on charges and 6,867 on orders in one load before the pool switched.
func TestPaymentsBehindPgBouncerWithThePlainURL(t *testing.T) {
	t.Parallel()
	store := pgtest.Bouncer(t, postgresStore(t), bouncerPoolSize)
	s := startServer(t, "--store", store)
	loadExactlyOnce(t, s.URL(), load.EndpointCharges, false)
	loadExactlyOnce(t, s.URL(), load.EndpointOrders, false)
	wantOneSwitch(t, s)
	mustRunIdem(t, "keys", "list", "--store", store, "--json")
	mustRunIdem(t, "migrate", "--store", store)
}

// TestProxyBehindPgBouncerWithThePlainURL is TestProxyBehindPgBouncerExecutesEachKeyOnce
// with a store URL that names no exec mode: no 5xx (every keyed request was answered
// 503 before the pool switched), each key reaches the upstream once, one WARN.
func TestProxyBehindPgBouncerWithThePlainURL(t *testing.T) {
	t.Parallel()
	api := startServer(t, "--store", sqliteStore(t), "--disable-idempotency")
	px := newCommand(t, "proxy", "--upstream", api.URL(), "--store", pgtest.Bouncer(t, postgresStore(t), bouncerPoolSize))
	px.start("127.0.0.1:0")
	loadExactlyOnce(t, px.URL(), load.EndpointCharges, true)
	wantOneSwitch(t, px)
}

// firstWrite is an io.Writer that closes wrote at its first write: the load's first
// progress line says it runs.
type firstWrite struct {
	once  sync.Once
	wrote chan struct{}
}

func (f *firstWrite) Write(p []byte) (int, error) {
	f.once.Do(func() { close(f.wrote) })
	return len(p), nil
}

// TestPaymentsPutBehindPgBouncerMidLoad: `idem payments` runs straight to PostgreSQL
// through a TCP path (a faultproxy) under a load of charges; mid-load the path is
// moved behind PgBouncer in transaction mode and its open connections are reset, as a
// restart of the path does. The first connection through PgBouncer finds it and the
// store's pool switches (one WARN). The load before the move gets no 5xx; the load
// during the move may get a 503 for a request whose connection was reset (outcome
// unknown: fail closed), at most one per connection reset; a load sent after the WARN
// gets none; all of them exactly once. Before the switch existed, every request after
// the move was answered 503 for as long as the process ran.
func TestPaymentsPutBehindPgBouncerMidLoad(t *testing.T) {
	t.Parallel()
	db := postgresStore(t)
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	bouncer, err := url.Parse(pgtest.Bouncer(t, db, bouncerPoolSize))
	if err != nil {
		t.Fatal(err)
	}
	server := u.Host
	if u.Port() == "" {
		server = net.JoinHostPort(u.Hostname(), "5432")
	}
	path := faultproxy.New(t, server)
	u.Host = path.Addr()
	s := startServer(t, "--store", u.String())
	cfg := func() load.Config {
		return load.Config{URL: s.URL(), Concurrency: 8, Endpoint: load.EndpointCharges}
	}

	before := cfg()
	before.Requests = 200
	res, err := load.Run(context.Background(), before)
	if err != nil {
		t.Fatal(err)
	}
	if failed := verifyExactlyOnce(t, res, load.EndpointCharges); failed > 0 {
		t.Errorf("%d answers 5xx straight to PostgreSQL, want none", failed)
	}

	during := cfg()
	during.Duration = 4 * time.Second
	started := &firstWrite{wrote: make(chan struct{})}
	during.Progress, during.ProgressInterval = started, 200*time.Millisecond
	var moved struct {
		res *load.Result
		err error
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		moved.res, moved.err = load.Run(context.Background(), during)
	}()
	<-started.wrote
	path.SetUpstream(bouncer.Host)
	reset := path.Reset()
	waitFor(t, 30*time.Second, "the WARN of the store's switch", func() (bool, string) {
		return strings.Contains(s.output(), switchWarning), "no WARN"
	})

	after := cfg()
	after.Requests = 400
	res, err = load.Run(context.Background(), after)
	if err != nil {
		t.Fatal(err)
	}
	if failed := verifyExactlyOnce(t, res, load.EndpointCharges); failed > 0 {
		t.Errorf("%d answers 5xx to requests sent after the WARN, want none", failed)
	}
	<-ran
	if moved.err != nil {
		t.Fatal(moved.err)
	}
	failed := verifyExactlyOnce(t, moved.res, load.EndpointCharges)
	t.Logf("the load during the move: statuses %v; %d connections reset by the move", moved.res.Summary.Status, reset)
	if failed > int64(reset) {
		t.Errorf("%d answers 5xx during the move, want at most one per connection reset (%d)", failed, reset)
	}
	wantOneSwitch(t, s)
}
