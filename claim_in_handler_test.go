package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
)

// The misuses of the SPEC §7 helpers that the root package refuses, whatever the store.
// The helpers' own behaviour (Respond's one transaction, its fallback, InTx) is tested
// with real transactions in store/sqlite and store/postgres.

func TestTxHandleRefusesAContextWithoutTheRequestsHandle(t *testing.T) {
	t.Parallel()
	if h, err := idem.TxHandle(context.Background()); h != nil || !errors.Is(err, idem.ErrNoHandle) {
		t.Fatalf("TxHandle(Background) = %v, %v; want ErrNoHandle", h, err)
	}
	if h, err := idem.TxHandle(idem.WithoutKey(context.Background())); h != nil || err != nil {
		t.Fatalf("TxHandle(WithoutKey) = %v, %v; want no handle and no error: a plain transaction", h, err)
	}
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, err := idem.TxHandle(r.Context()); h == nil || err != nil || h != idem.FromContext(r.Context()) {
			t.Errorf("TxHandle(request) = %v, %v; want the request's handle", h, err)
		}
		// A transaction of the handler's own that must not complete the record.
		if h, err := idem.TxHandle(idem.WithoutKey(r.Context())); h != nil || err != nil {
			t.Errorf("TxHandle(WithoutKey(request)) = %v, %v; want a plain transaction", h, err)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	serve(mw, req("POST", "/x", key, "{}"))
}

func TestTheMiddlewareMarksRequestsWithoutAKeyWithoutKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	got := map[string]error{}
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := idem.TxHandle(r.Context())
		got[r.Method] = err
	}))
	serve(mw, req("DELETE", "/x", "", "")) // a key is optional for DELETE
	serve(mw, req("GET", "/x", "", ""))    // safe: no transaction of its own expected
	if err := got["DELETE"]; err != nil {
		t.Errorf("DELETE without a key: TxHandle = %v, want a plain transaction (WithoutKey)", err)
	}
	if err := got["GET"]; !errors.Is(err, idem.ErrNoHandle) {
		t.Errorf("GET: TxHandle = %v, want ErrNoHandle (safe methods are not marked)", err)
	}
}

// The natural order with a lease helper: the writes in the transaction, the response
// after it. The transaction is refused (nothing commits), the client gets 500
// internal_error, nothing is stored, the mistake is logged, and the retry executes.
func TestATransactionBeforeTheResponseIsWrittenFailsLoudly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var runs atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		err := inTx(r.Context(), b.store, nil, func() error { return nil }) // the INSERT
		if !errors.Is(err, idem.ErrNoResponse) {
			t.Errorf("inTx = %v, want ErrNoResponse", err)
		}
		w.WriteHeader(http.StatusCreated) // too late
		if _, err := io.WriteString(w, `{"id":"ch_1"}`); err == nil {
			t.Error("a write after the refused transaction succeeded")
		}
	}))
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), http.StatusInternalServerError, idem.CodeInternalError)
	if b.store.completes.Load() != 0 || b.store.releases.Load() != 1 {
		t.Fatalf("%d completions, %d releases; want the key released, nothing stored", b.store.completes.Load(), b.store.releases.Load())
	}
	if !strings.Contains(b.logs.String(), "none was written yet") {
		t.Fatalf("no log line names the mistake:\n%s", b.logs)
	}
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), http.StatusInternalServerError, idem.CodeInternalError)
	if runs.Load() != 2 {
		t.Fatalf("%d runs, want 2: the retry executes afresh", runs.Load())
	}
}

// A write after the transaction committed the response is refused, and logged; the
// client gets the response the transaction stored.
func TestAWriteAfterTheCompletingTransactionIsRefusedAndLogged(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := inTx(r.Context(), b.store, nil, func() error {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ch_1"}`)
			return nil
		})
		if err != nil {
			t.Errorf("inTx: %v", err)
		}
		if _, err := io.WriteString(w, "\n"); err == nil {
			t.Error("a write after the completion succeeded")
		}
	}))
	w := serve(mw, req("POST", "/x", key, "{}"))
	replay := serve(mw, req("POST", "/x", key, "{}"))
	if w.Code != http.StatusCreated || w.Body.String() != `{"id":"ch_1"}` || replay.Body.String() != w.Body.String() {
		t.Fatalf("answer %d %q, replay %q; want the stored response both times", w.Code, w.Body, replay.Body)
	}
	if !strings.Contains(b.logs.String(), "wrote after its transaction had fixed the response") {
		t.Fatalf("the refused write was not logged:\n%s", b.logs)
	}
}

func claimInHandler(b *bundle, h http.HandlerFunc) http.Handler {
	return b.mw.Route(idem.RouteOptions{ClaimInHandler: true})(h)
}

// A ClaimInHandler route's handler that answers without a transaction: a response
// that releases the key is sent and recorded nowhere; one to store is stored once the
// key is claimed, after the handler; nothing at all is 500, never stored.
func TestClaimInHandlerAnswersWithoutATransaction(t *testing.T) {
	t.Parallel()
	t.Run("released", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		h := claimInHandler(b, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusConflict) })
		if w := serve(h, req("POST", "/x", key, "{}")); w.Code != http.StatusConflict || b.store.claims.Load() != 0 {
			t.Fatalf("answer %d after %d claims, want the 409 and no claim", w.Code, b.store.claims.Load())
		}
	})
	t.Run("stored after the handler", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		var runs atomic.Int64
		h := claimInHandler(b, func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusPaymentRequired)
			_, _ = io.WriteString(w, `{"declined":true}`)
		})
		first, second := serve(h, req("POST", "/x", key, "{}")), serve(h, req("POST", "/x", key, "{}"))
		if first.Code != http.StatusPaymentRequired || second.Header().Get("Idempotent-Replayed") != "true" ||
			second.Body.String() != first.Body.String() {
			t.Fatalf("first %d %s, second %d %s %v; want the 402 stored and replayed", first.Code, first.Body, second.Code, second.Body, second.Header())
		}
		// The second run answered, then its claim found the first one's record.
		if runs.Load() != 2 || b.store.completes.Load() != 1 {
			t.Fatalf("%d runs, %d completions", runs.Load(), b.store.completes.Load())
		}
	})
	t.Run("nothing written", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		h := claimInHandler(b, func(w http.ResponseWriter, r *http.Request) {})
		wantCode(t, serve(h, req("POST", "/x", key, "{}")), http.StatusInternalServerError, idem.CodeInternalError)
		if b.store.claims.Load() != 0 || !strings.Contains(b.logs.String(), "returned without a response") {
			t.Fatalf("%d claims; logs:\n%s", b.store.claims.Load(), b.logs)
		}
	})
}

// A lease helper on a ClaimInHandler route claims the key first; when the key is
// completed already the middleware replays it and the helper returns ErrAnswered, and
// whatever the handler writes then is discarded without a word.
func TestAcquireForTxOnAClaimInHandlerRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var runs atomic.Int64
	h := claimInHandler(b, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if err := idem.FromContext(r.Context()).AcquireForTx(r.Context()); err != nil {
			if !errors.Is(err, idem.ErrAnswered) {
				t.Errorf("AcquireForTx = %v, want nil or ErrAnswered", err)
			}
			http.Error(w, "oops", http.StatusInternalServerError) // discarded
			return
		}
		err := inTx(r.Context(), b.store, nil, func() error {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"id":"ord_1"}`)
			return nil
		})
		if err != nil {
			t.Errorf("inTx: %v", err)
		}
	})
	first, second := serve(h, req("POST", "/x", key, "{}")), serve(h, req("POST", "/x", key, "{}"))
	if first.Code != http.StatusCreated || second.Code != http.StatusCreated || second.Body.String() != `{"id":"ord_1"}` ||
		second.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s, second %d %s; want the 201 then its replay", first.Code, first.Body, second.Code, second.Body)
	}
	if runs.Load() != 2 || b.store.claims.Load() != 2 || strings.Contains(b.logs.String(), "wrote after") {
		t.Fatalf("%d runs, %d claims; logs:\n%s", runs.Load(), b.store.claims.Load(), b.logs)
	}
}
