package sqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/sqlite"
)

// chargeApp is a tiny application whose handler inserts a charge and writes its
// response inside Store.InTx, behind the real idem middleware with an injected clock.
type chargeApp struct {
	store   *sqlite.Store
	handler http.Handler

	clock *testkit.Clock
	// gates, by request name (X-Test-Name), hold a handler before its transaction.
	gates testkit.Gates
}

func newChargeApp(t *testing.T) *chargeApp {
	t.Helper()
	s, _ := openStore(t, sqlite.Config{})
	if _, err := s.DB().Exec(`CREATE TABLE charges (name TEXT PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	app := &chargeApp{store: s, clock: testkit.NewClock(t0)}
	m := idem.New(idem.Config{
		Store: s,
		Scope: func(*http.Request) (string, error) { return "user-1", nil },
		Lease: 10 * time.Second,
		Clock: app.clock.Now,
	})
	app.handler = m.Handler(http.HandlerFunc(app.createCharge))
	return app
}

func (app *chargeApp) createCharge(w http.ResponseWriter, r *http.Request) {
	name := r.Header.Get("X-Test-Name")
	app.gates.Pass(name)
	err := app.store.InTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO charges (name, amount) VALUES (?, 2000)`, name); err != nil {
			return err
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"object":"charge","name":%q,"amount":2000}`, name)
		return nil
	})
	if err != nil {
		// Never reaches the client when the completion failed: the middleware answers
		// 503 instead.
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// post sends one charge request with key, named name (the row the handler inserts).
func (app *chargeApp) post(key, name string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":2000}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Test-Name", name)
	rec := httptest.NewRecorder()
	app.handler.ServeHTTP(rec, req)
	return rec
}

func (app *chargeApp) charges(t *testing.T) []string {
	t.Helper()
	rows, err := app.store.DB().Query(`SELECT name FROM charges ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	return names
}

func TestInTxCommitsTheChargeAndTheRecordTogether(t *testing.T) {
	t.Parallel()
	app := newChargeApp(t)
	const key = "key-commits-together"
	first := app.post(key, "a")
	if first.Code != http.StatusCreated {
		t.Fatalf("first POST = %d %s, want 201", first.Code, first.Body)
	}
	if got := app.charges(t); len(got) != 1 || got[0] != "a" {
		t.Fatalf("charges = %q, want [a]", got)
	}
	rec, err := app.store.RecordGet(context.Background(), &idemstore.GetParams{Scope: "user-1", Key: key, Now: app.clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idemstore.StateCompleted || rec.Response.Status != http.StatusCreated || string(rec.Response.Body) != first.Body.String() {
		t.Fatalf("record = %s %+v, want completed with the response sent", rec.State, rec.Response)
	}

	retry := app.post(key, "b") // same key and body: a retry
	if retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d %q (replayed %q), want the first response replayed", retry.Code, retry.Body, retry.Header().Get("Idempotent-Replayed"))
	}
	if got := app.charges(t); len(got) != 1 {
		t.Fatalf("charges after the retry = %q, want one", got)
	}
}

func TestInTxWhoseKeyWasTakenOverRollsBackAndAnswers503(t *testing.T) {
	t.Parallel()
	app := newChargeApp(t)
	const key = "key-taken-over"
	slow := app.gates.Add("slow")
	slowDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { slowDone <- app.post(key, "slow") }()
	<-slow.Entered // "slow" holds the key and has not begun its transaction

	// Its lease lapses; the client's retry takes the key over and commits.
	app.clock.Advance(11 * time.Second)
	retry := app.post(key, "retry")
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
	rec, err := app.store.RecordGet(context.Background(), &idemstore.GetParams{Scope: "user-1", Key: key, Now: app.clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ Name string }
	if err := json.Unmarshal(rec.Response.Body, &body); err != nil || body.Name != "retry" {
		t.Fatalf("stored response = %s (%v), want the winner's", rec.Response.Body, err)
	}
}

// opSignal is a slog.Handler that signals the first record whose message contains msg
// and whose "op" attribute is op: a test waits on it instead of sleeping.
type opSignal struct {
	msg, op string
	ch      chan struct{}
	once    *sync.Once
}

func newOpSignal(msg, op string) opSignal {
	return opSignal{msg: msg, op: op, ch: make(chan struct{}), once: new(sync.Once)}
}

func (h opSignal) Enabled(context.Context, slog.Level) bool { return true }
func (h opSignal) Handle(_ context.Context, r slog.Record) error {
	if !strings.Contains(r.Message, h.msg) {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "op" && a.Value.String() == h.op {
			h.once.Do(func() { close(h.ch) })
		}
		return true
	})
	return nil
}
func (h opSignal) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h opSignal) WithGroup(string) slog.Handler      { return h }

// A heartbeat renewal that ticks while the handler's InTx holds the write turn waits
// for that turn; when InTx asks for the completion, the middleware stops the
// heartbeat. The waiting renewal must be called off at once (context.Canceled) rather
// than hold the completion (and SQLite's one write lock) until its own timeout, a
// heartbeat period (context.DeadlineExceeded). The test asserts how the renewal ended,
// not how long anything took, so a slow disk or a loaded machine cannot fail it.
func TestRenewalWaitingForInTxDoesNotHoldUpTheCompletion(t *testing.T) {
	t.Parallel()
	const heartbeat = 2 * time.Second
	renewWaits := newOpSignal("waiting for this process's write turn", "renew")
	s, _ := openStore(t, sqlite.Config{Logger: slog.New(renewWaits)})
	renewals := &renewRecorder{Store: s, errs: make(chan error, 16)}
	m := idem.New(idem.Config{
		Store: renewals, Scope: func(*http.Request) (string, error) { return "u", nil },
		Lease: 10 * heartbeat, Heartbeat: heartbeat,
		Logger: slog.New(slog.DiscardHandler),
	})
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := s.InTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			<-renewWaits.ch // the heartbeat ticked and its renewal waits for us
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		if err != nil {
			t.Errorf("InTx: %v", err)
		}
	}))
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "key-renewal-superseded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)

	if rec.Code != http.StatusCreated {
		t.Fatalf("POST = %d %s, want 201", rec.Code, rec.Body)
	}
	if err := <-renewals.errs; !errors.Is(err, context.Canceled) {
		t.Errorf("the renewal queued behind InTx ended with %v, want it called off (context.Canceled) when the completion began", err)
	}
}

// renewRecorder is the store, with the outcome of every renewal sent to errs.
type renewRecorder struct {
	idemstore.Store
	errs chan error
}

func (r *renewRecorder) RecordRenew(ctx context.Context, p *idemstore.RenewParams) (time.Time, error) {
	end, err := r.Store.RecordRenew(ctx, p)
	r.errs <- err
	return end, err
}

// TestInTxRefusesTheCompletionOfALostClaim is the safety argument of claims committed
// without an fsync (doc.go, "Durable claims"): when a crash loses the claim, the
// holder's fenced completion finds nothing, its writes roll back and it answers 503;
// the client's retry then executes once.
func TestInTxRefusesTheCompletionOfALostClaim(t *testing.T) {
	t.Parallel()
	app := newChargeApp(t)
	const key = "key-claim-lost"
	held := app.gates.Add("held")
	heldDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { heldDone <- app.post(key, "held") }()
	<-held.Entered // "held" holds the key and has not begun its transaction

	// The host crashed and came back without the claim: its commit had not been synced.
	if _, err := app.store.DB().Exec(`DELETE FROM idem_records`); err != nil {
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
	retry := app.post(key, "retry")
	if retry.Code != http.StatusCreated {
		t.Fatalf("retry = %d %s, want 201", retry.Code, retry.Body)
	}
	if names := app.charges(t); len(names) != 1 || names[0] != "retry" {
		t.Fatalf("charges = %q, want exactly the retry's", names)
	}
}

// Claims go through a connection of their own with synchronous=NORMAL; everything
// else keeps FULL (unless Config.SynchronousClaim, which keeps claims FULL too).
func TestClaimsCommitWithoutFsyncOnTheirOwnConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  sqlite.Config
		want int // PRAGMA synchronous: 1 NORMAL, 2 FULL
	}{{sqlite.Config{}, 1}, {sqlite.Config{SynchronousClaim: true}, 2}} {
		s, _ := openStore(t, tc.cfg)
		if got := sqlite.ClaimSynchronous(t, s); got != tc.want {
			t.Errorf("SynchronousClaim=%v: the claims' synchronous = %d, want %d", tc.cfg.SynchronousClaim, got, tc.want)
		}
		var full int
		if err := s.DB().QueryRow(`PRAGMA synchronous`).Scan(&full); err != nil || full != 2 {
			t.Errorf("the store's other connections: synchronous = %d (%v), want 2 (FULL)", full, err)
		}
	}
}
