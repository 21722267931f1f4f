package idem_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
)

// Resumable operations (SPEC §13) through the middleware and the guard, on the
// in-memory store; store/storetest runs the store-generic cases on every store.

// TestAHandlerThatFailsAfterAStepIsResumedByTheRetry: the processor fails after the
// charge was recorded pending; the handler answers 503, which releases the key, but
// the record is kept (its lease ended) and the client's retry resumes after the
// committed step instead of recording a second pending charge.
func TestAHandlerThatFailsAfterAStepIsResumedByTheRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var pending, processor atomic.Int64
	var down atomic.Bool
	down.Store(true)
	var points []string
	h := b.mw.Route(idem.RouteOptions{Name: "charges.create"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		points = append(points, idem.FromContext(r.Context()).RecoveryPoint())
		id, err := idem.Step(r.Context(), "charge_pending", func(context.Context) (string, error) {
			pending.Add(1)
			return "ch_" + itoa(pending.Load()), nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		processor.Add(1)
		if down.Load() {
			http.Error(w, "processor down", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, id)
	}))

	wantCode(t, serve(h, req("POST", "/v1/charges", key, `{"amount":1}`)), http.StatusServiceUnavailable, "")
	down.Store(false)
	w := serve(h, req("POST", "/v1/charges", key, `{"amount":1}`))
	if w.Code != http.StatusCreated || w.Body.String() != "ch_1" {
		t.Fatalf("retry = %d %q, want 201 ch_1 from the saved step", w.Code, w.Body)
	}
	if pending.Load() != 1 || processor.Load() != 2 || strings.Join(points, ",") != ",charge_pending" {
		t.Fatalf("pending step ran %d times, processor %d, recovery points seen %q; want 1, 2, \",charge_pending\"",
			pending.Load(), processor.Load(), points)
	}
	if !strings.Contains(b.logs.String(), "resuming an operation its holder released after a step committed") {
		t.Errorf("the resume of the released record was not logged:\n%s", b.logs)
	}
	w = serve(h, req("POST", "/v1/charges", key, `{"amount":1}`))
	if w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != "ch_1" {
		t.Fatalf("third request = %d %q, want the replay", w.Code, w.Body)
	}
}

func TestStepNamesAndResultsAreChecked(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	h, _, err := g.Begin(t.Context(), chargeCall(1))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	for _, name := range []string{"", strings.Repeat("s", idem.MaxStepNameLength+1), "tab\there", "\xff"} {
		if _, err := h.PrepareStep(name, 1); err == nil {
			t.Errorf("PrepareStep(%q) succeeded; want the name refused", name)
		}
	}
	if _, err := h.PrepareStep("big", strings.Repeat("x", idem.MaxStepResultsBytes)); err == nil || !strings.Contains(err.Error(), "MaxStepResultsBytes") {
		t.Errorf("PrepareStep of a result over the limit = %v, want it refused naming MaxStepResultsBytes", err)
	}
	if _, err := h.PrepareStep("chan", make(chan int)); err == nil {
		t.Error("PrepareStep of a result that JSON cannot encode succeeded")
	}
	if _, err := idem.Step(h.Context(), "a", func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := h.PrepareStep("a", 2); !errors.Is(err, idem.ErrStepCommitted) {
		t.Errorf("PrepareStep of a committed step = %v, want ErrStepCommitted", err)
	}
	var v int
	if done, err := h.StepResult("a", &v); !done || err != nil || v != 1 {
		t.Errorf("StepResult(a) = %v, %v, %d; want committed with 1", done, err, v)
	}
	if done, err := h.StepResult("b", &v); done || err != nil {
		t.Errorf("StepResult(b) = %v, %v; want not committed", done, err)
	}
}

func TestStepWithoutAClaimJustRuns(t *testing.T) {
	t.Parallel()
	v, err := idem.Step(context.Background(), "a", func(context.Context) (int, error) { return 7, nil })
	if err != nil || v != 7 {
		t.Fatalf("Step without a claim = %d, %v; want 7", v, err)
	}
}

func TestDerivedKeyNeedsAnAcquiredClaim(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]*idem.Handle{"a handle before its claim": new(idem.Handle), "no handle (a request without a key)": nil} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(p.(string), "acquired claim") {
					t.Fatalf("DerivedKey: panic %v, want one saying it needs an acquired claim", p)
				}
			}()
			h.DerivedKey("processor")
		})
	}
}

func TestResumeFunctionsRegisterOncePerName(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	fn := func(context.Context, *idem.Handle) error { return nil }
	g.RegisterResume("charges.create", fn)
	for name, register := range map[string]func(){
		"twice":           func() { g.RegisterResume("charges.create", fn) },
		"no name":         func() { g.RegisterResume("", fn) },
		"no function":     func() { g.RegisterResume("refunds.create", nil) },
		"route with none": func() { setup(t, nil).mw.Route(idem.RouteOptions{Resume: fn}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			register()
		}()
	}
}

func TestCompleterConfigIsChecked(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	for name, cfg := range map[string]idem.CompleterConfig{
		"Interval":     {Interval: -1},
		"BatchSize":    {BatchSize: -1},
		"RetryBackoff": {RetryBackoff: -1},
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(p.(string), "CompleterConfig."+name) {
					t.Errorf("NewCompleter with a negative %s: panic %v, want one naming the field", name, p)
				}
			}()
			idem.NewCompleter(g, cfg)
		}()
	}
}

// TestCompleterRunsPassesAndSignalsThem: Run passes at once, then after each interval,
// reporting each pass, and returns when its context ends.
func TestCompleterRunsPassesAndSignalsThem(t *testing.T) {
	t.Parallel()
	g, _ := newGuard(t, nil)
	c := idem.NewCompleter(g, idem.CompleterConfig{Interval: 1})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	for range 3 {
		if p := <-c.Passes(); p != (idem.CompleterPass{}) {
			t.Fatalf("pass over an empty store = %+v", p)
		}
	}
	cancel()
	<-done
}

// TestPolicyUnknownAnswersOutcomeUnknownUntilResolved: a handler whose foreign effects
// cannot be deduplicated stalls past its lease; the retry that finds the lease lapsed
// gets 500 outcome_unknown instead of running it again, and so does every later retry
// (never from the replay cache), until an operator resolves the key.
func TestPolicyUnknownAnswersOutcomeUnknownUntilResolved(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.ReplayCacheSize = 16 })
	var runs atomic.Int64
	started, finish := make(chan struct{}), make(chan struct{})
	h := b.mw.Route(idem.RouteOptions{OnLapse: idem.LapseUnknown})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-finish // the card network hangs; the process is as good as dead
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serve(h, req("POST", "/v1/charges", key, `{"amount":1}`)) }()
	<-started
	b.clock.Advance(idem.DefaultLease + time.Second)

	retry := serve(h, req("POST", "/v1/charges", key, `{"amount":1}`))
	wantCode(t, retry, http.StatusInternalServerError, idem.CodeOutcomeUnknown)
	close(finish)
	wantCode(t, <-first, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	again := serve(h, req("POST", "/v1/charges", key, `{"amount":1}`))
	if again.Code != retry.Code || again.Body.String() != retry.Body.String() {
		t.Fatalf("second retry = %d %s, want the same answer %d %s", again.Code, again.Body, retry.Code, retry.Body)
	}
	if !strings.Contains(b.logs.String(), "policy unknown") {
		t.Errorf("marking the outcome unknown was not logged:\n%s", b.logs)
	}

	// The operator found the charge at the card network: the key answers it.
	resolved := &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_1"}`)}
	if err := b.store.Store.RecordResolve(t.Context(), &admin.RecordResolveParams{Scope: "alice", Key: key, Response: resolved, Now: b.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	w := serve(h, req("POST", "/v1/charges", key, `{"amount":1}`))
	if w.Code != http.StatusCreated || w.Body.String() != `{"id":"ch_1"}` || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the resolution = %d %s, want the resolved response replayed", w.Code, w.Body)
	}
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want once", runs.Load())
	}
}

func TestPolicyIsChecked(t *testing.T) {
	t.Parallel()
	defer func() {
		if p := recover(); p == nil || !strings.Contains(p.(string), "RouteOptions.OnLapse") {
			t.Fatalf("Route with an unknown policy: panic %v, want one naming RouteOptions.OnLapse", p)
		}
	}()
	setup(t, nil).mw.Route(idem.RouteOptions{OnLapse: 7})
}
