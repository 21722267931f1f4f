package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

var errCommit = errors.New("commit failed: 40001")

// inTx plays the SPEC §7 helper of a SQL store over the in-memory store: it runs fn
// (the application's writes), then the fenced completion "in the same transaction",
// and tells the handle how the transaction ended. commitErr makes COMMIT fail, which
// rolls the completion back: it is then not applied.
func inTx(ctx context.Context, st idemstore.Store, commitErr error, fn func() error) error {
	if err := fn(); err != nil {
		return err
	}
	h := idem.FromContext(ctx)
	if h == nil {
		return commitErr
	}
	p, err := h.PrepareCompletion()
	if err != nil {
		return err
	}
	if p == nil {
		return commitErr
	}
	if commitErr != nil {
		h.CompletionFailed(commitErr)
		return commitErr
	}
	if err := st.RecordComplete(ctx, p); err != nil {
		h.CompletionFailed(err)
		return err
	}
	h.Completed()
	return nil
}

func TestTransactionCompletionSendsTheCapturedResponse(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		err := inTx(r.Context(), b.store, nil, func() error {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			io.WriteString(w, `{"id":"ch_1"}`)
			return nil
		})
		if err != nil {
			t.Errorf("inTx: %v", err)
		}
		if b.ticker.TryTick() {
			t.Error("the heartbeat still runs after PrepareCompletion")
		}
	}))
	first := serve(mw, req("POST", "/x", key, "{}"))
	if first.Code != 201 || first.Body.String() != `{"id":"ch_1"}` {
		t.Errorf("first: %d %s", first.Code, first.Body)
	}
	if b.store.completes.Load() != 1 || b.store.releases.Load() != 0 {
		t.Errorf("%d completions, %d releases: the middleware must not touch a record completed in the transaction",
			b.store.completes.Load(), b.store.releases.Load())
	}
	second := serve(mw, req("POST", "/x", key, "{}"))
	if second.Code != 201 || second.Body.String() != `{"id":"ch_1"}` || n.Load() != 1 {
		t.Errorf("replay: %d %s after %d executions", second.Code, second.Body, n.Load())
	}
}

func TestFailedCommitAnswers503AndTheRetryExecutes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		commitErr := errCommit
		if n.Add(1) > 1 {
			commitErr = nil
		}
		err := inTx(r.Context(), b.store, commitErr, func() error {
			w.WriteHeader(201)
			io.WriteString(w, "charged")
			return nil
		})
		if err != nil {
			// A real handler would write an error here; the middleware must still
			// answer 503, never a response whose effects did not commit.
			w.WriteHeader(500)
		}
	}))
	first := serve(mw, req("POST", "/x", key, "{}"))
	wantCode(t, first, 503, idem.CodeStoreUnavailable)
	if first.Header().Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	second := serve(mw, req("POST", "/x", key, "{}"))
	if second.Code != 201 || second.Body.String() != "charged" || n.Load() != 2 {
		t.Errorf("retry: %d %q after %d executions, want a fresh execution", second.Code, second.Body, n.Load())
	}
}

func TestTakenOverCompletionAnswers503AndTheRetryGetsTheWinner(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n atomic.Int64
	var mw http.Handler
	mw = b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 2 {
			w.WriteHeader(202)
			io.WriteString(w, "winner")
			return
		}
		err := inTx(r.Context(), b.store, nil, func() error {
			// While this transaction is open the lease lapses and another request
			// takes the key over and completes it.
			b.clock.Advance(31 * time.Second)
			serve(mw, req("POST", "/x", key, "{}"))
			w.WriteHeader(201)
			return nil
		})
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("inTx: %v, want ErrLeaseLost", err)
		}
	}))
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), 503, idem.CodeStoreUnavailable)
	w := serve(mw, req("POST", "/x", key, "{}"))
	if w.Code != 202 || w.Body.String() != "winner" || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: %d %q, want the winner's replay", w.Code, w.Body)
	}
}

func TestWritesAfterTheCompletingTransactionAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = inTx(r.Context(), b.store, nil, func() error {
			w.WriteHeader(201)
			io.WriteString(w, "stored")
			return nil
		})
		if _, err := io.WriteString(w, " and more"); !errors.Is(err, idem.ErrCaptureFrozen) {
			t.Errorf("write after completion: %v", err)
		}
	}))
	first := serve(mw, req("POST", "/x", key, "{}"))
	second := serve(mw, req("POST", "/x", key, "{}"))
	if first.Body.String() != "stored" || second.Body.String() != "stored" {
		t.Errorf("client got %q, replay %q; both must be the stored response", first.Body, second.Body)
	}
}

func TestTransactionWithReleasingStatusReleasesTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_ = inTx(r.Context(), b.store, nil, func() error {
			w.WriteHeader(422)
			return nil
		})
	}))
	serve(mw, req("POST", "/x", key, "{}"))
	serve(mw, req("POST", "/x", key, "{}"))
	if n.Load() != 2 || b.store.completes.Load() != 0 {
		t.Errorf("%d executions, %d completions; want the 422 released", n.Load(), b.store.completes.Load())
	}
}

func TestPanicAfterTheCompletingTransactionKeepsTheRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_ = inTx(r.Context(), b.store, nil, func() error {
			w.WriteHeader(201)
			return nil
		})
		panic(http.ErrAbortHandler)
	}))
	func() {
		defer func() { recover() }()
		serve(mw, req("POST", "/x", key, "{}"))
	}()
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 201 || n.Load() != 1 {
		t.Errorf("retry: %d after %d executions, want the replay", w.Code, n.Load())
	}
}

func TestPrepareCompletionIsOneShot(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		h := idem.FromContext(r.Context())
		if p, err := h.PrepareCompletion(); p == nil || err != nil {
			t.Errorf("first PrepareCompletion of a 201 = %v, %v; want the completion", p, err)
		}
		if p, err := h.PrepareCompletion(); p != nil || err != nil {
			t.Errorf("second PrepareCompletion = %v, %v; a second transaction must commit as a plain one", p, err)
		}
		h.CompletionFailed(errCommit)
	}))
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), 503, idem.CodeStoreUnavailable)
}
