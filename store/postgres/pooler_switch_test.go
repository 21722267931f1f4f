package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/postgres"
)

// logRecorder is a slog.Handler that keeps the store's log lines, and closes
// switched at the first WARN of a pool that switched its exec mode.
type logRecorder struct {
	mu       sync.Mutex
	lines    []string
	switches []map[string]string
	switched chan struct{}
}

func newLogRecorder() *logRecorder { return &logRecorder{switched: make(chan struct{})} }

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }

func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	attrs := map[string]string{}
	r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, r.Level.String()+" "+r.Message)
	if r.Message == postgres.SwitchWarning {
		if r.Level != slog.LevelWarn {
			l.lines = append(l.lines, "the switch was logged at "+r.Level.String())
		}
		l.switches = append(l.switches, attrs)
		if len(l.switches) == 1 {
			close(l.switched)
		}
	}
	return nil
}

// switchLines returns the attributes of each WARN of a switch.
func (l *logRecorder) switchLines() []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.switches)
}

// has reports whether a line at level says msg.
func (l *logRecorder) has(level slog.Level, msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.lines, level.String()+" "+msg)
}

// execModes returns the exec mode of each idle connection of pool.
func execModes(t *testing.T, pool *pgxpool.Pool) []pgx.QueryExecMode {
	t.Helper()
	var modes []pgx.QueryExecMode
	for _, c := range pool.AcquireAllIdle(t.Context()) {
		modes = append(modes, c.Conn().Config().DefaultQueryExecMode)
		c.Release()
	}
	if len(modes) == 0 {
		t.Fatal("the pool holds no idle connection")
	}
	return modes
}

// The signals of a switch: the probe of a new connection, a lost statement.
const (
	probeSignal = "the server process that answers is not the connection's"
	lostSignal  = "the server lost a prepared statement"
)

// wantOneSwitch fails t unless logs hold exactly one WARN of a switch to
// cache_describe, saying its cost and what avoids it, for signal.
func wantOneSwitch(t *testing.T, logs *logRecorder, signal string) {
	t.Helper()
	lines := logs.switchLines()
	if len(lines) != 1 {
		t.Fatalf("%d WARNs of a switch of the exec mode, want 1: %v", len(lines), lines)
	}
	if lines[0]["mode"] != "cache_describe" || lines[0]["was"] != "cache_statement" || !strings.HasPrefix(lines[0]["signal"], signal) {
		t.Errorf("the switch's WARN says %v, want mode cache_describe, was cache_statement and the signal %q", lines[0], signal)
	}
	for _, want := range []string{"default_query_exec_mode=cache_describe", "round trip", "CPU", "max_prepared_statements", "PgBouncer 1.21"} {
		if !strings.Contains(postgres.SwitchWarning, want) {
			t.Errorf("the switch's WARN does not say %q: %s", want, postgres.SwitchWarning)
		}
	}
	t.Logf("WARN %s %v", postgres.SwitchWarning, lines[0])
}

// rowLoad sends rounds of concurrent requests to s through three routes (a
// ClaimInHandler route with Respond, a lease route with Respond, a lease route with
// InTx): per key two duplicates and a replay through another process's
// ClaimInHandler route, each retried while its key is in flight. It returns what was
// not 201, and fails t unless each key wrote one row.
func rowLoad(t *testing.T, s schemaStore, table string, rounds, perRound int) []string {
	t.Helper()
	route := func() (inHandler, lease, inTx http.Handler) {
		m := idem.New(idem.Config{Store: s.Store, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
		return m.Route(idem.RouteOptions{ClaimInHandler: true})(rowHandler(s.Store, table)),
			m.Handler(rowHandler(s.Store, table)),
			insertingHandler(s.Store, txHelpers[0], table) // behind a middleware of its own
	}
	inHandler, lease, inTx := route()
	otherInHandler, _, _ := route() // another process's: it does not know the keys
	var keys []string
	var mu sync.Mutex
	var failed []string
	for round := range rounds {
		var wg sync.WaitGroup
		for i := range perRound {
			key := fmt.Sprintf("key-pooled-%d-%d", round, i)
			keys = append(keys, key)
			h := []http.Handler{inHandler, lease, inTx}[i%3]
			for _, send := range []http.Handler{h, h, otherInHandler} {
				wg.Go(func() {
					for deadline := time.Now().Add(10 * time.Second); ; {
						rec := postKey(send, key)
						if rec.Code == http.StatusConflict && strings.Contains(rec.Body.String(), "request_in_progress") && time.Now().Before(deadline) {
							continue
						}
						if rec.Code != http.StatusCreated {
							mu.Lock()
							failed = append(failed, fmt.Sprintf("POST %s = %d %s", key, rec.Code, strings.TrimSpace(rec.Body.String())))
							mu.Unlock()
						}
						return
					}
				})
			}
		}
		wg.Wait()
	}
	if n := countRows(t, s, table); n != len(keys) {
		t.Errorf("%d rows for %d keys, want one each", n, len(keys))
	}
	return failed
}

// TestAPoolerInFrontFromTheStartWithThePlainURL: a store opened with a URL that names
// no exec mode, behind a PgBouncer that keeps no prepared statements (1.18, transaction
// mode), finds it on its first connection and runs cache_describe: every request of a
// concurrent load through Respond, the lease route and InTx is answered 201, and the
// switch is logged once. It used to run pgx's default, cache_statement, there: its
// statements met other clients' prepared statements or missed their own, and most
// requests were answered 503 (13,418 charges and 6,867 orders in one load of `idem
// payments`, issue 46).
func TestAPoolerInFrontFromTheStartWithThePlainURL(t *testing.T) {
	t.Parallel()
	logs := newLogRecorder()
	dbURL, schema := pgtest.Schema(t)
	bounced := pgtest.Bouncer(t, dbURL, 2)
	s := openIn(t, postgres.Config{MaxConns: 6, DisableCleaner: true, Logger: slog.New(logs)}, dbURL, schema,
		func(string) string { return bounced }, true)
	table := s.table("rows")
	if _, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	for _, f := range rowLoad(t, s, table, 4, 8) {
		t.Error(f)
	}
	// The cleaner's and the admin tools' statements, on the same pool.
	if _, err := s.RecordDeleteExpired(t.Context(), &idemstore.DeleteExpiredParams{Limit: 100}); err != nil {
		t.Errorf("RecordDeleteExpired: %v", err)
	}
	if res, err := s.RecordList(t.Context(), &admin.RecordListParams{Limit: 100}); err != nil || len(res.Records) == 0 {
		t.Errorf("RecordList = %v, %v; want the load's records", res, err)
	}
	wantOneSwitch(t, logs, probeSignal)
	for _, m := range execModes(t, s.Pool()) {
		if m != pgx.QueryExecModeCacheDescribe {
			t.Errorf("a connection of the pool runs %v, want cache_describe", m)
		}
	}
}

// TestPlainURLStraightToTheServerKeepsItsMode: without a pooler in between, the probe
// of each new connection finds the server process it was given, and the pool keeps
// pgx's default: no switch, no WARN.
func TestPlainURLStraightToTheServerKeepsItsMode(t *testing.T) {
	t.Parallel()
	logs := newLogRecorder()
	s := newStoreWith(t, postgres.Config{MaxConns: 6, DisableCleaner: true, Logger: slog.New(logs)})
	table := s.table("rows")
	if _, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	for _, f := range rowLoad(t, s, table, 2, 6) {
		t.Error(f)
	}
	if lines := logs.switchLines(); len(lines) != 0 {
		t.Errorf("a switch of the exec mode straight to the server: %v", lines)
	}
	for _, m := range execModes(t, s.Pool()) {
		if m != pgx.QueryExecModeCacheStatement {
			t.Errorf("a connection of the pool runs %v, want cache_statement", m)
		}
	}
}

// TestAnExplicitExecModeIsObeyedBehindAPooler: a URL that names
// default_query_exec_mode keeps it behind a pooler, and nothing is logged of a
// switch. exec works there; cache_statement fails there, as its error says
// (TestCacheStatementBehindAPoolerFailsWithAHint), which is what the URL asked for.
func TestAnExplicitExecModeIsObeyedBehindAPooler(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "exec"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			logs := newLogRecorder()
			dbURL, schema := pgtest.Schema(t)
			bounced := pgtest.WithExecMode(t, pgtest.Bouncer(t, dbURL, 1), mode)
			// One client connection on one server connection: cache_statement works
			// there, however long, and the test sees only whether its mode changed.
			s := openIn(t, postgres.Config{MaxConns: 1, DisableCleaner: true, Logger: slog.New(logs)}, dbURL, schema,
				func(string) string { return bounced }, true)
			if _, err := s.RecordDeleteExpired(t.Context(), &idemstore.DeleteExpiredParams{Limit: 100}); err != nil {
				t.Fatalf("RecordDeleteExpired: %v", err)
			}
			if lines := logs.switchLines(); len(lines) != 0 {
				t.Errorf("a switch of the exec mode the URL named: %v", lines)
			}
			for _, m := range execModes(t, s.Pool()) {
				if postgres.ExecModeName(m) != mode {
					t.Errorf("a connection of the pool runs %v, want %s as the URL says", m, mode)
				}
			}
		})
	}
}

// TestExecModeNamed: a mode is the pool's own choice when its connection string
// names default_query_exec_mode, as a URL or as key=value settings, or its
// configuration was given another mode than pgx's default in code.
func TestExecModeNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		conn string
		set  pgx.QueryExecMode
		want bool
	}{
		{"postgres://app@db:5432/app", 0, false},
		{"postgres://app@db:5432/app?pool_max_conns=4&sslmode=disable", 0, false},
		{"postgres://app@db:5432/app?default_query_exec_mode=cache_statement", 0, true},
		{"postgresql://app@db/app?sslmode=disable&default_query_exec_mode=exec", 0, true},
		{"host=db user=app dbname=app", 0, false},
		{"host=db user=app default_query_exec_mode=cache_statement", 0, true},
		{"default_query_exec_mode = simple_protocol host=db", 0, true},
		{"host=db password='default_query_exec_mode_is_not_a_setting' user=app", 0, false},
		{"postgres://app@db/app", pgx.QueryExecModeExec, true},
	} {
		cfg, err := pgx.ParseConfig(tc.conn)
		if err != nil {
			t.Fatalf("%s: %v", tc.conn, err)
		}
		if tc.set != 0 {
			cfg.DefaultQueryExecMode = tc.set
		}
		if got := postgres.ExecModeNamed(cfg); got != tc.want {
			t.Errorf("ExecModeNamed(%q, mode %v) = %v, want %v", tc.conn, cfg.DefaultQueryExecMode, got, tc.want)
		}
	}
}

// unprobedStore opens a store in schema on a pool of maxConns connections to dbURL
// that ConfigurePoolWithoutProbe configured, logging to logs; both closed when t ends.
func unprobedStore(t *testing.T, dbURL, schema string, maxConns int32, logs *logRecorder) *postgres.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	postgres.ConfigurePoolWithoutProbe(cfg, slog.New(logs))
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := postgres.NewFromPool(pool, postgres.Config{Schema: schema, DisableCleaner: true, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// TestALostStatementSwitchesAPoolThatDidNotSeeThePooler: a pool that cannot tell a
// pooler by the server process's id (its probe off here, as behind a pooler that
// hands its clients the server's own id) learns of it from the first prepared
// statement the server lost (26000, 42P05), switches, and retries what provably did
// not run: the claims, completions and reads of the lease route, Respond's
// transactions (nothing of a batch runs after its first error), the cleaner's and the
// admin tools' statements. A §7 transaction whose function ran (InTx, Step) is never
// retried, and is left out of the load. No request is answered 503.
func TestALostStatementSwitchesAPoolThatDidNotSeeThePooler(t *testing.T) {
	t.Parallel()
	logs := newLogRecorder()
	dbURL, schema := pgtest.Schema(t)
	st := unprobedStore(t, pgtest.Bouncer(t, dbURL, 2), schema, 6, logs)
	pool := st.Pool()
	s := schemaStore{Store: st, schema: schema, dbURL: dbURL}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	table := s.table("rows")
	if _, err := pool.Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	m := idem.New(idem.Config{Store: st, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	inHandler := m.Route(idem.RouteOptions{ClaimInHandler: true})(rowHandler(st, table))
	lease := m.Handler(rowHandler(st, table))
	plain := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	var failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 12 {
				h := []http.Handler{inHandler, lease, plain}[(w+i)%3]
				if rec := postKey(h, fmt.Sprintf("key-lost-%d-%d", w, i)); rec.Code != http.StatusCreated {
					failed.Add(1)
					t.Errorf("POST = %d %s", rec.Code, strings.TrimSpace(rec.Body.String()))
				}
			}
		})
		wg.Go(func() { // the cleaner and the admin tools meanwhile
			if _, err := st.RecordDeleteExpired(t.Context(), &idemstore.DeleteExpiredParams{Limit: 10}); err != nil {
				t.Errorf("RecordDeleteExpired: %v", err)
			}
			if _, err := st.RecordList(t.Context(), &admin.RecordListParams{Limit: 10}); err != nil {
				t.Errorf("RecordList: %v", err)
			}
		})
	}
	wg.Wait()
	wantOneSwitch(t, logs, lostSignal)
	for _, m := range execModes(t, pool) {
		if m != pgx.QueryExecModeCacheDescribe {
			t.Errorf("a connection of the pool runs %v, want cache_describe", m)
		}
	}
}

// TestMigrateWarnsOfAPoolLeftInTheDefaultModeBehindAPooler: a pool given to
// NewFromPool that ConfigurePool did not configure cannot switch; behind a pooler,
// in pgx's default mode, Migrate says so in a WARN.
func TestMigrateWarnsOfAPoolLeftInTheDefaultModeBehindAPooler(t *testing.T) {
	t.Parallel()
	logs := newLogRecorder()
	dbURL, schema := pgtest.Schema(t)
	pool := pgtest.Pool(t, pgtest.Bouncer(t, dbURL, 1), 1)
	st, err := postgres.NewFromPool(pool, postgres.Config{Schema: schema, DisableCleaner: true, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if !logs.has(slog.LevelWarn, postgres.UnconfiguredPoolWarning) {
		t.Errorf("no WARN of a pool left in the default mode behind a pooler; logged:\n%s", strings.Join(logs.lines, "\n"))
	}
}

// TestAPoolerPutInFrontOfARunningStore: a store runs straight to PostgreSQL through
// a TCP path (a faultproxy) under a steady load, and the path is then moved behind a
// PgBouncer that keeps no prepared statements, its open connections reset as a restart
// of the path resets them. The first connection made through PgBouncer finds it and
// the pool switches (one WARN). No request sent before the move, and no request sent
// after the WARN, is answered other than 201; between the two, only the requests whose
// connection the move reset may be answered 503 (their statement's outcome is unknown:
// fail closed), at most one per connection reset.
func TestAPoolerPutInFrontOfARunningStore(t *testing.T) {
	t.Parallel()
	logs := newLogRecorder()
	dbURL, schema := pgtest.Schema(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	server := u.Host
	if u.Port() == "" {
		server = net.JoinHostPort(u.Hostname(), "5432")
	}
	bouncer, err := url.Parse(pgtest.Bouncer(t, dbURL, 2))
	if err != nil {
		t.Fatal(err)
	}
	path := faultproxy.New(t, server)
	u.Host = path.Addr()
	s := openIn(t, postgres.Config{MaxConns: 4, DisableCleaner: true, Logger: slog.New(logs)}, u.String(), schema, nil, true)
	table := s.table("rows")
	if _, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	m := idem.New(idem.Config{Store: s.Store, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	handlers := []http.Handler{
		m.Route(idem.RouteOptions{ClaimInHandler: true})(rowHandler(s.Store, table)),
		m.Handler(rowHandler(s.Store, table)),
		insertingHandler(s.Store, txHelpers[0], table), // behind a middleware of its own
	}

	// A request counts as sent before the move when the move had not begun by the
	// time it was answered, and as sent after the WARN when the WARN came before it
	// was sent; the others were sent or answered between the two.
	const (
		before int32 = iota
		moved
		after
	)
	var (
		phase    atomic.Int32 // before, then moved, then after
		mu       sync.Mutex
		answered [3]map[int]int // by phase, by status
		created  int
		stop     = make(chan struct{})
		counts   [3]int
		reached  = [3]chan struct{}{make(chan struct{}), nil, make(chan struct{})}
		want     = [3]int{100, 0, 200} // requests before the move, and after the WARN, before going on
	)
	for i := range answered {
		answered[i] = map[int]int{}
	}
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent := phase.Load()
				rec := postKey(handlers[(w+i)%3], fmt.Sprintf("key-moved-%d-%d", w, i))
				p := moved
				if sent == after || phase.Load() == before {
					p = sent
				}
				mu.Lock()
				answered[p][rec.Code]++
				if rec.Code == http.StatusCreated {
					created++
				} else if p != moved {
					t.Errorf("POST (sent %s) = %d %s", []string{"before the move", "", "after the WARN"}[p], rec.Code, strings.TrimSpace(rec.Body.String()))
				}
				if counts[p]++; reached[p] != nil && counts[p] == want[p] {
					close(reached[p])
				}
				mu.Unlock()
			}
		})
	}
	wait := func(ch <-chan struct{}, what string, d time.Duration) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(d):
			close(stop)
			wg.Wait()
			t.Fatalf("waited %v for %s; answers sent before the move %v, since %v", d, what, answered[before], answered[moved])
		}
	}
	wait(reached[before], "100 requests straight to PostgreSQL", time.Minute)
	if lines := logs.switchLines(); len(lines) != 0 {
		t.Fatalf("a switch straight to PostgreSQL: %v", lines)
	}
	path.SetUpstream(bouncer.Host)
	phase.Store(moved)
	reset := path.Reset()
	wait(logs.switched, "the WARN of a switch after the move behind PgBouncer", 10*time.Second)
	phase.Store(after)
	wait(reached[after], "200 requests after the WARN", time.Minute)
	close(stop)
	wg.Wait()

	wantOneSwitch(t, logs, probeSignal)
	failedBetween := 0
	for status, n := range answered[moved] {
		if status != http.StatusCreated {
			failedBetween += n
		}
	}
	t.Logf("answers sent before the move %v, between the move and the WARN %v, after the WARN %v; %d connections reset by the move",
		answered[before], answered[moved], answered[after], reset)
	if failedBetween > reset {
		t.Errorf("%d requests sent between the move and the WARN were not answered 201, want at most one per connection reset (%d)", failedBetween, reset)
	}
	if n := countRows(t, s, table); n < created || n > created+failedBetween {
		t.Errorf("%d rows for %d requests answered 201 and %d not, want one per 201 and at most one per other", n, created, failedBetween)
	}
	for _, mode := range execModes(t, s.Pool()) {
		if mode != pgx.QueryExecModeCacheDescribe {
			t.Errorf("a connection of the pool runs %v after the switch, want cache_describe", mode)
		}
	}
}

// TestMigrateRetriesAfterALostStatement: two processes' pools that do not see the
// pooler (their probe off) migrate one schema through a PgBouncer with one server
// connection: the second one's statements meet the first one's prepared under pgx's
// names (42P05). Its pool switches, and Migrate runs its transaction again, which
// ran nothing: both migrate.
func TestMigrateRetriesAfterALostStatement(t *testing.T) {
	t.Parallel()
	dbURL, schema := pgtest.Schema(t)
	bounced := pgtest.Bouncer(t, dbURL, 1)
	var switched int
	for range 2 {
		logs := newLogRecorder()
		st := unprobedStore(t, bounced, schema, 1, logs)
		if err := st.Migrate(t.Context()); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
		switched += len(logs.switchLines())
	}
	if switched != 1 {
		t.Errorf("%d pools switched, want the second one", switched)
	}
}

// TestTheProbeIsOneRoundTripPerNewConnection: a pool that ConfigurePool configured
// pays one round trip more for each connection it opens in pgx's default mode (the
// probe, pipelined), and nothing per statement; once switched, or with a mode named,
// none.
func TestTheProbeIsOneRoundTripPerNewConnection(t *testing.T) {
	t.Parallel()
	dbURL := testenv.PostgresURL(t)
	bounced := pgtest.Bouncer(t, dbURL, 1)
	connect := func(url string, configure bool) int {
		cfg, err := pgxpool.ParseConfig(url)
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
		if configure {
			postgres.ConfigurePool(cfg, slog.New(slog.DiscardHandler))
		}
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		conn, err := pool.Acquire(t.Context()) // connects (and, behind the pooler, switches and connects again)
		if err != nil {
			t.Fatal(err)
		}
		conn.Release()
		return trips.count()
	}
	for _, tc := range []struct {
		name, url string
		more      int
	}{
		{"straight to the server", dbURL, 1},
		{"a mode named", pgtest.WithExecMode(t, dbURL, "cache_statement"), 0},
		// The probed connection is closed and another opened in cache_describe, unprobed.
		{"behind PgBouncer", bounced, 1 + connect(bounced, false)},
	} {
		plain, configured := connect(tc.url, false), connect(tc.url, true)
		if configured-plain != tc.more {
			t.Errorf("%s: a new connection took %d round trips configured, %d not; want %d more", tc.name, configured, plain, tc.more)
		}
		t.Logf("%s: %d round trips to connect, %d configured", tc.name, plain, configured)
	}
}
