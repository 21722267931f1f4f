package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/sqlite"
)

// claimingApp is a handler on a ClaimInHandler route that inserts a row named by the
// key inside InTx, which claims the key in the same transaction; status is what it
// answers.
type claimingApp struct {
	s       *sqlite.Store
	handler http.Handler
	runs    atomic.Int64
	status  int
}

func newClaimingApp(t *testing.T, status int) *claimingApp {
	t.Helper()
	s, _ := openStore(t, sqlite.Config{})
	if _, err := s.DB().Exec(`CREATE TABLE rows (key TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	app := &claimingApp{s: s, status: status}
	m := idem.New(idem.Config{Store: s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	app.handler = m.Route(idem.RouteOptions{ClaimInHandler: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		app.runs.Add(1)
		key := r.Header.Get("Idempotency-Key")
		_ = s.InTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO rows (key) VALUES (?)`, key); err != nil {
				return err
			}
			w.WriteHeader(app.status)
			fmt.Fprintf(w, `{"key":%q}`, key)
			return nil
		})
	}))
	return app
}

func (app *claimingApp) post(key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	app.handler.ServeHTTP(rec, req)
	return rec
}

func (app *claimingApp) rows(t *testing.T) int {
	t.Helper()
	var n int
	if err := app.s.DB().QueryRow(`SELECT count(*) FROM rows`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestClaimInHandlerCommitsTheClaimWritesAndCompletionTogether(t *testing.T) {
	t.Parallel()
	app := newClaimingApp(t, http.StatusCreated)
	first := app.post("key-together")
	if first.Code != http.StatusCreated {
		t.Fatalf("first = %d %s", first.Code, first.Body)
	}
	rec, err := app.s.RecordGet(context.Background(), &idem.RecordGetParams{Scope: "user-1", Key: "key-together"})
	if err != nil || rec.State != idem.StateCompleted || string(rec.Response.Body) != first.Body.String() {
		t.Fatalf("record = %+v, %v; want completed with the response sent", rec, err)
	}
	retry := app.post("key-together")
	if retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry = %d %s, want the replay", retry.Code, retry.Body)
	}
	if n := app.rows(t); n != 1 || app.runs.Load() != 2 {
		t.Fatalf("%d rows after %d runs, want 1 row (the retry's run deferred to the replay)", n, app.runs.Load())
	}
}

func TestClaimInHandlerDuplicatesExecuteOnce(t *testing.T) {
	t.Parallel()
	app := newClaimingApp(t, http.StatusCreated)
	var wg sync.WaitGroup
	codes := make([]int, 25)
	for i := range codes {
		wg.Go(func() { codes[i] = app.post("key-storm").Code })
	}
	wg.Wait()
	for _, c := range codes {
		if c != http.StatusCreated && c != http.StatusConflict {
			t.Fatalf("status %d among %v", c, codes)
		}
	}
	if n := app.rows(t); n != 1 {
		t.Fatalf("%d rows, want 1 (codes %v)", n, codes)
	}
}

// A response that releases the key (SPEC §6) commits the writes but no claim.
func TestClaimInHandlerReleasingResponseLeavesNoRecord(t *testing.T) {
	t.Parallel()
	app := newClaimingApp(t, http.StatusConflict)
	if got := app.post("key-released"); got.Code != http.StatusConflict {
		t.Fatalf("POST = %d %s", got.Code, got.Body)
	}
	_, err := app.s.RecordGet(context.Background(), &idem.RecordGetParams{Scope: "user-1", Key: "key-released"})
	if !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("RecordGet = %v, want ErrNotFound", err)
	}
}
