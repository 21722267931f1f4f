package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
)

// The round trips of queries.go, counted on the wire: the store talks to PostgreSQL
// through a net.Conn that counts how often the client starts writing after it has read
// an answer. A pipelined batch is one round trip, a prepare-then-execute two.

// roundTrips counts client→server→client exchanges on the connections it dials.
type roundTrips struct {
	mu       sync.Mutex
	reading  bool // the last I/O was a read: the next write starts a new round trip
	n        int
	inactive bool
}

func (c *roundTrips) wrote() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reading || c.n == 0 {
		c.n++
	}
	c.reading = false
}

func (c *roundTrips) read() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reading = true
}

// reset starts counting afresh.
func (c *roundTrips) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n, c.reading = 0, true
}

func (c *roundTrips) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

type countingConn struct {
	net.Conn
	c *roundTrips
}

func (cc countingConn) Write(b []byte) (int, error) {
	cc.c.wrote()
	return cc.Conn.Write(b)
}

func (cc countingConn) Read(b []byte) (int, error) {
	n, err := cc.Conn.Read(b)
	if n > 0 {
		cc.c.read()
	}
	return n, err
}

// countingBundle is a store on a one-connection pool whose round trips are counted,
// with every statement already prepared on that connection (pgx's statement cache), so
// that the counts are those of a warm production connection.
type countingBundle struct {
	t      *testing.T
	ctx    context.Context
	s      *postgres.Store
	trips  *roundTrips
	t0     time.Time
	fp     idemstore.Fingerprint
	schema string
}

func newCountingBundle(t *testing.T) *countingBundle {
	t.Helper()
	return newCountingBundleIn(t, "")
}

// newCountingBundleIn is newCountingBundle in pgx's exec mode mode ("": the default).
func newCountingBundleIn(t *testing.T, mode string) *countingBundle {
	t.Helper()
	return newCountingBundleVia(t, mode, false)
}

// newCountingBundleVia is newCountingBundleIn, behind a PgBouncer in transaction mode
// when bounced, on a pool configured by ConfigurePool (which switches a URL without a
// mode to cache_describe behind it).
func newCountingBundleVia(t *testing.T, mode string, bounced bool) *countingBundle {
	t.Helper()
	dbURL, schema := pgtest.Schema(t)
	if bounced {
		dbURL = pgtest.Bouncer(t, dbURL, 1)
	}
	if mode != "" {
		dbURL = pgtest.WithExecMode(t, dbURL, mode)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	trips := &roundTrips{}
	var d net.Dialer
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: conn, c: trips}, nil
	}
	cfg.MaxConns = 1
	// The pool pings a connection that sat idle for over a second; a slow test machine
	// must not count that.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	if bounced {
		postgres.ConfigurePool(cfg, slog.New(slog.DiscardHandler))
	}
	ctx := t.Context()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := postgres.NewFromPool(pool, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := &countingBundle{t: t, ctx: ctx, s: s, trips: trips, t0: time.Now().UTC().Truncate(time.Millisecond), schema: schema}
	_, _ = rand.Read(b.fp.Sum[:])
	b.fp.Version = idemstore.FingerprintVersion
	b.warmUp()
	return b
}

const (
	rtLease = 10 * time.Second
	rtTTL   = time.Hour
)

func (b *countingBundle) claimParams(key string, now time.Time) *idemstore.ClaimParams {
	return &idemstore.ClaimParams{
		Scope: "scope", Key: key, Fingerprint: b.fp, Token: "tok-" + rand.Text(),
		RecordID: "rec-" + rand.Text(), Lease: rtLease, TTL: rtTTL, Now: now,
	}
}

func (b *countingBundle) claim(p *idemstore.ClaimParams, want idemstore.ClaimOutcome) *idemstore.ClaimResult {
	b.t.Helper()
	res, err := b.s.RecordClaim(b.ctx, p)
	if err != nil {
		b.t.Fatalf("RecordClaim: %v", err)
	}
	if res.Outcome != want {
		b.t.Fatalf("RecordClaim = %v, want %v", res.Outcome, want)
	}
	return res
}

func (b *countingBundle) complete(p *idemstore.ClaimParams) {
	b.t.Helper()
	err := b.s.RecordComplete(b.ctx, &idemstore.CompleteParams{
		Scope: p.Scope, Key: p.Key, Token: p.Token, TTL: rtTTL,
		Response: &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)},
	})
	if err != nil {
		b.t.Fatalf("RecordComplete: %v", err)
	}
}

// warmUp runs every statement of a request once, so that the connection has prepared
// them all.
func (b *countingBundle) warmUp() {
	b.t.Helper()
	p := b.claimParams("warm-1", b.t0)
	b.claim(p, idemstore.ClaimAcquired)
	b.claim(b.claimParams("warm-1", b.t0), idemstore.ClaimInFlight)
	b.claim(b.claimParams("warm-1", b.t0.Add(rtLease)), idemstore.ClaimAcquired) // takeover
	b.claim(b.claimParams("warm-1", b.t0.Add(rtTTL+rtLease)), idemstore.ClaimAcquired)
	p = b.claimParams("warm-2", b.t0)
	b.claim(p, idemstore.ClaimAcquired)
	b.complete(p)
	b.claim(b.claimParams("warm-2", b.t0), idemstore.ClaimCompleted)
	p = b.claimParams("warm-3", b.t0)
	b.claim(p, idemstore.ClaimAcquired)
	if err := b.s.RecordRelease(b.ctx, &idemstore.ReleaseParams{Scope: p.Scope, Key: p.Key, Token: p.Token}); err != nil {
		b.t.Fatal(err)
	}
}

// wantTrips runs op and fails the test unless it took want round trips.
func (b *countingBundle) wantTrips(what string, want int, op func()) {
	b.t.Helper()
	b.trips.reset()
	op()
	if got := b.trips.count(); got != want {
		b.t.Errorf("%s took %d round trips, want %d", what, got, want)
	}
}

func TestNewKeyClaimIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	p := b.claimParams("new", b.t0)
	b.wantTrips("claim of a new key", 1, func() { b.claim(p, idemstore.ClaimAcquired) })
	b.wantTrips("completion", 1, func() { b.complete(p) })
}

func TestReplayIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	p := b.claimParams("replayed", b.t0)
	b.claim(p, idemstore.ClaimAcquired)
	b.complete(p)
	b.wantTrips("replay", 1, func() { b.claim(b.claimParams("replayed", b.t0.Add(time.Second)), idemstore.ClaimCompleted) })
}

func TestInFlightDuplicateIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	b.claim(b.claimParams("busy", b.t0), idemstore.ClaimAcquired)
	b.wantTrips("in-flight duplicate", 1, func() { b.claim(b.claimParams("busy", b.t0.Add(time.Second)), idemstore.ClaimInFlight) })
}

func TestMismatchIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	b.claim(b.claimParams("reused", b.t0), idemstore.ClaimAcquired)
	other := b.claimParams("reused", b.t0.Add(time.Second))
	other.Fingerprint.Sum[0] ^= 0xff
	b.wantTrips("mismatch", 1, func() { b.claim(other, idemstore.ClaimMismatch) })
}

func TestTakeOverIsTwoRoundTrips(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	b.claim(b.claimParams("lapsed", b.t0), idemstore.ClaimAcquired)
	b.wantTrips("takeover of a lapsed lease", 2, func() {
		res := b.claim(b.claimParams("lapsed", b.t0.Add(rtLease)), idemstore.ClaimAcquired)
		if !res.TookOver {
			t.Error("TookOver = false")
		}
	})
}

func TestClaimOfExpiredRecordIsTwoRoundTrips(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	p := b.claimParams("expired", b.t0)
	b.claim(p, idemstore.ClaimAcquired)
	b.complete(p)
	b.wantTrips("claim of an expired record", 2, func() {
		b.claim(b.claimParams("expired", b.t0.Add(rtTTL)), idemstore.ClaimAcquired)
	})
}

func TestReleaseIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	p := b.claimParams("released", b.t0)
	b.claim(p, idemstore.ClaimAcquired)
	b.wantTrips("release", 1, func() {
		if err := b.s.RecordRelease(b.ctx, &idemstore.ReleaseParams{Scope: p.Scope, Key: p.Key, Token: p.Token}); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCountingConnCountsPrepares checks the counter itself: the first use of a
// statement on a connection is a prepare and an execution, two round trips.
func TestCountingConnCountsPrepares(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	// A statement neither the warm-up nor Migrate (which reads and writes the store's
	// state, SPEC §20) ran on the connection.
	renew := &idemstore.RenewParams{Scope: "scope", Key: "warm-2", Token: "not-its-token", Lease: rtLease, TTL: rtTTL, Now: b.t0}
	b.wantTrips("first Renew on the connection", 2, func() {
		if _, err := b.s.RecordRenew(b.ctx, renew); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatal(err)
		}
	})
	b.wantTrips("second Renew on the connection", 1, func() {
		_, _ = b.s.RecordRenew(b.ctx, renew)
	})
}

// TestInTxRequestIsThreeRoundTrips counts a whole request through the middleware whose
// handler inserts a row inside InTx: the claim, the handler's INSERT with the BEGIN
// before it (InTx's transaction sends its BEGIN with the first statement), and the
// fenced completion pipelined with COMMIT. InSQLTx (database/sql) costs two more: it
// sends BEGIN alone and cannot pipeline the completion with COMMIT. A replay is one
// round trip.
func TestInTxRequestIsThreeRoundTrips(t *testing.T) {
	t.Parallel()
	want := map[string]int{"InTx": 3, "InSQLTx": 5}
	forEachTxHelper(t, func(t *testing.T, tx txHelper) {
		b := newCountingBundle(t)
		table := pgx.Identifier{b.schema, "charges"}.Sanitize()
		if _, err := b.s.Pool().Exec(b.ctx, `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		post := poster(insertingHandler(b.s, tx, table))
		if code := post("key-warm-up"); code != http.StatusCreated { // prepares the statements
			t.Fatalf("warm-up request = %d", code)
		}
		b.wantTrips("request with a new key completed in "+tx.name, want[tx.name], func() {
			if code := post("key-counted"); code != http.StatusCreated {
				t.Fatalf("request = %d", code)
			}
		})
		b.wantTrips("its replay", 1, func() {
			if code := post("key-counted"); code != http.StatusCreated {
				t.Fatalf("replay = %d", code)
			}
		})
	})
}

// insertingHandler is a lease route (mw.Handler) whose handler inserts the request's
// key into table inside the §7 helper tx and answers 201.
func insertingHandler(s *postgres.Store, tx txHelper, table string) http.Handler {
	m := idem.New(idem.Config{Store: s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	return m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := tx.run(s, r.Context(), func(ctx context.Context, c txConn) error {
			if err := c.exec(ctx, `INSERT INTO `+table+` (key) VALUES ($1)`, r.Header.Get("Idempotency-Key")); err != nil {
				return err
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
}

// TestChargeInStepsCountsItsRoundTrips counts a charge in Brandur Leach's order through
// the middleware (SPEC §13): the claim (1); the step that records the charge pending:
// its INSERT with the BEGIN before it, the fenced step pipelined with COMMIT (2); the
// final InTx: its UPDATE with its BEGIN, the fenced completion pipelined with COMMIT
// (2). A step costs one round trip more than its own statements, as a §7 completion
// does. The retry that resumes after the step (its holder released the key) skips the
// committed step: the claim and its takeover (2) and the final transaction (2).
func TestChargeInStepsCountsItsRoundTrips(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	table := pgx.Identifier{b.schema, "charges"}.Sanitize()
	if _, err := b.s.Pool().Exec(b.ctx, `CREATE TABLE `+table+` (key text PRIMARY KEY, status text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	m := idem.New(idem.Config{
		Store: b.s,
		Scope: func(*http.Request) (string, error) { return "user-1", nil },
	})
	var processorDown bool
	handler := m.Route(idem.RouteOptions{Name: "charges.create"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		_, err := postgres.Step(r.Context(), b.s, "charge_pending", func(ctx context.Context, tx pgx.Tx) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (key, status) VALUES ($1, 'pending')`, key)
			return key, err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if processorDown {
			http.Error(w, "processor down", http.StatusServiceUnavailable) // releases: the lease ends
			return
		}
		err = b.s.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `UPDATE `+table+` SET status = 'succeeded' WHERE key = $1`, key); err != nil {
				return err
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	post := poster(handler)
	processorDown = true
	if code := post("key-warm-up"); code != http.StatusServiceUnavailable { // prepares the statements
		t.Fatalf("warm-up request = %d", code)
	}
	processorDown = false
	if code := post("key-warm-up"); code != http.StatusCreated {
		t.Fatalf("warm-up retry = %d", code)
	}
	b.wantTrips("charge with a step, then a completing transaction", 5, func() {
		if code := post("key-counted"); code != http.StatusCreated {
			t.Fatalf("request = %d", code)
		}
	})
	processorDown = true
	b.wantTrips("charge whose processor call fails after the step (release keeps the record)", 4, func() {
		if code := post("key-resumed"); code != http.StatusServiceUnavailable {
			t.Fatalf("request = %d", code)
		}
	})
	processorDown = false
	b.wantTrips("its retry, resumed after the step", 4, func() {
		if code := post("key-resumed"); code != http.StatusCreated {
			t.Fatalf("retry = %d", code)
		}
	})
}

// poster returns a function that POSTs {} to handler with an idempotency key and
// returns the status.
func poster(handler http.Handler) func(key string) int {
	return func(key string) int {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		return rec.Code
	}
}

// TestRoundTripsInEachExecMode counts, in each of pgx's exec modes, the round trips of
// a warm connection for the rows of the package's table (queries.go) that the modes
// change, and logs them as the table of "Poolers and exec modes" in the package doc.
// Every mode but describe_exec costs what the default does: cache_describe sends each
// statement's text again instead of a prepared statement's name (the server parses
// and plans it afresh), exec and simple_protocol send their parameters as text.
// describe_exec describes every statement before it runs it: two round trips for each
// statement outside a batch, and two for a batch (it describes all of its statements
// in one).
func TestRoundTripsInEachExecMode(t *testing.T) {
	t.Parallel()
	type row struct {
		what string
		run  func(b *countingBundle) func()
	}
	rows := []row{
		{"new key: claim", func(b *countingBundle) func() {
			return func() { b.claim(b.claimParams("k-"+rand.Text(), b.t0), idemstore.ClaimAcquired) }
		}},
		{"new key: completion", func(b *countingBundle) func() {
			p := b.claimParams("k-"+rand.Text(), b.t0)
			b.claim(p, idemstore.ClaimAcquired)
			return func() { b.complete(p) }
		}},
		{"replay", func(b *countingBundle) func() {
			p := b.claimParams("k-"+rand.Text(), b.t0)
			b.claim(p, idemstore.ClaimAcquired)
			b.complete(p)
			return func() { b.claim(b.claimParams(p.Key, b.t0), idemstore.ClaimCompleted) }
		}},
		{"InTx request, one INSERT", func(b *countingBundle) func() {
			post := poster(insertingHandler(b.s, txHelpers[0], b.table(b.t, "charges")))
			return func() {
				if code := post("key-" + rand.Text()); code != http.StatusCreated {
					b.t.Fatalf("request = %d", code)
				}
			}
		}},
		{"Respond request, ClaimInHandler, one INSERT", func(b *countingBundle) func() {
			m := idem.New(idem.Config{Store: b.s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
			h := m.Route(idem.RouteOptions{ClaimInHandler: true})(rowHandler(b.s, b.table(b.t, "rows")))
			return func() {
				if rec := postKey(h, "key-"+rand.Text()); rec.Code != http.StatusCreated {
					b.t.Fatalf("POST = %d %s", rec.Code, rec.Body)
				}
			}
		}},
	}
	want := map[string][]int{
		"cache_statement": {1, 1, 1, 3, 1},
		"cache_describe":  {1, 1, 1, 3, 1},
		"describe_exec":   {2, 2, 2, 6, 2},
		"exec":            {1, 1, 1, 3, 1},
		"simple_protocol": {1, 1, 1, 3, 1},
	}
	// A URL without a mode behind PgBouncer: the pool switched to cache_describe.
	const switched = "no mode, behind PgBouncer"
	want[switched] = want["cache_describe"]
	for _, mode := range append(slices.Clone(pgtest.ExecModes), switched) {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var b *countingBundle
			if mode == switched {
				b = newCountingBundleVia(t, "", true)
			} else {
				b = newCountingBundleIn(t, mode)
			}
			var got []int
			for i, r := range rows {
				op := r.run(b)
				op() // a warm connection: the statements described or prepared
				op = r.run(b)
				b.trips.reset()
				op()
				got = append(got, b.trips.count())
				if got[i] != want[mode][i] {
					t.Errorf("%s: %s took %d round trips, want %d", mode, r.what, got[i], want[mode][i])
				}
			}
			t.Logf("%s: %v round trips (%s)", mode, got, rowNames(rows, func(r row) string { return r.what }))
		})
	}
}

func rowNames[T any](rows []T, name func(T) string) string {
	var names []string
	for _, r := range rows {
		names = append(names, name(r))
	}
	return strings.Join(names, "; ")
}

// table creates the table name (key text PRIMARY KEY) in the bundle's schema, once,
// and returns its quoted name.
func (b *countingBundle) table(t *testing.T, name string) string {
	t.Helper()
	table := pgx.Identifier{b.schema, name}.Sanitize()
	if _, err := b.s.Pool().Exec(b.ctx, `CREATE TABLE IF NOT EXISTS `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	return table
}
