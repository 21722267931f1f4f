package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/postgres"
)

// batchHandler inserts a row named by the key into table through InTxBatch, having
// written the 201 that the insert produces. A unique violation (the key wrote a row
// before) falls back, after Reopen, to a plain InTx that answers 200 "exists".
func batchHandler(s *postgres.Store, table string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%q}`, key)
		err := s.InTxBatch(r.Context(), func(b *pgx.Batch) {
			b.Queue(`INSERT INTO `+table+` (key) VALUES ($1)`, key)
		})
		h := idem.FromContext(r.Context())
		switch {
		case err == nil, errors.Is(err, idem.ErrClaimDeferred), errors.Is(err, idem.ErrKeyInProgress):
		case strings.Contains(err.Error(), "23505") && h != nil && h.Reopen():
			_ = s.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
				w.WriteHeader(http.StatusOK)
				fmt.Fprint(w, `{"exists":true}`)
				return nil
			})
		}
	})
}

// batchApp is the middleware in front of batchHandler, on a route that claims in the
// handler or not.
func batchApp(t *testing.T, s schemaStore, claimInHandler bool) (http.Handler, string) {
	t.Helper()
	table := s.table("rows")
	if _, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	m := idem.New(idem.Config{Store: s.Store, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	return m.Route(idem.RouteOptions{ClaimInHandler: claimInHandler})(batchHandler(s.Store, table)), table
}

func postKey(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func countRows(t *testing.T, s schemaStore, table string) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInTxBatchCommitsTheRowAndTheRecordTogether(t *testing.T) {
	t.Parallel()
	for _, inHandler := range []bool{false, true} {
		t.Run(fmt.Sprintf("claimInHandler=%v", inHandler), func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			h, table := batchApp(t, s, inHandler)
			first := postKey(h, "key-together")
			if first.Code != http.StatusCreated {
				t.Fatalf("first = %d %s", first.Code, first.Body)
			}
			retry := postKey(h, "key-together")
			if retry.Code != http.StatusCreated || retry.Body.String() != first.Body.String() || retry.Header().Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry = %d %s (replayed %q), want the first response replayed", retry.Code, retry.Body, retry.Header().Get("Idempotent-Replayed"))
			}
			if n := countRows(t, s, table); n != 1 {
				t.Fatalf("%d rows, want 1", n)
			}
		})
	}
}

// TestInTxBatchReopensAfterAConflict: a row the key wrote before (its record was lost)
// makes the pipelined transaction fail; nothing commits, and the handler answers
// otherwise through InTx, whose completion stores that answer.
func TestInTxBatchReopensAfterAConflict(t *testing.T) {
	t.Parallel()
	for _, inHandler := range []bool{false, true} {
		t.Run(fmt.Sprintf("claimInHandler=%v", inHandler), func(t *testing.T) {
			t.Parallel()
			s := newStore(t)
			h, table := batchApp(t, s, inHandler)
			if _, err := s.Pool().Exec(t.Context(), `INSERT INTO `+table+` (key) VALUES ('key-conflict')`); err != nil {
				t.Fatal(err)
			}
			got := postKey(h, "key-conflict")
			if got.Code != http.StatusOK || got.Body.String() != `{"exists":true}` {
				t.Fatalf("POST = %d %s, want the fallback's 200", got.Code, got.Body)
			}
			rec, err := s.RecordGet(t.Context(), &idem.RecordGetParams{Scope: "user-1", Key: "key-conflict"})
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != idem.StateCompleted || rec.Response.Status != http.StatusOK || string(rec.Response.Body) != `{"exists":true}` {
				t.Fatalf("record = %s %d %s, want completed with the fallback's answer", rec.State, rec.Response.Status, rec.Response.Body)
			}
		})
	}
}

// TestClaimInHandlerDuplicatesExecuteOnce: 25 concurrent requests with one key write
// one row; every other answer is its replay or 409 request_in_progress.
func TestClaimInHandlerDuplicatesExecuteOnce(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	h, table := batchApp(t, s, true)
	const n = 25
	codes := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			codes[i] = postKey(h, "key-storm")
		})
	}
	close(start)
	wg.Wait()
	created := 0
	for _, rec := range codes {
		switch {
		case rec.Code == http.StatusCreated:
			created++
		case rec.Code == http.StatusConflict && strings.Contains(rec.Body.String(), "request_in_progress"):
		default:
			t.Errorf("answer %d %s, want 201 or 409 request_in_progress", rec.Code, rec.Body)
		}
	}
	if rows := countRows(t, s, table); rows != 1 || created == 0 {
		t.Fatalf("%d rows and %d answers 201, want 1 row", rows, created)
	}
}

// TestClaimInHandlerDuplicateOfAnUncommittedClaimIs409: a duplicate that finds the
// first request's claim uncommitted waits at most the lock timeout and answers 409
// request_in_progress; once the first commits, it is replayed.
func TestClaimInHandlerDuplicateOfAnUncommittedClaimIs409(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	h, table := batchApp(t, s, true)
	// The first request's transaction, held open: its record is inserted, uncommitted.
	tx, err := s.Pool().Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	same := httptest.NewRequest(http.MethodPost, "/rows", strings.NewReader(`{}`))
	same.Header.Set("Content-Type", "application/json")
	fp := idem.FingerprintRequest(same, []byte(`{}`))
	_, err = tx.Exec(t.Context(), `INSERT INTO `+s.table("idem_records")+`
		(scope, key, id, fingerprint_version, fingerprint, state, response_status, response_headers, response_body, created_at, expires_at)
		VALUES ('user-1', 'key-held', 'rec-1', $1, $2, 'completed', 201, ''::bytea, '{"key":"key-held"}', now(), now() + interval '1 hour')`,
		fp.Version, fp.Sum[:])
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	dup := postKey(h, "key-held")
	took := time.Since(began)
	if dup.Code != http.StatusConflict || !strings.Contains(dup.Body.String(), "request_in_progress") || dup.Header().Get("Retry-After") == "" {
		t.Fatalf("duplicate = %d %s, want 409 request_in_progress with Retry-After", dup.Code, dup.Body)
	}
	if took > postgres.DefaultClaimLockTimeout+2*time.Second {
		t.Errorf("the duplicate took %v, want about the lock timeout (%v)", took, postgres.DefaultClaimLockTimeout)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	after := postKey(h, "key-held")
	if after.Code != http.StatusCreated || after.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the first committed = %d %s, want its replay", after.Code, after.Body)
	}
	if rows := countRows(t, s, table); rows != 0 {
		t.Fatalf("%d rows, want none: the duplicates never executed", rows)
	}
}

// TestClaimInHandlerRequestIsOneRoundTrip counts a whole request on a ClaimInHandler
// route on the wire, and one on the lease path through InTxBatch.
func TestClaimInHandlerRequestIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	table := pgx.Identifier{b.schema, "rows"}.Sanitize()
	if _, err := b.s.Pool().Exec(b.ctx, `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	m := idem.New(idem.Config{Store: b.s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	inHandler := m.Route(idem.RouteOptions{ClaimInHandler: true})(batchHandler(b.s, table))
	lease := m.Handler(batchHandler(b.s, table))
	for i, h := range []http.Handler{inHandler, lease} { // prepares the statements
		if rec := postKey(h, fmt.Sprint("key-warm-up-", i)); rec.Code != http.StatusCreated {
			t.Fatalf("warm-up = %d %s", rec.Code, rec.Body)
		}
	}
	// pgx drops the cached statements of a failed batch: the claim that follows first
	// deallocates them, and the next request on the connection prepares them again.
	b.wantTrips("a replay on a ClaimInHandler route (the batch, ROLLBACK, DEALLOCATE, the claim)", 4, func() {
		if rec := postKey(inHandler, "key-warm-up-0"); rec.Code != http.StatusCreated {
			t.Fatalf("replay = %d %s", rec.Code, rec.Body)
		}
	})
	b.wantTrips("the next request on that connection (prepares, then the batch)", 2, func() {
		if rec := postKey(inHandler, "key-after-replay"); rec.Code != http.StatusCreated {
			t.Fatalf("POST = %d %s", rec.Code, rec.Body)
		}
	})
	b.wantTrips("a ClaimInHandler request", 1, func() {
		if rec := postKey(inHandler, "key-one-1"); rec.Code != http.StatusCreated {
			t.Fatalf("POST = %d %s", rec.Code, rec.Body)
		}
	})
	b.wantTrips("a lease-path request through InTxBatch (claim + batch)", 2, func() {
		if rec := postKey(lease, "key-two-2"); rec.Code != http.StatusCreated {
			t.Fatalf("POST = %d %s", rec.Code, rec.Body)
		}
	})
}
