package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/minimal"
	"github.com/idem-go/idem/store/mysql"
)

// The minimal handler on MySQL (benchtool mysql): the same paths as benchtool serve's
// on PostgreSQL, served in process on one store/mysql pool, plus /plaintx, the INSERT
// in BEGIN … COMMIT:
//
//	POST /plain, /plaintx, /respond, /lease, /intx; GET /items/{id}
const (
	mysqlItemsTable = "CREATE TABLE IF NOT EXISTS bench_items (scope VARBINARY(64) NOT NULL, id VARCHAR(64) NOT NULL, " +
		"amount BIGINT NOT NULL, PRIMARY KEY (scope, id)) ENGINE = InnoDB"
	mysqlInsertItem = `INSERT INTO bench_items (scope, id, amount) VALUES (?, ?, ?)`
	mysqlGetItem    = `SELECT amount FROM bench_items WHERE scope = ? AND id = ?`
)

// mysqlPairs are the comparisons on MySQL, with issue 49's targets.
func mysqlPairs(keys int64) []pair {
	k := fmt.Sprint(keys)
	return []pair{
		{Name: "new key, Respond on a ClaimInHandler route (the documented path)", Group: "new", Base: "plain INSERT", Target: "0.60",
			baseArg: []string{"--path", "/plain"}, idemArg: []string{"--path", "/respond"}},
		{Name: "new key, Respond on a ClaimInHandler route (the documented path)", Group: "new", Base: "BEGIN/INSERT/COMMIT", Target: "0.60",
			baseArg: []string{"--path", "/plaintx"}, idemArg: []string{"--path", "/respond"}},
		{Name: "new key, lease path: claim, then InTx", Group: "new", Base: "plain INSERT", Target: "-",
			baseArg: []string{"--path", "/plain"}, idemArg: []string{"--path", "/intx"}},
		{Name: "new key, lease path: claim, then InTx", Group: "new", Base: "BEGIN/INSERT/COMMIT", Target: "-",
			baseArg: []string{"--path", "/plaintx"}, idemArg: []string{"--path", "/intx"}},
		{Name: "replay of 1 key (ClaimInHandler route)", Group: "replay", Base: "SELECT by primary key, 1 id", Target: "0.85",
			baseArg: []string{"--get", "--keys", "1", "--prefix", "respond-1"}, idemArg: []string{"--path", "/respond", "--keys", "1", "--prefix", "respond-1"}},
		{Name: "replay across " + k + " keys (ClaimInHandler route)", Group: "replay", Base: "SELECT by primary key, " + k + " ids", Target: "0.85",
			baseArg: []string{"--get", "--keys", k, "--prefix", "respond-n"}, idemArg: []string{"--path", "/respond", "--keys", k, "--prefix", "respond-n"}},
		{Name: "replay across " + k + " keys (lease route)", Group: "replay", Base: "SELECT by primary key, " + k + " ids", Target: "0.85",
			baseArg: []string{"--get", "--keys", k, "--prefix", "respond-n"}, idemArg: []string{"--path", "/lease", "--keys", k, "--prefix", "lease-n"}},
	}
}

func runMySQL(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mysql", flag.ContinueOnError)
	server := fs.String("server", "root@tcp(127.0.0.1:3306)/", "MySQL server DSN (or mysql:// URL) without a database: it makes its own and drops it")
	d := fs.Duration("duration", 5*time.Second, "duration of each run")
	rounds := fs.Int("rounds", 2, "rounds of interleaved runs (0: the cleanup run only)")
	concurrency := fs.Int("concurrency", 32, "concurrent workers of each run")
	keys := fs.Int64("keys", 10000, "keys the replays across many keys draw from")
	cleanup := fs.Int("cleanup", 1_000_000, "expired records the cleanup run deletes (0: skip)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dc, err := mysql.ParseDSN(*server)
	if err != nil {
		return err
	}
	admin, err := openMySQL(dc)
	if err != nil {
		return err
	}
	defer admin.Close()
	db := fmt.Sprintf("idem_bench_mysql_%d", os.Getpid())
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+db); err != nil {
		return err
	}
	defer func() { _, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+db) }()
	dc.DBName = db
	st, err := mysql.Open(ctx, dc.FormatDSN(), mysql.Config{MaxOpenConns: *concurrency, DisableCleaner: true})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	if _, err := st.DB().ExecContext(ctx, mysqlItemsTable); err != nil {
		return err
	}
	dur, err := st.Durability(ctx)
	if err != nil {
		return err
	}
	base, stop, err := serveMySQL(ctx, st)
	if err != nil {
		return err
	}
	defer stop()
	logf("MySQL server %s (innodb_flush_log_at_trx_commit %d, sync_binlog %d, log_bin %v), database %s, minimal handler on %s",
		dur.Version, dur.FlushLogAtTrxCommit, dur.SyncBinlog, dur.LogBin, db, base)
	var ps []pair
	if *rounds > 0 {
		ps = mysqlPairs(*keys)
	}
	for _, p := range []struct {
		path, prefix string
		n            int64
	}{{"/respond", "respond-1", 1}, {"/respond", "respond-n", *keys}, {"/lease", "lease-n", *keys}} {
		if ps == nil {
			break
		}
		f := loadFlags{url: base, path: p.path, prefix: p.prefix, token: "tok_bench", keys: p.n, concurrency: 32}
		if err := f.prepare(ctx); err != nil {
			return err
		}
	}
	for _, p := range ps { // warm-up, unmeasured
		for _, a := range [][]string{p.baseArg, p.idemArg} {
			if _, err := measure(ctx, base, a, *concurrency, time.Second); err != nil {
				return err
			}
		}
	}
	var out strings.Builder
	if *rounds > 0 {
		sums, err := interleave(ps, *rounds, func(r int, p pair, side int, args []string) (*summary, error) {
			s, err := measure(ctx, base, args, *concurrency, *d)
			if err == nil {
				logf("round %d, %s, %s: %.0f req/s, p99 %.2f ms", r, p.Name, []string{p.Base, "idem"}[side], s.RequestsPerSecond, s.P99)
			}
			return s, err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(&out, "| workload | baseline | baseline req/s | idem req/s | ratio | goal | baseline p99 ms | idem p99 ms |\n|---|---|---|---|---|---|---|---|\n")
		for i, p := range ps {
			b, m := mean(sums[i][0]), mean(sums[i][1])
			fmt.Fprintf(&out, "| %s | %s | %.0f | %.0f | %.2f | %s | %.2f | %.2f |\n", p.Name, p.Base, b.RequestsPerSecond, m.RequestsPerSecond,
				m.RequestsPerSecond/b.RequestsPerSecond, p.Target, b.P99, m.P99)
		}
	}
	if *cleanup > 0 {
		line, err := mysqlCleanup(ctx, st, base, *cleanup, *concurrency, *d)
		if err != nil {
			return err
		}
		out.WriteString("\n" + line + "\n")
	}
	fmt.Fprintf(&out, "\nServer: %s, innodb_flush_log_at_trx_commit %d, sync_binlog %d, log_bin %v; %d workers, %s runs, %d rounds.\n",
		dur.Version, dur.FlushLogAtTrxCommit, dur.SyncBinlog, dur.LogBin, *concurrency, *d, *rounds)
	_, err = io.WriteString(os.Stdout, out.String())
	return err
}

// openMySQL opens a small pool on dc, as the store configures its own.
func openMySQL(dc *gomysql.Config) (*sql.DB, error) {
	c, err := gomysql.NewConnector(dc)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(4)
	return db, nil
}

// mysqlCleanup fills the store with n expired records, then deletes them in the
// cleaner's batches, each followed by a pause as long as it took (idem.Cleaner's
// pacing), while requests on the documented path run; and says how long the longest
// batch took and what the deletion did to the requests' p99.
func mysqlCleanup(ctx context.Context, st *mysql.Store, base string, n, concurrency int, d time.Duration) (string, error) {
	logf("filling %d expired records", n)
	if err := fillExpired(ctx, st.DB(), n); err != nil {
		return "", err
	}
	before, err := measure(ctx, base, []string{"--path", "/respond"}, concurrency, d)
	if err != nil {
		return "", err
	}
	var batches []time.Duration
	deleted := 0
	cleanCtx, stopClean := context.WithCancel(ctx)
	cleaned := make(chan error, 1)
	start := time.Now()
	go func() {
		for cleanCtx.Err() == nil {
			t0 := time.Now()
			k, err := st.RecordDeleteExpired(cleanCtx, &idemstore.DeleteExpiredParams{Limit: idem.DefaultCleanerBatchSize})
			took := time.Since(t0)
			if err != nil {
				cleaned <- err
				return
			}
			batches = append(batches, took)
			deleted += k
			if k < idem.DefaultCleanerBatchSize {
				break
			}
			time.Sleep(took)
		}
		cleaned <- nil
	}()
	during, err := measure(ctx, base, []string{"--path", "/respond"}, concurrency, d)
	if err != nil {
		stopClean()
		return "", err
	}
	err = <-cleaned
	stopClean()
	if err != nil {
		return "", err
	}
	total := time.Since(start)
	longest := slices.Max(batches)
	return fmt.Sprintf("Cleanup of %d expired records in batches of %d (each followed by a pause as long as it took, as idem.Cleaner paces them): "+
		"%d deleted in %d batches over %s, **longest batch %s** (goal < 1 s); the documented path beside it: %.0f req/s, p99 %.2f ms "+
		"(before: %.0f req/s, p99 %.2f ms).",
		n, idem.DefaultCleanerBatchSize, deleted, len(batches), total.Round(time.Millisecond), longest.Round(time.Microsecond),
		during.RequestsPerSecond, during.P99, before.RequestsPerSecond, before.P99), nil
}

// fillExpired inserts n records that expired two days ago, under the scope
// bench-expired: a first thousand from here, then copies of what is there, doubling
// server-side (INSERT … SELECT), so that millions take seconds, not round trips.
func fillExpired(ctx context.Context, db *sql.DB, n int) error {
	expired := time.Now().Add(-48 * time.Hour).UnixNano()
	var b strings.Builder
	b.WriteString("INSERT INTO idem_records (scope, `key`, record_id, fingerprint_version, fingerprint, state, response_status, " +
		"response_body, created_at, expires_at) VALUES ")
	first := min(n, 1000)
	for i := range first {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "('bench-expired','k%d','r',2,REPEAT('x',32),'completed',201,'{}',%d,%d)", i, expired, expired+int64(i))
	}
	if _, err := db.ExecContext(ctx, b.String()); err != nil {
		return err
	}
	for have := first; have < n; {
		add := min(have, n-have)
		_, err := db.ExecContext(ctx, "INSERT INTO idem_records (scope, `key`, record_id, fingerprint_version, fingerprint, state, "+
			"response_status, response_body, created_at, expires_at) SELECT scope, CONCAT(`key`, '.', ?), record_id, fingerprint_version, "+
			"fingerprint, state, response_status, response_body, created_at, expires_at + ? FROM idem_records WHERE scope = 'bench-expired' LIMIT ?",
			have, have, add)
		if err != nil {
			return err
		}
		have += add
	}
	return nil
}

// serveMySQL serves the minimal handler on st in process, until stop.
func serveMySQL(ctx context.Context, st *mysql.Store) (string, func(), error) {
	quiet := slog.New(slog.DiscardHandler)
	mw := idem.New(idem.Config{Store: st, Scope: minimal.BearerScope, Logger: quiet})
	db := st.DB()
	insert := func(ctx context.Context, e interface {
		ExecContext(context.Context, string, ...any) (sql.Result, error)
	}, sc string, in minimal.Item) error {
		_, err := e.ExecContext(ctx, mysqlInsertItem, sc, in.ID, in.Amount)
		return err
	}
	respond := func(w http.ResponseWriter, r *http.Request) {
		in, sc, _, ok := minimal.Read(w, r)
		if !ok {
			return
		}
		err := st.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			if err := insert(ctx, tx, sc, in); err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, in)
		})
		if err != nil {
			http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /plain", func(w http.ResponseWriter, r *http.Request) {
		if in, sc, _, ok := minimal.Read(w, r); ok {
			answerInsert(w, in, insert(r.Context(), db, sc, in))
		}
	})
	mux.HandleFunc("POST /plaintx", func(w http.ResponseWriter, r *http.Request) {
		if in, sc, _, ok := minimal.Read(w, r); ok {
			answerInsert(w, in, plainTx(r.Context(), db, func(tx *sql.Tx) error { return insert(r.Context(), tx, sc, in) }))
		}
	})
	mux.Handle("POST /respond", mw.Route(idem.RouteOptions{ClaimInHandler: true})(http.HandlerFunc(respond)))
	mux.Handle("POST /lease", mw.Handler(http.HandlerFunc(respond)))
	mux.Handle("POST /intx", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in, sc, _, ok := minimal.Read(w, r)
		if !ok {
			return
		}
		err := st.InTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			if err := insert(ctx, tx, sc, in); err != nil {
				return err
			}
			minimal.WriteItem(w, http.StatusCreated, in)
			return nil
		})
		if err != nil {
			http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
		}
	})))
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		sc, err := minimal.BearerScope(r)
		if err != nil {
			http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		it := minimal.Item{ID: r.PathValue("id"), Object: "item"}
		switch err := db.QueryRowContext(r.Context(), mysqlGetItem, sc, it.ID).Scan(&it.Amount); {
		case errors.Is(err, sql.ErrNoRows):
			http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
		case err != nil:
			http.Error(w, `{"error":"unavailable"}`, http.StatusServiceUnavailable)
		default:
			minimal.WriteItem(w, http.StatusOK, it)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// answerInsert answers a plain insert: 201 with the item, or 409 when it failed.
func answerInsert(w http.ResponseWriter, in minimal.Item, err error) {
	if err != nil {
		http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
		return
	}
	minimal.WriteItem(w, http.StatusCreated, in)
}

// plainTx runs fn in BEGIN … COMMIT.
func plainTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
