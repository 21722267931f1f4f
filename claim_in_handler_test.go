package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/memory"
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
// that releases the key is sent and recorded nowhere; a response to store is a misuse
// (the handler did not commit with the key's record, so a retry runs it again), answered
// 500 and never stored, with an error naming the route; nothing at all is 500 too.
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
	t.Run("a response to store, without the helper", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		var runs atomic.Int64
		h := b.mw.Route(idem.RouteOptions{ClaimInHandler: true, Name: "charges.decline"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(http.StatusPaymentRequired)
			_, _ = io.WriteString(w, `{"declined":true}`)
		}))
		for range 2 {
			w := serve(h, req("POST", "/x", key, "{}"))
			wantCode(t, w, http.StatusInternalServerError, idem.CodeInternalError)
			if w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatal("a 500 for a misuse says it was replayed")
			}
		}
		if runs.Load() != 2 || b.store.claims.Load() != 0 || b.store.completes.Load() != 0 {
			t.Fatalf("%d runs, %d claims, %d completions; want each request refused, nothing recorded", runs.Load(), b.store.claims.Load(), b.store.completes.Load())
		}
		if !strings.Contains(b.logs.String(), "level=ERROR") || !strings.Contains(b.logs.String(), "route=charges.decline") ||
			!strings.Contains(b.logs.String(), "without the store's Respond") {
			t.Fatalf("no error naming the route and the fix:\n%s", b.logs)
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

// Issue 19's first seam, as a new user met it: a handler that writes with the
// database directly (here: counts a row) and answers 201, on a ClaimInHandler route.
// Ten concurrent duplicates and a sequential retry never get a 2xx from a second
// execution, and none says it was replayed: each is 500, nothing is stored, and an
// error names the route.
func TestClaimInHandlerWithADirectWriteNeverAnswers2xxTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var rows atomic.Int64
	h := claimInHandler(b, func(w http.ResponseWriter, r *http.Request) {
		rows.Add(1) // INSERT … through st.DB(), outside any helper
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ch_1"}`)
	})
	answers := make(chan *httptest.ResponseRecorder, 11)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { answers <- serve(h, req("POST", "/x", key, "{}")) })
	}
	wg.Wait()
	answers <- serve(h, req("POST", "/x", key, "{}"))
	close(answers)
	ok := 0
	for w := range answers {
		if w.Code/100 == 2 {
			ok++
		}
		if w.Header().Get("Idempotent-Replayed") != "" {
			t.Errorf("an answer says it was replayed: %d %s", w.Code, w.Body)
		}
	}
	if ok > 0 && rows.Load() > 1 {
		t.Fatalf("%d rows and %d answers 2xx: a second execution was answered 2xx", rows.Load(), ok)
	}
	if !strings.Contains(b.logs.String(), "ClaimInHandler") || !strings.Contains(b.logs.String(), "level=ERROR") {
		t.Fatalf("no error names the misuse:\n%s", b.logs)
	}
}

// A ClaimInHandler route reads the key before its handler only while its requests often
// find their key recorded (issue 21): a route that sees new keys goes straight to the
// handler, whose transaction claims the key (one round trip on PostgreSQL); once
// retries come often, a retry is answered from one read of the key, before the handler
// runs; when new keys come again, the reads stop. Every answer is right either way.
func TestClaimInHandlerReadsTheKeyFirstWhileRetriesAreFrequent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var runs atomic.Int64
	h := claimInHandler(b, leaseCreated(b, `{"id":"ord_1"}`, &runs))
	newKeys := func(n int, prefix string) {
		t.Helper()
		for i := range n {
			if w := serve(h, req("POST", "/x", fmt.Sprintf("%s-%04d", prefix, i), `{"a":1}`)); w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "" {
				t.Fatalf("new key %d: %d %s", i, w.Code, w.Body)
			}
		}
	}
	newKeys(20, "key-new")
	if n := b.store.gets.Load(); n != 0 {
		t.Fatalf("%d reads for new keys only, want none: their transaction claims them", n)
	}
	retries := func(n int) {
		t.Helper()
		for range n {
			w := serve(h, req("POST", "/x", "key-new-0000", `{"a":1}`))
			if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != `{"id":"ord_1"}` {
				t.Fatalf("retry: %d %s (replayed %q)", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
			}
		}
	}
	retries(12) // the route learns that retries are frequent
	runsBefore, getsBefore := runs.Load(), b.store.gets.Load()
	retries(10)
	if runs.Load() != runsBefore || b.store.gets.Load() != getsBefore+10 {
		t.Fatalf("10 retries ran the handler %d times with %d reads; want none, answered from a read each",
			runs.Load()-runsBefore, b.store.gets.Load()-getsBefore)
	}
	wantCode(t, serve(h, req("POST", "/x", "key-new-0000", `{"a":2}`)), http.StatusConflict, idem.CodeKeyReused)
	newKeys(60, "key-again") // and that they are not any more
	getsBefore = b.store.gets.Load()
	newKeys(10, "key-later")
	if n := b.store.gets.Load() - getsBefore; n != 0 {
		t.Fatalf("%d reads for new keys after the retries stopped, want none", n)
	}
}

// ClaimInHandler needs a store whose package claims in the handler's transaction; on
// any other (Redis, memory) it is refused when the route is built, naming the fix
// (issue 19 item 2: with Redis and backstop.Respond the client got 503 after the
// operation committed).
func TestClaimInHandlerIsRefusedOnAStoreWithoutTransactions(t *testing.T) {
	t.Parallel()
	m := idem.New(idem.Config{Store: memory.New(), Scope: bearerScope})
	defer func() {
		got := fmt.Sprint(recover())
		if !strings.HasPrefix(got, "idem: RouteOptions.ClaimInHandler") || !strings.Contains(got, "without ClaimInHandler") {
			t.Fatalf("panic %q, want one naming the option and the fix", got)
		}
	}()
	m.Route(idem.RouteOptions{ClaimInHandler: true})
}

// A lease helper on a ClaimInHandler route claims the key first; when the key is
// completed already (by another process: this one would have read it first) the
// middleware replays it and the helper returns ErrAnswered, and whatever the handler
// writes then is discarded without a word.
func TestAcquireForTxOnAClaimInHandlerRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	other := idem.New(idem.Config{Store: b.store, Scope: bearerScope, Clock: b.clock.Now, Logger: slog.New(slog.NewTextHandler(b.logs, nil))})
	first := serve(claimInHandler(b, handler), req("POST", "/x", key, "{}"))
	second := serve(claimInHandler(&bundle{mw: other}, handler), req("POST", "/x", key, "{}"))
	if first.Code != http.StatusCreated || second.Code != http.StatusCreated || second.Body.String() != `{"id":"ord_1"}` ||
		second.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first %d %s, second %d %s; want the 201 then its replay", first.Code, first.Body, second.Code, second.Body)
	}
	if runs.Load() != 2 || b.store.claims.Load() != 2 || strings.Contains(b.logs.String(), "wrote after") {
		t.Fatalf("%d runs, %d claims; logs:\n%s", runs.Load(), b.store.claims.Load(), b.logs)
	}
}

// A replay served from the replay cache is a request that found its key recorded: with
// ReplayCacheSize > 0, retries make a ClaimInHandler route read its keys first as they
// do without a cache (issue 28: the cache answered them before the route's rate of
// retries saw them, and after 25 retries a key completed elsewhere still ran the
// handler, with no read).
func TestCachedReplaysMakeAClaimInHandlerRouteReadItsKeysFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.ReplayCacheSize = 100 })
	var runs atomic.Int64
	h := claimInHandler(b, leaseCreated(b, `{"id":"ord_1"}`, &runs))
	if w := serve(h, req("POST", "/x", "key-cached", `{"a":1}`)); w.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", w.Code, w.Body)
	}
	for range 25 {
		if w := serve(h, req("POST", "/x", "key-cached", `{"a":1}`)); w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %s, want a replay", w.Code, w.Body)
		}
	}
	if n := b.store.gets.Load(); n != 0 {
		t.Fatalf("%d reads for retries of a cached key, want none: the cache answers them", n)
	}
	// A key completed by another process: this process's cache does not hold it.
	other := idem.New(idem.Config{Store: b.store, Scope: bearerScope, Clock: b.clock.Now})
	if w := serve(claimInHandler(&bundle{mw: other}, leaseCreated(b, `{"id":"ord_2"}`, new(atomic.Int64))), req("POST", "/x", "key-elsewhere", `{"a":1}`)); w.Code != http.StatusCreated {
		t.Fatalf("the other process's request: %d %s", w.Code, w.Body)
	}
	runsBefore := runs.Load()
	w := serve(h, req("POST", "/x", "key-elsewhere", `{"a":1}`))
	if w.Body.String() != `{"id":"ord_2"}` || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry of a key completed elsewhere: %d %s, want its replay", w.Code, w.Body)
	}
	if runs.Load() != runsBefore || b.store.gets.Load() != 1 {
		t.Fatalf("after 25 cached replays, a retry of a key completed elsewhere ran the handler %d times with %d reads; "+
			"want it answered from one read of the key, before the handler", runs.Load()-runsBefore, b.store.gets.Load())
	}
}

// leaseCreated is a ClaimInHandler route's handler that claims its key under a lease
// (AcquireForTx) and answers 201 body inside its transaction, counting its runs.
func leaseCreated(b *bundle, body string, runs *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if err := idem.FromContext(r.Context()).AcquireForTx(r.Context()); err != nil {
			return // the middleware answers what the claim found
		}
		_ = inTx(r.Context(), b.store, nil, func() error {
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, body)
			return nil
		})
	}
}

// A ClaimInHandler route whose requests carry new keys runs the handler at once, with
// the claim still to make; but a key this process knows is answered before the handler
// (issue 28: on PostgreSQL, Respond's function ran for a request and its retry, and for
// each of six concurrent duplicates): a duplicate of a key whose handler runs here gets
// 409 request_in_progress with Retry-After (once a read shows the key not completed),
// and a retry of a key recorded here is read first and replayed. The handler runs once.
func TestClaimInHandlerRunsTheHandlerOnceForTheKeysItKnows(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var runs atomic.Int64
	var gates testkit.Gates
	first := gates.Add("first")
	h := claimInHandler(b, func(w http.ResponseWriter, r *http.Request) {
		gates.Pass(r.Header.Get("X-Gate"))
		leaseCreated(b, `{"id":"ord_1"}`, &runs)(w, r)
	})
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		r := req("POST", "/x", "key-known", `{"a":1}`)
		r.Header.Set("X-Gate", "first")
		done <- serve(h, r)
	}()
	<-first.Entered
	for range 6 {
		w := serve(h, req("POST", "/x", "key-known", `{"a":1}`))
		wantCode(t, w, http.StatusConflict, idem.CodeRequestInProgress)
		if w.Header().Get("Retry-After") == "" {
			t.Fatalf("a duplicate in flight was answered 409 without Retry-After")
		}
	}
	close(first.Proceed)
	if w := <-done; w.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", w.Code, w.Body)
	}
	for range 2 {
		w := serve(h, req("POST", "/x", "key-known", `{"a":1}`))
		if w.Body.String() != `{"id":"ord_1"}` || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: %d %s, want the first answer replayed", w.Code, w.Body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times for a request, 6 concurrent duplicates and 2 retries on one process, want 1", n)
	}
	if n := b.store.gets.Load(); n != 8 {
		t.Fatalf("%d reads, want one for each duplicate (the store shows no completed record: 409) and each retry", n)
	}
}

// A key completed elsewhere (another process, or before this one forgot it) is
// replayed to a duplicate even while a request of it runs the handler here: the store
// shows it completed, so 409 request_in_progress would be wrong (benchtool's replays of
// one key got 30 of them in 16,541 requests).
func TestClaimInHandlerReplaysAKeyCompletedElsewhereWhileItsHandlerRunsHere(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var runs atomic.Int64
	var gates testkit.Gates
	first := gates.Add("first")
	handler := func(w http.ResponseWriter, r *http.Request) {
		gates.Pass(r.Header.Get("X-Gate"))
		leaseCreated(b, `{"id":"ord_1"}`, &runs)(w, r)
	}
	other := claimInHandler(b, handler)
	if w := serve(other, req("POST", "/x", "key-elsewhere", `{"a":1}`)); w.Code != http.StatusCreated {
		t.Fatalf("the other process: %d %s", w.Code, w.Body)
	}
	h := claimInHandler(b, handler) // this process's route knows no key
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		r := req("POST", "/x", "key-elsewhere", `{"a":1}`)
		r.Header.Set("X-Gate", "first")
		done <- serve(h, r)
	}()
	<-first.Entered
	w := serve(h, req("POST", "/x", "key-elsewhere", `{"a":1}`))
	close(first.Proceed)
	<-done
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("a duplicate while the handler runs here: %d %s, want the completed key replayed", w.Code, w.Body)
	}
}
