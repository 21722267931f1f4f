package postgres_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/postgres"
)

// txConn is what a test's function does inside the transaction of a §7 helper: run a
// statement, or scan the one row a query returns.
type txConn struct {
	exec func(ctx context.Context, query string, args ...any) error
	scan func(ctx context.Context, query string, dest ...any) error
}

// txHelper is one of the store's SPEC §7 helpers: run runs fn in one transaction that
// completes the record of the idem.Handle that ctx carries.
type txHelper struct {
	name string
	run  func(s *postgres.Store, ctx context.Context, fn func(ctx context.Context, c txConn) error) error
}

// txHelpers are the §7 helpers every InTx test runs through: pgx's (InTx) and
// database/sql's (InSQLTx, on Store.DB).
var txHelpers = []txHelper{
	{"InTx", func(s *postgres.Store, ctx context.Context, fn func(context.Context, txConn) error) error {
		return s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return fn(ctx, txConn{
				exec: func(ctx context.Context, q string, args ...any) error { _, err := tx.Exec(ctx, q, args...); return err },
				scan: func(ctx context.Context, q string, dest ...any) error { return tx.QueryRow(ctx, q).Scan(dest...) },
			})
		})
	}},
	{"InSQLTx", func(s *postgres.Store, ctx context.Context, fn func(context.Context, txConn) error) error {
		return s.InSQLTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			return fn(ctx, txConn{
				exec: func(ctx context.Context, q string, args ...any) error {
					_, err := tx.ExecContext(ctx, q, args...)
					return err
				},
				scan: func(ctx context.Context, q string, dest ...any) error {
					return tx.QueryRowContext(ctx, q).Scan(dest...)
				},
			})
		})
	}},
}

// forEachTxHelper runs test once per §7 helper, as parallel subtests.
func forEachTxHelper(t *testing.T, test func(t *testing.T, tx txHelper)) {
	for _, tx := range txHelpers {
		t.Run(tx.name, func(t *testing.T) {
			t.Parallel()
			test(t, tx)
		})
	}
}

// chargeApp is a tiny application whose handler inserts a charge and writes its
// response inside a §7 helper (InTx or InSQLTx), behind the real idem middleware with
// an injected clock.
type chargeApp struct {
	s       schemaStore
	tx      txHelper
	handler http.Handler

	clock *testkit.Clock
	// gates, by request name (X-Test-Name), hold a handler before its transaction.
	gates testkit.Gates
}

func newChargeApp(t *testing.T, tx txHelper) *chargeApp {
	t.Helper()
	s := newStore(t)
	// The batch column is unique but checked at COMMIT: two charges of one batch make
	// the COMMIT itself fail, which is how a test provokes a failed commit.
	_, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+s.table("charges")+` (
		name  text PRIMARY KEY,
		batch text UNIQUE DEFERRABLE INITIALLY DEFERRED
	)`)
	if err != nil {
		t.Fatal(err)
	}
	app := &chargeApp{s: s, tx: tx, clock: testkit.NewClock(time.Now().UTC().Truncate(time.Millisecond))}
	m := idem.New(idem.Config{
		Store: s.Store,
		Scope: func(*http.Request) (string, error) { return "user-1", nil },
		Lease: 10 * time.Second,
		Clock: app.clock.Now,
	})
	app.handler = m.Handler(http.HandlerFunc(app.createCharge))
	return app
}

// createCharge inserts the charge named by X-Test-Name (in batch X-Test-Batch, when
// set: a second charge of a batch fails at COMMIT) and answers 201, inside the app's
// §7 helper.
func (app *chargeApp) createCharge(w http.ResponseWriter, r *http.Request) {
	name := r.Header.Get("X-Test-Name")
	var batch *string
	if b := r.Header.Get("X-Test-Batch"); b != "" {
		batch = &b
	}
	app.gates.Pass(name)
	err := app.tx.run(app.s.Store, r.Context(), func(ctx context.Context, tx txConn) error {
		if err := tx.exec(ctx, `INSERT INTO `+app.s.table("charges")+` (name, batch) VALUES ($1, $2)`, name, batch); err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"object":"charge","name":%q}`, name)
		return nil
	})
	if err != nil {
		// Never reaches the client when the completion failed: the middleware answers
		// 503 instead.
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func (app *chargeApp) post(key, name, batch string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":2000}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Test-Name", name)
	if batch != "" {
		req.Header.Set("X-Test-Batch", batch)
	}
	rec := httptest.NewRecorder()
	app.handler.ServeHTTP(rec, req)
	return rec
}

func (app *chargeApp) charges(t *testing.T) []string {
	t.Helper()
	rows, err := app.s.Pool().Query(t.Context(), `SELECT name FROM `+app.s.table("charges")+` ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func (app *chargeApp) record(t *testing.T, key string) (*idemstore.Record, error) {
	t.Helper()
	return app.s.RecordGet(t.Context(), &idemstore.GetParams{Scope: "user-1", Key: key, Now: app.clock.Now()})
}

func TestInTxCommitsTheChargeAndTheRecordTogether(t *testing.T) {
	t.Parallel()
	forEachTxHelper(t, func(t *testing.T, tx txHelper) {
		app := newChargeApp(t, tx)
		const key = "key-commits-together"
		first := app.post(key, "a", "")
		if first.Code != http.StatusCreated {
			t.Fatalf("first POST = %d %s, want 201", first.Code, first.Body)
		}
		if got := app.charges(t); len(got) != 1 || got[0] != "a" {
			t.Fatalf("charges = %q, want [a]", got)
		}
		rec, err := app.record(t, key)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idemstore.StateCompleted || rec.Response.Status != http.StatusCreated || string(rec.Response.Body) != first.Body.String() {
			t.Fatalf("record = %s %+v, want completed with the response sent", rec.State, rec.Response)
		}
		retry := app.post(key, "b", "")
		if retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() || retry.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry = %d %q (replayed %q), want the first response replayed", retry.Code, retry.Body, retry.Header().Get("Idempotent-Replayed"))
		}
		if got := app.charges(t); len(got) != 1 {
			t.Fatalf("charges after the retry = %q, want one", got)
		}
	})
}

func TestInTxWhoseKeyWasTakenOverRollsBackAndAnswers503(t *testing.T) {
	t.Parallel()
	forEachTxHelper(t, func(t *testing.T, tx txHelper) {
		app := newChargeApp(t, tx)
		const key = "key-taken-over"
		slow := app.gates.Add("slow")
		slowDone := make(chan *httptest.ResponseRecorder, 1)
		go func() { slowDone <- app.post(key, "slow", "") }()
		<-slow.Entered // "slow" holds the key and has not begun its transaction

		// Its lease lapses; the client's retry takes the key over and commits.
		app.clock.Advance(11 * time.Second)
		retry := app.post(key, "retry", "")
		if retry.Code != http.StatusCreated {
			t.Fatalf("retry after the lease lapsed = %d %s, want 201 (takeover)", retry.Code, retry.Body)
		}

		close(slow.Proceed)
		got := <-slowDone
		if got.Code != http.StatusServiceUnavailable || !strings.Contains(got.Body.String(), "store_unavailable") {
			t.Fatalf("the overtaken request = %d %s, want 503 store_unavailable", got.Code, got.Body)
		}
		if names := app.charges(t); len(names) != 1 || names[0] != "retry" {
			t.Fatalf("charges = %q, want only the winner's [retry]: the overtaken write must roll back", names)
		}
		rec, err := app.record(t, key)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Name string }
		if err := json.Unmarshal(rec.Response.Body, &body); err != nil || body.Name != "retry" {
			t.Fatalf("stored response = %s (%v), want the winner's", rec.Response.Body, err)
		}
	})
}

func TestInTxWhoseCommitFailsAnswers503AndStoresNothing(t *testing.T) {
	t.Parallel()
	forEachTxHelper(t, func(t *testing.T, tx txHelper) {
		app := newChargeApp(t, tx)
		if got := app.post("key-batch-first", "first", "b1"); got.Code != http.StatusCreated {
			t.Fatalf("first charge of the batch = %d %s, want 201", got.Code, got.Body)
		}
		// The second charge of batch b1 violates the deferred unique constraint at COMMIT,
		// after the fenced completion succeeded inside the transaction.
		const key = "key-batch-second"
		got := app.post(key, "second", "b1")
		if got.Code != http.StatusServiceUnavailable || !strings.Contains(got.Body.String(), "store_unavailable") {
			t.Fatalf("request whose COMMIT failed = %d %s, want 503 store_unavailable", got.Code, got.Body)
		}
		if names := app.charges(t); len(names) != 1 || names[0] != "first" {
			t.Fatalf("charges = %q, want [first]: the failed transaction wrote nothing", names)
		}
		// Neither was the record completed: the key was released, and a retry executes.
		if _, err := app.record(t, key); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("record after the failed COMMIT: %v, want ErrNotFound (released)", err)
		}
		if got := app.post(key, "second", "b2"); got.Code != http.StatusCreated {
			t.Fatalf("retry in another batch = %d %s, want 201", got.Code, got.Body)
		}
	})
}

func TestInTxWithoutKeyIsAPlainTransaction(t *testing.T) {
	t.Parallel()
	forEachTxHelper(t, func(t *testing.T, tx txHelper) {
		app := newChargeApp(t, tx)
		ctx := idem.WithoutKey(t.Context())
		insert := func(name string) func(context.Context, txConn) error {
			return func(ctx context.Context, c txConn) error {
				return c.exec(ctx, `INSERT INTO `+app.s.table("charges")+` (name) VALUES ($1)`, name)
			}
		}
		if err := tx.run(app.s.Store, ctx, insert("committed")); err != nil {
			t.Fatalf("%s: %v", tx.name, err)
		}
		boom := errors.New("boom")
		err := tx.run(app.s.Store, ctx, func(ctx context.Context, c txConn) error {
			if err := insert("rolled-back")(ctx, c); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("%s with a failing fn = %v, want fn's error", tx.name, err)
		}
		func() {
			defer func() {
				if p := recover(); p != "panicked" {
					t.Errorf("recovered %v, want fn's panic re-raised", p)
				}
			}()
			_ = tx.run(app.s.Store, ctx, func(ctx context.Context, c txConn) error {
				_ = insert("panicked")(ctx, c)
				panic("panicked")
			})
		}()
		if names := app.charges(t); len(names) != 1 || names[0] != "committed" {
			t.Fatalf("charges = %q, want only [committed]", names)
		}
	})
}

// TestInTxRunsAtReadCommitted uses a connection whose default isolation is
// SERIALIZABLE: each helper must ask for READ COMMITTED itself (InTx in the BEGIN that
// its first statement, the scan, carries).
func TestInTxRunsAtReadCommitted(t *testing.T) {
	t.Parallel()
	forEachTxHelper(t, func(t *testing.T, tx txHelper) {
		dbURL, schema := pgtest.Schema(t)
		s, err := postgres.Open(t.Context(), pgtest.WithParam(t, dbURL, "default_transaction_isolation", "serializable"), postgres.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var def, level string
		if err := s.Pool().QueryRow(t.Context(), `SHOW default_transaction_isolation`).Scan(&def); err != nil || def != "serializable" {
			t.Fatalf("test bug: default isolation = %q, %v", def, err)
		}
		err = tx.run(s, idem.WithoutKey(t.Context()), func(ctx context.Context, c txConn) error {
			return c.scan(ctx, `SHOW transaction_isolation`, &level)
		})
		if err != nil {
			t.Fatal(err)
		}
		if level != "read committed" {
			t.Errorf("%s isolation = %q, want read committed", tx.name, level)
		}
	})
	// And Respond's pipelined transaction.
	dbURL, schema := pgtest.Schema(t)
	s, err := postgres.Open(t.Context(), pgtest.WithParam(t, dbURL, "default_transaction_isolation", "serializable"), postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var level string
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	err = s.Respond(httptest.NewRecorder(), r.WithContext(idem.WithoutKey(t.Context())), func(b *pgx.Batch) (*idemstore.Response, error) {
		b.Queue(`SHOW transaction_isolation`).QueryRow(func(row pgx.Row) error { return row.Scan(&level) })
		return &idemstore.Response{Status: http.StatusOK}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if level != "read committed" {
		t.Errorf("Respond isolation = %q, want read committed", level)
	}
}

// TestInTxRefusesTheCompletionOfALostClaim is the safety argument of claims committed
// without waiting for the WAL flush (doc.go, "Durable claims"): when a crash loses the
// claim row, the holder's fenced completion finds nothing, its writes roll back and it
// answers 503; the client's retry then executes once.
func TestInTxRefusesTheCompletionOfALostClaim(t *testing.T) {
	t.Parallel()
	forEachTxHelper(t, func(t *testing.T, tx txHelper) {
		app := newChargeApp(t, tx)
		const key = "key-claim-lost"
		held := app.gates.Add("held")
		heldDone := make(chan *httptest.ResponseRecorder, 1)
		go func() { heldDone <- app.post(key, "held", "") }()
		<-held.Entered // "held" holds the key and has not begun its transaction

		// The database crashes and comes back without the claim: its commit had not been
		// flushed.
		if _, err := app.s.Pool().Exec(t.Context(), `DELETE FROM `+app.s.table("idem_records")); err != nil {
			t.Fatal(err)
		}
		close(held.Proceed)
		got := <-heldDone
		if got.Code != http.StatusServiceUnavailable || !strings.Contains(got.Body.String(), "store_unavailable") {
			t.Fatalf("the request whose claim was lost = %d %s, want 503 store_unavailable", got.Code, got.Body)
		}
		if names := app.charges(t); len(names) != 0 {
			t.Fatalf("charges = %q, want none: a completion without its claim must roll the writes back", names)
		}
		if _, err := app.record(t, key); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("record after the refused completion: %v, want ErrNotFound", err)
		}
		retry := app.post(key, "retry", "")
		if retry.Code != http.StatusCreated {
			t.Fatalf("retry = %d %s, want 201", retry.Code, retry.Body)
		}
		if names := app.charges(t); len(names) != 1 || names[0] != "retry" {
			t.Fatalf("charges = %q, want exactly the retry's", names)
		}
	})
}
