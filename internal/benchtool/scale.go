package main

import (
	"cmp"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	msqlite "modernc.org/sqlite"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// The stores at scale (issue 13 items 2 and 3). Filler records are made on the server
// with one INSERT … SELECT per million rows, never through the API: record i belongs to
// principal hex(sha256("s" + i%1000)) under key hex(md5(i)), completed with the same
// 201 and body as a template record that goes through the store's own claim and
// completion first, and with one fingerprint for all (the lookups' claims carry it).

const (
	fillScopes = 1000
	fillChunk  = 1_000_000
)

func fillScope(i int64) string {
	sum := sha256.Sum256([]byte("s" + strconv.FormatInt(i%fillScopes, 10)))
	return hex.EncodeToString(sum[:])
}

func fillKey(i int64) string {
	sum := md5.Sum([]byte(strconv.FormatInt(i, 10)))
	return hex.EncodeToString(sum[:])
}

// fillFingerprint is the fingerprint of every filler record and of the lookups.
var fillFingerprint = idem.FingerprintInput("benchtool.fill", []byte("fill"))

// templateBody is a charge as the payments API answers it, ~250 bytes.
const templateBody = `{"id":"ch_uRh49mdFqrwbSX10lCUCVQP4","object":"charge","amount":2000,"currency":"usd",` +
	`"customer_id":"cust_abc123","status":"succeeded","created":1796010050,"idempotency_key":"4f1c6a7e-2b7d-4a53-9b0e-0c1f3f2d9a11"}`

// scaleStore is one store at scale: PostgreSQL or SQLite.
type scaleStore struct {
	idemstore.Store
	pg   *postgres.Store
	lite *sqlite.Store
}

// openScaleStore opens --db: a PostgreSQL URL, or sqlite:PATH.
func openScaleStore(ctx context.Context, db string, cleaner bool) (*scaleStore, error) {
	if path, ok := strings.CutPrefix(db, "sqlite:"); ok {
		registerSQLiteHashes()
		st, err := sqlite.Open(ctx, path, sqlite.Config{DisableCleaner: !cleaner})
		if err != nil {
			return nil, err
		}
		if err := st.Migrate(ctx); err != nil {
			return nil, err
		}
		return &scaleStore{Store: st, lite: st}, nil
	}
	st, err := postgres.Open(ctx, db, postgres.Config{MaxConns: 16, DisableCleaner: !cleaner})
	if err != nil {
		return nil, err
	}
	if err := st.Migrate(ctx); err != nil {
		return nil, err
	}
	return &scaleStore{Store: st, pg: st}, nil
}

func (s *scaleStore) close() {
	if s.pg != nil {
		s.pg.Close()
	} else {
		_ = s.lite.Close()
	}
}

var registerOnce sync.Once

// registerSQLiteHashes gives SQLite the two hashes of the filler's scopes and keys.
func registerSQLiteHashes() {
	registerOnce.Do(func() {
		hash := func(f func(string) string) func(*msqlite.FunctionContext, []driver.Value) (driver.Value, error) {
			return func(_ *msqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
				return f(fmt.Sprint(args[0])), nil
			}
		}
		must(msqlite.RegisterDeterministicScalarFunction("bench_sha256", 1, hash(func(s string) string {
			sum := sha256.Sum256([]byte(s))
			return hex.EncodeToString(sum[:])
		})))
		must(msqlite.RegisterDeterministicScalarFunction("bench_md5", 1, hash(func(s string) string {
			sum := md5.Sum([]byte(s))
			return hex.EncodeToString(sum[:])
		})))
	})
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// count returns how many filler records the store holds (not the template, nor the
// records of the claims that the measurements made).
func (s *scaleStore) count(ctx context.Context) (int64, error) {
	var n int64
	var err error
	const q = `SELECT count(*) FROM idem_records WHERE key NOT LIKE 'new-%' AND key NOT LIKE 'cleanup-%' AND key <> 'template'`
	if s.pg != nil {
		err = s.pg.Pool().QueryRow(ctx, strings.ReplaceAll(q, "key ", "convert_from(key, 'UTF8') ")).Scan(&n)
	} else {
		err = s.lite.DB().QueryRowContext(ctx, q).Scan(&n)
	}
	return n, err
}

// rows counts every record, the measurements' claims included.
func (s *scaleStore) rows(ctx context.Context) (int64, error) {
	var n int64
	var err error
	if s.pg != nil {
		err = s.pg.Pool().QueryRow(ctx, `SELECT count(*) FROM idem_records`).Scan(&n)
	} else {
		err = s.lite.DB().QueryRowContext(ctx, `SELECT count(*) FROM idem_records`).Scan(&n)
	}
	return n, err
}

// template claims and completes one record through the store, whose response the
// filler rows copy.
func (s *scaleStore) template(ctx context.Context) error {
	claim := &idemstore.ClaimParams{Scope: "template", Key: "template", Fingerprint: fillFingerprint,
		Token: "t", RecordID: "template", Lease: time.Minute, TTL: 24 * time.Hour}
	res, err := s.RecordClaim(ctx, claim)
	if err != nil || res.Outcome != idemstore.ClaimAcquired {
		return err // completed already: a previous fill made it
	}
	resp := &idem.Response{Status: http.StatusCreated, Body: []byte(templateBody),
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_uRh49mdFqrwbSX10lCUCVQP4"}}}
	return s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: "template", Key: "template", Token: "t", Response: resp, TTL: 24 * time.Hour})
}

// fill inserts filler records [from, to); expired ones when expired is true (their
// expires_at a day in the past), else live for the next 23 hours or so.
func (s *scaleStore) fill(ctx context.Context, from, to int64, expired bool) error {
	if err := s.template(ctx); err != nil {
		return err
	}
	for lo := from; lo < to; lo += fillChunk {
		hi := min(lo+fillChunk, to)
		start := time.Now()
		var err error
		if s.pg != nil {
			age := "interval '1 hour'"
			if expired {
				age = "interval '48 hours'"
			}
			_, err = s.pg.Pool().Exec(ctx, `INSERT INTO idem_records
				(scope, key, id, fingerprint_version, fingerprint, state, response_status, response_headers,
				 response_body, response_not_stored, created_at, expires_at)
			SELECT convert_to(encode(sha256(convert_to('s' || (i % `+strconv.Itoa(fillScopes)+`)::text, 'UTF8')), 'hex'), 'UTF8'),
			       convert_to(md5(i::text), 'UTF8'), md5('id' || i), t.fingerprint_version, t.fingerprint, 'completed',
			       t.response_status, t.response_headers, t.response_body, false,
			       now() - `+age+` - (i % 3600) * interval '1 second',
			       now() - `+age+` - (i % 3600) * interval '1 second' + interval '24 hours'
			FROM generate_series($1::bigint, $2::bigint - 1) i,
			     (SELECT * FROM idem_records WHERE scope = 'template' AND key = 'template') t
			ON CONFLICT DO NOTHING`, lo, hi)
		} else {
			age := int64(time.Hour)
			if expired {
				age = int64(48 * time.Hour)
			}
			nowNanos := time.Now().UnixNano()
			_, err = s.lite.DB().ExecContext(ctx, `WITH RECURSIVE s(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM s WHERE i + 1 < ?)
			INSERT OR IGNORE INTO idem_records
				(scope, key, record_id, fingerprint_version, fingerprint, state, response_status, response_headers,
				 response_body, response_not_stored, created_at, expires_at)
			SELECT bench_sha256('s' || (i % `+strconv.Itoa(fillScopes)+`)), bench_md5(i), bench_md5('id' || i),
			       t.fingerprint_version, t.fingerprint, 'completed', t.response_status, t.response_headers,
			       t.response_body, 0, ? - ? - (i % 3600) * 1000000000, ? - ? - (i % 3600) * 1000000000 + ?
			FROM s, (SELECT * FROM idem_records WHERE scope = 'template' AND key = 'template') t`,
				lo, hi, nowNanos, age, nowNanos, age, int64(24*time.Hour))
		}
		if err != nil {
			return fmt.Errorf("filling [%d, %d): %w", lo, hi, err)
		}
		fmt.Fprintf(os.Stderr, "benchtool: filled records %d to %d in %v\n", lo, hi, time.Since(start).Round(time.Millisecond))
	}
	return s.analyze(ctx)
}

// anyExpired reports whether the store holds an expired record.
func (s *scaleStore) anyExpired(ctx context.Context) (bool, error) {
	var left bool
	var err error
	if s.pg != nil {
		err = s.pg.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM idem_records WHERE expires_at < now())`).Scan(&left)
	} else {
		err = s.lite.DB().QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM idem_records WHERE expires_at < ?)`, time.Now().UnixNano()).Scan(&left)
	}
	return left, err
}

// settle writes what the fill left dirty to disk (a PostgreSQL CHECKPOINT; SQLite's
// writes are synchronous already), so that the requests measured before the cleanup
// do not meet the fill's write-back.
func (s *scaleStore) settle(ctx context.Context) error {
	if s.pg == nil {
		return nil
	}
	_, err := s.pg.Pool().Exec(ctx, `CHECKPOINT`)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42501" {
		// Not a superuser, nor in pg_checkpoint (a managed database): measure unsettled.
		fmt.Fprintln(os.Stderr, "benchtool: CHECKPOINT refused (insufficient privilege); the fill's writes may still be under way when the measuring starts")
		return nil
	}
	return err
}

// analyze vacuums and analyzes the table, so that every step is measured in the same
// steady state (visibility map set, statistics current).
func (s *scaleStore) analyze(ctx context.Context) error {
	if s.pg != nil {
		_, err := s.pg.Pool().Exec(ctx, `VACUUM (ANALYZE) idem_records`)
		return err
	}
	_, err := s.lite.DB().ExecContext(ctx, `ANALYZE idem_records`)
	return err
}

// sizes are the table's and its indexes' sizes, in bytes.
type sizes struct {
	Heap      int64 `json:"heap_bytes"`
	PrimayKey int64 `json:"primary_key_bytes"`
	ExpiresAt int64 `json:"expires_at_index_bytes"`
	Indexes   int64 `json:"indexes_bytes"`
	Toast     int64 `json:"toast_bytes"`
	Total     int64 `json:"total_bytes"`
	DeadRows  int64 `json:"dead_rows"`
}

func (s *scaleStore) sizes(ctx context.Context) (sizes, error) {
	var z sizes
	if s.pg != nil {
		err := s.pg.Pool().QueryRow(ctx, `SELECT pg_relation_size('idem_records'), pg_relation_size('idem_records_pkey'),
			coalesce(pg_relation_size(to_regclass('idem_records_expires_at_idx')), 0), pg_indexes_size('idem_records'),
			coalesce((SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = 'idem_records'::regclass AND reltoastrelid <> 0), 0),
			pg_total_relation_size('idem_records'),
			coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'idem_records'::regclass), 0)`).
			Scan(&z.Heap, &z.PrimayKey, &z.ExpiresAt, &z.Indexes, &z.Toast, &z.Total, &z.DeadRows)
		return z, err
	}
	db := s.lite.DB()
	// dbstat is compiled into modernc.org/sqlite.
	rows, err := db.QueryContext(ctx, `SELECT name, sum(pgsize) FROM dbstat GROUP BY name`)
	if err != nil {
		return z, err
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return z, err
		}
		z.Total += n
		switch {
		case name == "idem_records":
			z.Heap = n
		case name == "sqlite_autoindex_idem_records_1":
			z.PrimayKey, z.Indexes = n, z.Indexes+n
		case name == "idem_records_expires_at":
			z.ExpiresAt, z.Indexes = n, z.Indexes+n
		case strings.HasPrefix(name, "idem_records"):
			z.Indexes += n
		default:
			z.Total -= n // other tables
		}
	}
	return z, rows.Err()
}

// latency is one measured phase.
type latency struct {
	Ops  int64   `json:"ops"`
	Rate float64 `json:"ops_per_second"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// phase runs op from concurrency workers for d and returns its latencies.
func phase(ctx context.Context, concurrency int, d time.Duration, op func(rng *rand.Rand) error) (latency, error) {
	w, err := sample(ctx, concurrency, d, op)
	return w.latency(), err
}

// window is one phase's latencies, sorted, and how long it ran.
type window struct {
	took time.Duration
	lat  []time.Duration
}

// latency is the window's figures.
func (w window) latency() latency {
	return latency{Ops: int64(len(w.lat)), Rate: float64(len(w.lat)) / w.took.Seconds(),
		P50: percentile(w.lat, 0.5), P99: percentile(w.lat, 0.99), Max: percentile(w.lat, 1)}
}

// sample runs op from concurrency workers for d and returns its latencies.
func sample(ctx context.Context, concurrency int, d time.Duration, op func(rng *rand.Rand) error) (window, error) {
	lat := make([][]time.Duration, concurrency)
	var failed atomic.Pointer[error]
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range concurrency {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for time.Now().Before(deadline) && ctx.Err() == nil && failed.Load() == nil {
				t0 := time.Now()
				if err := op(rng); err != nil {
					failed.Store(&err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		return window{}, *p
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	return window{took: time.Since(start), lat: all}, nil
}

// lookup claims a random filler record of [0, n): a replay.
func (s *scaleStore) lookup(ctx context.Context, n int64) func(rng *rand.Rand) error {
	return func(rng *rand.Rand) error {
		i := rng.Int64N(n)
		res, err := s.RecordClaim(ctx, &idemstore.ClaimParams{Scope: fillScope(i), Key: fillKey(i),
			Fingerprint: fillFingerprint, Token: "x", RecordID: "x", Lease: 30 * time.Second, TTL: 24 * time.Hour})
		if err == nil && res.Outcome != idemstore.ClaimCompleted {
			err = fmt.Errorf("lookup of record %d: %v, want completed", i, res.Outcome)
		}
		return err
	}
}

// claim claims a new key (and completes it, unmeasured: it is part of the op).
func (s *scaleStore) claim(ctx context.Context, tag string) func(rng *rand.Rand) error {
	var seq atomic.Int64
	resp := &idem.Response{Status: http.StatusCreated, Body: []byte(templateBody), Header: http.Header{"Content-Type": {"application/json"}}}
	return func(rng *rand.Rand) error {
		n := seq.Add(1)
		scope, key := fillScope(rng.Int64N(fillScopes)), fmt.Sprintf("%s-%d-%d", tag, time.Now().UnixNano(), n)
		res, err := s.RecordClaim(ctx, &idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: fillFingerprint,
			Token: "tok", RecordID: key, Lease: 30 * time.Second, TTL: 24 * time.Hour})
		if err != nil {
			return err
		}
		if res.Outcome != idemstore.ClaimAcquired {
			return fmt.Errorf("claim of a new key: %v", res.Outcome)
		}
		return s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: scope, Key: key, Token: "tok", Response: resp, TTL: 24 * time.Hour})
	}
}

// step is the figures of one table size.
type step struct {
	Store   string  `json:"store"`
	Records int64   `json:"records"`
	Rows    int64   `json:"rows"`
	Sizes   sizes   `json:"sizes"`
	Lookup  latency `json:"lookup"`
	Claim   latency `json:"claim"`
}

// openCounted opens the store of --db and counts its filler records.
func openCounted(ctx context.Context, db string) (*scaleStore, int64, error) {
	st, err := openScaleStore(ctx, db, false)
	if err != nil {
		return nil, 0, err
	}
	n, err := st.count(ctx)
	if err != nil {
		st.close()
		return nil, 0, err
	}
	return st, n, nil
}

func runFill(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fill", flag.ContinueOnError)
	db := fs.String("db", "", "PostgreSQL URL, or sqlite:PATH (required)")
	records := fs.Int64("records", 0, "make the table hold this many filler records")
	expired := fs.Bool("expired", false, "the new filler records are expired")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, n, err := openCounted(ctx, *db)
	if err != nil {
		return err
	}
	defer st.close()
	return st.fill(ctx, n, *records, *expired)
}

func runScale(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	db := fs.String("db", "", "PostgreSQL URL, or sqlite:PATH (required)")
	stepsFlag := fs.String("steps", "10000,100000,1000000,10000000", "table sizes to measure at, in records")
	concurrency := fs.Int("concurrency", 8, "concurrent workers of each phase")
	d := fs.Duration("duration", 5*time.Second, "how long each phase runs")
	repeat := fs.Int("repeat", 3, "phases of each kind per size, alternating; the one of median p99 is kept")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, err := openScaleStore(ctx, *db, false)
	if err != nil {
		return err
	}
	defer st.close()
	name := "postgres"
	if st.lite != nil {
		name = "sqlite"
	}
	enc := json.NewEncoder(os.Stdout)
	for _, f := range strings.Split(*stepsFlag, ",") {
		target, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("--steps: %w", err)
		}
		n, err := st.count(ctx)
		if err != nil {
			return err
		}
		if n < target {
			if err := st.fill(ctx, n, target, false); err != nil {
				return err
			}
		}
		r := step{Store: name, Records: target}
		var lookups, claims []latency
		for range max(*repeat, 1) {
			l, err := phase(ctx, *concurrency, *d, st.lookup(ctx, target))
			if err != nil {
				return err
			}
			c, err := phase(ctx, *concurrency, *d, st.claim(ctx, "new-"+strconv.FormatInt(target, 10)))
			if err != nil {
				return err
			}
			lookups, claims = append(lookups, l), append(claims, c)
		}
		r.Lookup, r.Claim = medianP99(lookups), medianP99(claims)
		if err := st.analyze(ctx); err != nil {
			return err
		}
		if r.Sizes, err = st.sizes(ctx); err != nil {
			return err
		}
		if r.Rows, err = st.rows(ctx); err != nil {
			return err
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// cleanupRun is what cleanup measures. Requests are timed in windows of
// cleanupWindow: each period's figures are those of all its requests together, and
// its worst window is the one of the highest p99 (a short burst, which the period's
// p99 averages out, shows there).
type cleanupRun struct {
	Store          string  `json:"store"`
	Expired        int64   `json:"expired_records"`
	Live           int64   `json:"live_records"`
	Deleted        int64   `json:"deleted"`
	Passes         int     `json:"passes"`
	Seconds        float64 `json:"cleaner_seconds"`
	DeletedPerSec  float64 `json:"deleted_per_second"`
	Before         latency `json:"requests_before"`
	During         latency `json:"requests_during"`
	After          latency `json:"requests_after"`
	WorstBefore    latency `json:"worst_window_before"`
	WorstDuring    latency `json:"worst_window_during"`
	WorstAfter     latency `json:"worst_window_after"`
	SizesBefore    sizes   `json:"sizes_before"`
	SizesAfter     sizes   `json:"sizes_after"`
	SizesVacuumed  sizes   `json:"sizes_after_vacuum"`
	LongestBatchMS float64 `json:"longest_batch_ms"`
	// PostgreSQL only: the WAL written while the cleaner ran, and the checkpoints
	// that began then, requested (by WAL volume) and timed.
	WALMB            float64 `json:"wal_mb_during"`
	CheckpointsReq   int64   `json:"checkpoints_requested_during"`
	CheckpointsTimed int64   `json:"checkpoints_timed_during"`
}

// walMark is where PostgreSQL's WAL and checkpoint counters stand.
type walMark struct{ lsn, req, timed int64 }

// walMark reads the WAL position and the checkpoints so far (zero for SQLite).
func (s *scaleStore) walMark(ctx context.Context) (walMark, error) {
	var m walMark
	if s.pg == nil {
		return m, nil
	}
	err := s.pg.Pool().QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, checkpoints_req, checkpoints_timed
		FROM pg_stat_bgwriter`).Scan(&m.lsn, &m.req, &m.timed)
	return m, err
}

// cleanupWindow is how long each window of cleanup's requests runs.
const cleanupWindow = 5 * time.Second

// period is the windows of one period of requests.
type period []window

// run adds windows of requests until done reports true after one (at least one
// window, and windows of cleanupWindow until d when d is set).
func (p *period) run(ctx context.Context, concurrency int, d time.Duration, op func(rng *rand.Rand) error, done func() bool) error {
	start := time.Now()
	for {
		length := cleanupWindow
		if d > 0 {
			length = min(length, max(d-time.Since(start), time.Second))
		}
		w, err := sample(ctx, concurrency, length, op)
		if err != nil {
			return err
		}
		*p = append(*p, w)
		if done() || (d > 0 && time.Since(start) >= d) {
			return nil
		}
	}
}

// all is the figures of every request of the period together.
func (p period) all() latency {
	var u window
	for _, w := range p {
		u.took += w.took
		u.lat = append(u.lat, w.lat...)
	}
	slices.Sort(u.lat)
	return u.latency()
}

// worst is the figures of the period's window of the highest p99.
func (p period) worst() latency {
	var worst latency
	for _, w := range p {
		if l := w.latency(); l.P99 > worst.P99 {
			worst = l
		}
	}
	return worst
}

func runCleanup(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	db := fs.String("db", "", "PostgreSQL URL, or sqlite:PATH, of an empty store (required)")
	expired := fs.Int64("expired", 1_000_000, "expired records to clean")
	live := fs.Int64("live", 100_000, "live records, which the requests read")
	concurrency := fs.Int("concurrency", 8, "concurrent request workers")
	d := fs.Duration("duration", 30*time.Second, "how long the before and after periods run")
	warmup := fs.Duration("warmup", 30*time.Second, "how long requests run, unmeasured, before the before period")
	batch := fs.Int("batch", idem.DefaultCleanerBatchSize, "the cleaner's batch size")
	interval := fs.Duration("interval", time.Second, "the pause between the cleaner's passes (its own default is a minute; cleanup's is short so that its run measures the deletes)")
	filled := fs.Bool("filled", false, "the store is already filled as cleanup would fill it: a copy (createdb --template) of a database that `benchtool fill --records LIVE` then `benchtool fill --records LIVE+EXPIRED --expired` filled, so that runs at scale need not fill again")
	pause := fs.Duration("pause", 0, "the cleaner's pause between batches (0: its default, five times as long as the batch before)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	st, n, err := openCounted(ctx, *db)
	if err != nil {
		return err
	}
	defer st.close()
	switch {
	case *filled && n != *live+*expired:
		return fmt.Errorf("cleanup --filled: the store holds %d filler records, not %d live and %d expired", n, *live, *expired)
	case *filled:
	case n != 0:
		return errors.New("cleanup needs an empty store (or --filled)")
	default:
		if err := st.fill(ctx, 0, *live, false); err != nil {
			return err
		}
		if err := st.fill(ctx, *live, *live+*expired, true); err != nil {
			return err
		}
	}
	if err := st.settle(ctx); err != nil {
		return err
	}
	r := cleanupRun{Store: "postgres", Expired: *expired, Live: *live}
	if st.lite != nil {
		r.Store = "sqlite"
	}
	if r.SizesBefore, err = st.sizes(ctx); err != nil {
		return err
	}
	// Requests: half replays of live records, half new keys.
	var flip atomic.Int64
	lookup, claim := st.lookup(ctx, *live), st.claim(ctx, "cleanup")
	requests := func(rng *rand.Rand) error {
		if flip.Add(1)%2 == 0 {
			return lookup(rng)
		}
		return claim(rng)
	}
	never := func() bool { return false }
	var warm, before, during, after period
	if *warmup > 0 {
		// Discarded: the table's pages come into the caches, and a copied database's
		// files are written back, before anything is measured.
		if err := warm.run(ctx, *concurrency, *warmup, requests, never); err != nil {
			return err
		}
	}
	if err := before.run(ctx, *concurrency, *d, requests, never); err != nil {
		return err
	}
	r.Before, r.WorstBefore = before.all(), before.worst()
	// One pass of the cleaner, as the store's own runs it, its batches timed.
	timed := &timedStore{Store: st}
	mark, err := st.walMark(ctx)
	if err != nil {
		return err
	}
	cleaner := idem.NewCleaner(timed, idem.CleanerConfig{BatchSize: *batch, BatchPause: *pause})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		deleted, passes int
		took            time.Duration
		err             error
	}
	done := make(chan result, 1)
	go func() {
		// Passes as the cleaner's own loop runs them, Interval apart, until every
		// expired record is deleted: a pass ends at a batch that found nothing, which
		// a walking store (PostgreSQL) meets where live records fill its pages, and
		// the next pass walks on from there.
		start := time.Now()
		var r result
		for r.deleted < int(*expired) && r.err == nil {
			if r.passes > 0 {
				select {
				case <-cctx.Done():
					r.err = cctx.Err()
					continue
				case <-time.After(*interval):
				}
			}
			n, err := cleaner.Pass(cctx)
			r.deleted, r.err = r.deleted+n, err
			r.passes++
			if n == 0 && err == nil && r.deleted < int(*expired) {
				// A pass that found nothing: the walk may be among live records, or
				// the expired ones may be gone some other way; never loop forever.
				left, err := st.anyExpired(cctx)
				if err == nil && !left {
					err = fmt.Errorf("the cleaner deleted %d of %d expired records and none is left", r.deleted, *expired)
				}
				r.err = err
			}
		}
		r.took = time.Since(start)
		done <- r
	}()
	// Requests run while the cleaner deletes, window after window, until it is done.
	var res result
	finished := func() bool {
		select {
		case res = <-done:
			return true
		default:
			return false
		}
	}
	if err := during.run(ctx, *concurrency, 0, requests, finished); err != nil {
		return err
	}
	if res.err != nil {
		return res.err
	}
	r.Deleted, r.Passes, r.Seconds = int64(res.deleted), res.passes, res.took.Seconds()
	r.DeletedPerSec = float64(res.deleted) / res.took.Seconds()
	r.LongestBatchMS = float64(time.Duration(timed.longest.Load()).Microseconds()) / 1000
	r.During, r.WorstDuring = during.all(), during.worst()
	if end, err := st.walMark(ctx); err != nil {
		return err
	} else if st.pg != nil {
		r.WALMB, r.CheckpointsReq, r.CheckpointsTimed = float64(end.lsn-mark.lsn)/(1<<20), end.req-mark.req, end.timed-mark.timed
	}
	if r.SizesAfter, err = st.sizes(ctx); err != nil {
		return err
	}
	if err := after.run(ctx, *concurrency, *d, requests, never); err != nil {
		return err
	}
	r.After, r.WorstAfter = after.all(), after.worst()
	if err := st.analyze(ctx); err != nil {
		return err
	}
	if r.SizesVacuumed, err = st.sizes(ctx); err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// timedStore times the cleaner's batch deletes.
type timedStore struct {
	idemstore.Store
	longest atomic.Int64
}

func (t *timedStore) RecordDeleteExpired(ctx context.Context, p *idemstore.DeleteExpiredParams) (int, error) {
	start := time.Now()
	n, err := t.Store.RecordDeleteExpired(ctx, p)
	if took := int64(time.Since(start)); took > t.longest.Load() {
		t.longest.Store(took)
	}
	return n, err
}

// medianP99 is the phase of median p99 (a shared machine's noise comes in bursts).
func medianP99(ls []latency) latency {
	slices.SortFunc(ls, func(a, b latency) int { return cmp.Compare(a.P99, b.P99) })
	return ls[len(ls)/2]
}
