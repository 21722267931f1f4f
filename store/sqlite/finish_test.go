package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/sqlite"
)

// idem.Finish over this store's InTx, at the edges the configuration matrix does not
// reach: a request without a key on a route where it is optional gets the response
// after COMMIT; a context the application marked WithoutKey is refused before anything
// runs; a handler that wrote before Finish, and a function that fails, commit nothing
// and leave the answer to the handler.
func TestFinishDeliversItsResponseOrCommitsNothing(t *testing.T) {
	t.Parallel()
	s, _ := openStore(t, sqlite.Config{})
	if _, err := s.DB().Exec(`CREATE TABLE charges (name TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		var n int
		if err := s.DB().QueryRow(`SELECT count(*) FROM charges`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	errBoom := errors.New("boom")
	finish := func(ctx context.Context, name string, fail bool) error {
		return idem.Finish(ctx, s.InTx, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO charges (name) VALUES (?)`, name); err != nil {
				return nil, err
			}
			if fail {
				return nil, errBoom
			}
			return idem.JSONResponse(http.StatusCreated, map[string]string{"name": name})
		})
	}
	mw := idem.New(idem.Config{Store: s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	h := mw.Route(idem.RouteOptions{Requirement: idem.KeyOptional})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.Header.Get("X-Name")
		if name == "early" {
			w.WriteHeader(http.StatusAccepted) // the mistake: an answer before Finish
		}
		if err := finish(r.Context(), name, name == "failing"); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	}))
	post := func(key, name string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
		req.Header.Set("X-Name", name)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	if rec := post("", "keyless"); rec.Code != http.StatusCreated || rec.Body.String() != `{"name":"keyless"}` || count() != 1 {
		t.Fatalf("without a key: %d %s, %d charges; want the 201 after one charge", rec.Code, rec.Body, count())
	}
	if rec := post("key-finish-failing", "failing"); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "boom") || count() != 1 {
		t.Fatalf("a failing function: %d %s, %d charges; want the handler's 503 and nothing committed", rec.Code, rec.Body, count())
	}
	if rec := post("key-finish-early", "early"); rec.Code == http.StatusCreated || count() != 1 {
		t.Fatalf("an answer before Finish: %d %s, %d charges; want no 201 and nothing committed", rec.Code, rec.Body, count())
	}
	ran := false
	err := idem.Finish(idem.WithoutKey(t.Context()), s.InTx, func(context.Context, *sql.Tx) (*idem.Response, error) {
		ran = true
		return &idem.Response{Status: http.StatusOK}, nil
	})
	if err == nil || ran || !strings.Contains(err.Error(), "idem.WithoutKey") {
		t.Fatalf("Finish on a context marked WithoutKey: %v (ran %v), want it refused before running", err, ran)
	}
	if err := finish(t.Context(), "nowhere", false); !errors.Is(err, idem.ErrNoHandle) || count() != 1 {
		t.Fatalf("Finish without an operation: %v, want ErrNoHandle and nothing committed", err)
	}
}
