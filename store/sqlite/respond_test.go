package sqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/sqlite"
)

// rowApp is a handler that inserts a row named by the key through Respond and answers
// status with the key, behind the middleware (with logs kept and an injected clock),
// on a route that claims in the handler (the README's path) or not (the lease path).
// A row the key wrote before (its record is gone) is the handler's to answer: 409.
type rowApp struct {
	s       *sqlite.Store
	handler http.Handler
	runs    atomic.Int64
	status  int
	logs    *bytes.Buffer
	clock   *testkit.Clock
}

func newRowApp(t *testing.T, claimInHandler bool, wrap func(app *rowApp, h http.HandlerFunc) http.HandlerFunc) *rowApp {
	t.Helper()
	s, _ := openStore(t, sqlite.Config{})
	if _, err := s.DB().Exec(`CREATE TABLE rows (key TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	app := &rowApp{s: s, status: http.StatusCreated, logs: &bytes.Buffer{}, clock: testkit.NewClock(time.Now().UTC().Truncate(time.Millisecond))}
	m := idem.New(idem.Config{
		Store:  s,
		Scope:  func(*http.Request) (string, error) { return "user-1", nil },
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: app.logs}, nil)),
		Clock:  app.clock.Now,
	})
	h := http.HandlerFunc(app.insertRow)
	if wrap != nil {
		h = wrap(app, h)
	}
	app.handler = m.Route(idem.RouteOptions{ClaimInHandler: claimInHandler})(h)
	return app
}

func (app *rowApp) insertRow(w http.ResponseWriter, r *http.Request) {
	app.runs.Add(1)
	key := r.Header.Get("Idempotency-Key")
	err := app.s.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO rows (key) VALUES (?)`, key); err != nil {
			return nil, err
		}
		return idem.JSONResponse(app.status, map[string]string{"key": key})
	})
	switch {
	case err == nil:
	case strings.Contains(err.Error(), "UNIQUE"):
		http.Error(w, `{"exists":true}`, http.StatusConflict)
	default:
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// lockedWriter serialises the writes of concurrent requests' log lines.
type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (app *rowApp) post(key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	app.handler.ServeHTTP(rec, req)
	return rec
}

func (app *rowApp) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := app.s.DB().QueryRow(`SELECT count(*) FROM rows`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (app *rowApp) record(key string) (*idemstore.Record, error) {
	return app.s.RecordGet(context.Background(), &idemstore.GetParams{Scope: "user-1", Key: key, Now: app.clock.Now()})
}

func bothRoutes(t *testing.T, test func(t *testing.T, claimInHandler bool)) {
	for _, inHandler := range []bool{true, false} {
		t.Run(fmt.Sprintf("claimInHandler=%v", inHandler), func(t *testing.T) {
			t.Parallel()
			test(t, inHandler)
		})
	}
}

func TestRespondCommitsTheRowAndTheRecordTogether(t *testing.T) {
	t.Parallel()
	bothRoutes(t, func(t *testing.T, inHandler bool) {
		app := newRowApp(t, inHandler, nil)
		first := app.post("key-together")
		if first.Code != http.StatusCreated || first.Body.String() != `{"key":"key-together"}` {
			t.Fatalf("first = %d %s", first.Code, first.Body)
		}
		rec, err := app.record("key-together")
		if err != nil || rec.State != idemstore.StateCompleted || string(rec.Response.Body) != first.Body.String() {
			t.Fatalf("record = %+v, %v; want completed with the response sent", rec, err)
		}
		retry := app.post("key-together")
		if retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() || retry.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry = %d %s, want the replay", retry.Code, retry.Body)
		}
		if n := app.rows(t); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
}

func TestRespondDuplicatesExecuteOnce(t *testing.T) {
	t.Parallel()
	bothRoutes(t, func(t *testing.T, inHandler bool) {
		app := newRowApp(t, inHandler, nil)
		var wg sync.WaitGroup
		answers := make([]*httptest.ResponseRecorder, 25)
		for i := range answers {
			wg.Go(func() { answers[i] = app.post("key-storm") })
		}
		wg.Wait()
		for _, a := range answers {
			if a.Code != http.StatusCreated && !(a.Code == http.StatusConflict && strings.Contains(a.Body.String(), "request_in_progress")) {
				t.Fatalf("answer %d %s, want 201 or 409 request_in_progress", a.Code, a.Body)
			}
		}
		if n := app.rows(t); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
}

// A response that releases the key (SPEC §6) commits the writes but no record.
func TestRespondReleasingResponseLeavesNoRecord(t *testing.T) {
	t.Parallel()
	bothRoutes(t, func(t *testing.T, inHandler bool) {
		app := newRowApp(t, inHandler, nil)
		app.status = http.StatusConflict
		if got := app.post("key-released"); got.Code != http.StatusConflict {
			t.Fatalf("POST = %d %s", got.Code, got.Body)
		}
		if _, err := app.record("key-released"); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("RecordGet = %v, want ErrNotFound", err)
		}
		if n := app.rows(t); n != 1 {
			t.Fatalf("%d rows, want the write committed", n)
		}
	})
}

// fn's error commits nothing; the handler's own answer goes through the middleware.
func TestRespondReturnsFnsErrorForTheHandlerToAnswer(t *testing.T) {
	t.Parallel()
	bothRoutes(t, func(t *testing.T, inHandler bool) {
		app := newRowApp(t, inHandler, nil)
		if _, err := app.s.DB().Exec(`INSERT INTO rows (key) VALUES ('key-conflict')`); err != nil {
			t.Fatal(err)
		}
		if got := app.post("key-conflict"); got.Code != http.StatusConflict || !strings.Contains(got.Body.String(), "exists") {
			t.Fatalf("POST = %d %s, want the handler's 409", got.Code, got.Body)
		}
		if _, err := app.record("key-conflict"); !errors.Is(err, idemstore.ErrNotFound) {
			t.Fatalf("RecordGet = %v, want no record", err)
		}
	})
}

// An expired record is claimed afresh and fn runs once more under the lease.
func TestRespondClaimsAnExpiredKeyAfresh(t *testing.T) {
	t.Parallel()
	app := newRowApp(t, true, nil)
	if got := app.post("key-expiring"); got.Code != http.StatusCreated {
		t.Fatalf("first = %d %s", got.Code, got.Body)
	}
	if _, err := app.s.DB().Exec(`DELETE FROM rows`); err != nil {
		t.Fatal(err)
	}
	app.clock.Advance(idem.DefaultTTL + time.Minute)
	if got := app.post("key-expiring"); got.Code != http.StatusCreated || got.Header().Get("Idempotent-Replayed") != "" {
		t.Fatalf("after expiry = %d %s %v, want a new execution", got.Code, got.Body, got.Header())
	}
	if n := app.rows(t); n != 1 {
		t.Fatalf("%d rows, want the new one", n)
	}
}

// A write after Respond answered fails and is logged; the client gets the stored
// response.
func TestRespondRefusesAWriteAfterItAnswered(t *testing.T) {
	t.Parallel()
	bothRoutes(t, func(t *testing.T, inHandler bool) {
		app := newRowApp(t, inHandler, func(app *rowApp, h http.HandlerFunc) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				h(w, r)
				w.WriteHeader(http.StatusOK)
				if _, err := w.Write([]byte("more")); err == nil {
					t.Error("a write after Respond answered succeeded")
				}
			}
		})
		got, replay := app.post("key-late"), app.post("key-late")
		if got.Code != http.StatusCreated || got.Body.String() != `{"key":"key-late"}` || replay.Body.String() != got.Body.String() {
			t.Fatalf("answer %d %q, replay %q; want the stored 201 both times", got.Code, got.Body, replay.Body)
		}
		if !strings.Contains(app.logs.String(), "wrote after its transaction had fixed the response") {
			t.Fatalf("the refused write was not logged:\n%s", app.logs)
		}
	})
}

// A framework that writes the status line once the handler returned, whatever the
// handler wrote (gin's WriteHeaderNow: WriteHeader(200) when its own writer saw no
// write, as Respond writes to the middleware's capture beneath it), is not a late
// write: nothing is logged, and the client gets Respond's response (issue 19 item 5:
// gin + Respond logged an ERROR on every new key).
func TestRespondIgnoresAFrameworksStatusLineAfterTheHandler(t *testing.T) {
	t.Parallel()
	bothRoutes(t, func(t *testing.T, inHandler bool) {
		app := newRowApp(t, inHandler, func(app *rowApp, h http.HandlerFunc) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				h(w, r)
				w.WriteHeader(http.StatusOK) // gin's WriteHeaderNow
			}
		})
		got, replay := app.post("key-ginx"), app.post("key-ginx")
		if got.Code != http.StatusCreated || got.Body.String() != `{"key":"key-ginx"}` || replay.Body.String() != got.Body.String() {
			t.Fatalf("answer %d %q, replay %q; want the stored 201 both times", got.Code, got.Body, replay.Body)
		}
		if strings.Contains(app.logs.String(), "level=ERROR") {
			t.Fatalf("an error was logged for a status line written after the handler:\n%s", app.logs)
		}
	})
}

func TestRespondWithoutTheMiddlewareNeedsWithoutKey(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{})
	if _, err := s.DB().Exec(`CREATE TABLE rows (key TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var got error
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = s.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idemstore.Response, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO rows (key) VALUES ('unkeyed')`)
			return &idemstore.Response{Status: http.StatusCreated}, err
		})
	})
	count := func() (n int) { _ = s.DB().QueryRow(`SELECT count(*) FROM rows`).Scan(&n); return n }
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", nil))
	if !errors.Is(got, idem.ErrNoHandle) || count() != 0 {
		t.Fatalf("Respond without the middleware = %v, %d rows; want ErrNoHandle and nothing written", got, count())
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil).WithContext(idem.WithoutKey(context.Background())))
	if got != nil || rec.Code != http.StatusCreated || count() != 1 {
		t.Fatalf("Respond marked WithoutKey = %v, %d, %d rows; want a plain transaction and its 201", got, rec.Code, count())
	}
}

// The natural order with InTx (the lease path's helper): the INSERT inside, the 201
// after. Nothing commits; the client gets 500 internal_error, nothing is stored, the
// mistake is logged; a context other than the request's is refused outright.
func TestInTxMisusesFailLoudly(t *testing.T) {
	t.Parallel()
	t.Run("response written after the transaction", func(t *testing.T) {
		t.Parallel()
		app := newRowApp(t, false, func(app *rowApp, _ http.HandlerFunc) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				err := app.s.InTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO rows (key) VALUES (?)`, r.Header.Get("Idempotency-Key"))
					return err
				})
				if !errors.Is(err, idem.ErrNoResponse) {
					t.Errorf("InTx = %v, want ErrNoResponse", err)
				}
				w.WriteHeader(http.StatusCreated)
			}
		})
		got := app.post("key-natural-order")
		if got.Code != http.StatusInternalServerError || !strings.Contains(got.Body.String(), idem.CodeInternalError) {
			t.Fatalf("answer = %d %s, want 500 internal_error", got.Code, got.Body)
		}
		if _, err := app.record("key-natural-order"); !errors.Is(err, idemstore.ErrNotFound) || app.rows(t) != 0 {
			t.Fatalf("RecordGet = %v, %d rows; want nothing stored and nothing committed", err, app.rows(t))
		}
		if !strings.Contains(app.logs.String(), "none was written yet") {
			t.Fatalf("the mistake was not logged:\n%s", app.logs)
		}
	})
	t.Run("a context without the request's handle", func(t *testing.T) {
		t.Parallel()
		app := newRowApp(t, false, func(app *rowApp, _ http.HandlerFunc) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				err := app.s.InTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
					t.Error("fn ran")
					return nil
				})
				if !errors.Is(err, idem.ErrNoHandle) {
					t.Errorf("InTx = %v, want ErrNoHandle", err)
				}
				http.Error(w, "no", http.StatusInternalServerError)
			}
		})
		if got := app.post("key-wrong-ctx"); got.Code != http.StatusInternalServerError {
			t.Fatalf("answer = %d %s", got.Code, got.Body)
		}
	})
}
