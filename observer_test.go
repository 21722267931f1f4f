package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/observe"
)

// recorder is an Observer that keeps every event, in order, as "kind:detail".
type recorder struct {
	mu     sync.Mutex
	events []any
}

func (r *recorder) add(e any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) observer() *observe.Observer {
	return &observe.Observer{
		Claimed:       func(e observe.ClaimEvent) { r.add(e) },
		Completed:     func(e observe.CompletionEvent) { r.add(e) },
		Released:      func(e observe.ReleaseEvent) { r.add(e) },
		RenewalFailed: func(e observe.RenewalEvent) { r.add(e) },
		LeaseLost:     func(e observe.LeaseLostEvent) { r.add(e) },
		StoreCall:     func(e observe.StoreCallEvent) { r.add(e) },
		Step:          func(e observe.StepEvent) { r.add(e) },
		Resumed:       func(e observe.ResumeEvent) { r.add(e) },
		Unfinished:    func(e observe.UnfinishedEvent) { r.add(e) },
	}
}

// take returns the events recorded since the last take, each summarised as
// "claimed:acquired", "completed:stored", "released", "renewal_failed",
// "lease_lost:expired", "store:claim", "step:charge_pending:committed",
// "resume:resumed" or "unfinished:2" (with "!" when it carries an error).
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		var s string
		var err error
		switch e := e.(type) {
		case observe.ClaimEvent:
			s, err = "claimed:"+string(e.Outcome), e.Err
		case observe.CompletionEvent:
			s, err = "completed:"+string(e.Result), e.Err
			if e.InTx {
				s += "(tx)"
			}
		case observe.ReleaseEvent:
			s, err = "released", e.Err
		case observe.RenewalEvent:
			s, err = "renewal_failed", e.Err
		case observe.LeaseLostEvent:
			s = "lease_lost:" + string(e.Cause)
		case observe.StoreCallEvent:
			s, err = "store:"+string(e.Op), e.Err
		case observe.StepEvent:
			s, err = "step:"+e.Step+":"+string(e.Result), e.Err
		case observe.ResumeEvent:
			s, err = "resume:"+string(e.Result), e.Err
		case observe.UnfinishedEvent:
			s = fmt.Sprintf("unfinished:%d", e.Count)
		}
		if err != nil {
			s += "!"
		}
		out = append(out, s)
	}
	r.events = nil
	return out
}

// all returns every event recorded and not taken, as recorded.
func (r *recorder) all() []any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]any(nil), r.events...)
}

func observed(t *testing.T, mod func(*idem.Config)) (*bundle, *recorder) {
	t.Helper()
	rec := &recorder{}
	b := setup(t, func(c *idem.Config) {
		c.Observer = rec.observer()
		if mod != nil {
			mod(c)
		}
	})
	return b, rec
}

func wantEvents(t *testing.T, what string, rec *recorder, want ...string) {
	t.Helper()
	if got := rec.take(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("%s: events\n  %s\nwant\n  %s", what, strings.Join(got, " "), strings.Join(want, " "))
	}
}

func TestObserverSeesEachClaimOutcomeOnce(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	mw := b.mw.Handler(&counter{})
	serve(mw, req("POST", "/x", key, "{}"))
	wantEvents(t, "new key", rec, "store:claim", "claimed:acquired", "store:complete", "completed:stored")
	serve(mw, req("POST", "/x", key, "{}"))
	wantEvents(t, "retry", rec, "store:claim", "claimed:replayed")
	serve(mw, req("POST", "/x", key, `{"other":1}`))
	wantEvents(t, "other body", rec, "store:claim", "claimed:key_reused")
	b.store.down.Store(true)
	serve(mw, req("POST", "/x", key, "{}"))
	wantEvents(t, "store down", rec, "store:claim!", "claimed:store_error!")
}

func TestObserverSeesStoreCallsWithTheirDurations(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	ob := &observe.Observer{StoreCall: func(e observe.StoreCallEvent) { rec.add(e) }}
	b := setup(t, func(c *idem.Config) { c.Observer = ob })
	serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}"))
	events := rec.all()
	if len(events) != 2 {
		t.Fatalf("store calls %v, want the claim and the completion", rec.take())
	}
	for i, op := range []observe.StoreOp{observe.StoreOpClaim, observe.StoreOpComplete} {
		e := events[i].(observe.StoreCallEvent)
		if e.Op != op || e.Duration <= 0 || e.Err != nil {
			t.Errorf("store call %d = %+v, want %s with a duration", i, e, op)
		}
	}
}

func TestObserverSeesReplaysFromTheCache(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, func(c *idem.Config) { c.ReplayCacheSize = 4 })
	mw := b.mw.Handler(&counter{})
	serve(mw, req("POST", "/x", key, "{}"))
	rec.take()
	serve(mw, req("POST", "/x", key, "{}"))
	wantEvents(t, "cached retry", rec, "claimed:replayed_cache")
}

func TestObserverSeesInProgressAndWaitedThenReplayed(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	h := newHeld()
	mw := b.mw.Handler(h)
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/x", key, "{}")); close(done) }()
	<-h.entered
	wantEvents(t, "first", rec, "store:claim", "claimed:acquired")
	serve(mw, req("POST", "/x", key, "{}"))
	wantEvents(t, "duplicate", rec, "store:claim", "claimed:in_progress")

	// A middleware that waits for the first request over the same store.
	waits := &recorder{}
	waiting := make(chan struct{})
	m := idem.New(idem.Config{Store: b.store, Scope: bearerScope, Clock: b.clock.Now,
		InFlightWait: time.Hour, Observer: &observe.Observer{Claimed: func(e observe.ClaimEvent) { waits.add(e) }}})
	idem.OnWait(m, func() { close(waiting) })
	dup := make(chan struct{})
	go func() { serve(m.Handler(&counter{}), req("POST", "/x", key, "{}")); close(dup) }()
	<-waiting
	close(h.gate)
	<-done
	<-dup
	events := waits.all()
	if len(events) != 1 {
		t.Fatalf("waiting duplicate: %d claim events, want 1", len(events))
	}
	if e := events[0].(observe.ClaimEvent); e.Outcome != observe.OutcomeWaitedThenReplayed || !e.Waited || e.Duration <= 0 {
		t.Errorf("waiting duplicate: %+v, want waited_replayed after a wait", e)
	}
}

func TestObserverSeesATakeoverAndTheLostLease(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	h := newHeld()
	first := make(chan struct{})
	go func() { serve(b.mw.Handler(h), req("POST", "/x", key, "{}")); close(first) }()
	<-h.entered
	rec.take()
	b.clock.Advance(31 * time.Second)
	serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}"))
	wantEvents(t, "takeover", rec, "store:claim", "claimed:took_over", "store:complete", "completed:stored")
	b.ticker.Tick()
	<-renewed
	wantEvents(t, "the first holder's renewal", rec, "store:renew!", "renewal_failed!", "lease_lost:taken_over")
	close(h.gate)
	<-first
	wantEvents(t, "the first holder's answer", rec, "store:complete!", "completed:lease_lost!")
}

func TestObserverSeesALeaseThatExpires(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	b.store.renewBlocks = make(chan struct{})
	leaseEnds := idem.UseManualLeaseTimers(b.mw)
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	h := newHeld()
	done := make(chan struct{})
	go func() { serve(b.mw.Handler(h), req("POST", "/x", key, "{}")); close(done) }()
	ctx := <-h.entered
	b.clock.Advance(10 * time.Second)
	b.ticker.Tick()
	<-b.store.renewBlocks
	b.clock.Advance(leaseEnds.Armed())
	leaseEnds.Tick()
	<-ctx.Done()
	<-renewed
	close(h.gate)
	<-done
	// The handler answered 201 after its lease ended; nobody took the key over, so
	// the fenced completion still stores it.
	wantEvents(t, "stalled renewals", rec, "store:claim", "claimed:acquired", "lease_lost:expired", "store:renew!",
		"store:complete", "completed:stored")
}

func TestObserverSeesReleasesAndTransactions(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	serve(b.mw.Handler(&counter{status: 400}), req("POST", "/x", key, "{}"))
	wantEvents(t, "a releasing status", rec, "store:claim", "claimed:acquired", "store:release", "released")

	tx := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		_ = inTx(r.Context(), b.store, nil, func() error { return nil })
	}))
	serve(tx, req("POST", "/tx", key, "{}"))
	wantEvents(t, "a §7 completion", rec, "store:claim", "claimed:acquired", "completed:stored(tx)")

	failing := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		_ = inTx(r.Context(), b.store, errCommit, func() error { return nil })
	}))
	const other = "5d1c2b3a-4e5f-4a6b-9c7d-8e9f0a1b2c3d"
	serve(failing, req("POST", "/tx", other, "{}"))
	wantEvents(t, "a failed §7 commit", rec, "store:claim", "claimed:acquired", "completed:failed(tx)!", "store:release", "released")

	flushing := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
	}))
	const third = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
	serve(flushing, req("POST", "/f", third, "{}"))
	serve(flushing, req("POST", "/f", third, "{}"))
	wantEvents(t, "a streamed response", rec, "store:claim", "claimed:acquired", "store:complete", "completed:not_stored",
		"store:claim", "claimed:not_stored")
}

func TestObserverEventsCarryTheRouteAndNoSecret(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", b.mw.Handler(&counter{}))
	mux.Handle("POST /v1/orders", b.mw.Route(idem.RouteOptions{Name: "orders.create"})(&counter{}))
	const body = `{"amount":2000,"card":"4242424242424242"}`
	serve(mux, req("POST", "/v1/charges", key, body))
	serve(mux, req("POST", "/v1/orders", "7f6e5d4c-3b2a-4190-8f7e-6d5c4b3a2918", body))
	routes := map[string]int{}
	hashRe := regexp.MustCompile(`^[0-9a-f]{12}$`)
	for _, e := range rec.all() {
		dump := fmt.Sprintf("%+v", e)
		for _, secret := range []string{key, "4242424242424242", "alice"} {
			if strings.Contains(dump, secret) {
				t.Errorf("event %s reveals %q", dump, secret)
			}
		}
		if c, ok := e.(observe.ClaimEvent); ok {
			routes[c.Route]++
			if !hashRe.MatchString(c.KeyHash) {
				t.Errorf("key hash %q is not a short hex hash", c.KeyHash)
			}
		}
	}
	if routes["POST /v1/charges"] != 1 || routes["orders.create"] != 1 {
		t.Errorf("claims by route %v, want the pattern and the route's name", routes)
	}
}

func TestObserverSeesDoWithTheCallsName(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	g, _ := newGuard(t, func(c *idem.GuardConfig) { c.Observer = rec.observer() })
	call := chargeCall(2000)
	call.Name = "charges.create"
	idem.Do(context.Background(), g, call, func(context.Context) (int, error) { return 1, nil })
	idem.Do(context.Background(), g, call, func(context.Context) (int, error) { return 2, nil })
	failing := chargeCall(3000)
	failing.Key = "1e2d3c4b-5a69-4788-97a6-b5c4d3e2f1a0"
	idem.Do(context.Background(), g, failing, func(context.Context) (int, error) { return 0, errors.New("declined") })
	wantEvents(t, "Do", rec, "store:claim", "claimed:acquired", "store:complete", "completed:stored",
		"store:claim", "claimed:replayed", "store:claim", "claimed:acquired", "store:release", "released")
}

func TestNilObserverAndNilFuncsSeeNothing(t *testing.T) {
	t.Parallel()
	// A nil Observer is the benchmarks' path; an Observer with no funcs must not fail.
	b := setup(t, func(c *idem.Config) { c.Observer = &observe.Observer{} })
	mw := b.mw.Handler(&counter{})
	serve(mw, req("POST", "/x", key, "{}"))
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay with an empty observer: %d", w.Code)
	}
}

type traceKey struct{}

// eventContext returns the Context of any event.
func eventContext(e any) context.Context {
	switch e := e.(type) {
	case observe.ClaimEvent:
		return e.Context
	case observe.CompletionEvent:
		return e.Context
	case observe.ReleaseEvent:
		return e.Context
	case observe.RenewalEvent:
		return e.Context
	case observe.LeaseLostEvent:
		return e.Context
	case observe.StoreCallEvent:
		return e.Context
	}
	panic(fmt.Sprintf("not an event: %T", e))
}

// Every event carries the caller's context (for an adapter's parent span), without
// its cancellation: also the renewals' and the lost lease's, sent from timers.
func TestObserverEventsCarryTheCallersContext(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	h := newHeld()
	first := make(chan struct{})
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), traceKey{}, "first"))
	go func() { serve(b.mw.Handler(h), req("POST", "/x", key, "{}").WithContext(ctx)); close(first) }()
	<-h.entered
	cancel() // the client went away; the operation runs on
	b.clock.Advance(31 * time.Second)
	second := context.WithValue(context.Background(), traceKey{}, "second")
	serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}").WithContext(second))
	b.ticker.Tick()
	<-renewed
	close(h.gate)
	<-first
	serve(b.mw.Handler(&counter{status: 400}), req("POST", "/x", "5d1c2b3a-4e5f-4a6b-9c7d-8e9f0a1b2c3d", "{}").WithContext(second))

	events := rec.all()
	got := map[string]int{}
	for _, e := range events {
		c := eventContext(e)
		if c == nil || c.Err() != nil {
			t.Fatalf("event %+v: context %v, want one without cancellation", e, c)
		}
		v, _ := c.Value(traceKey{}).(string)
		got[v]++
	}
	// first: claim (store call, event), renewal (store call, failure), lost lease,
	// completion (store call, event); second: the takeover's 4, the release's 4.
	if got["first"] != 7 || got["second"] != 8 || len(got) != 2 {
		t.Errorf("events by the caller's context value %v, want first: 7, second: 8\n%s", got, strings.Join(rec.take(), " "))
	}
}

// A completion's and a release's StoreDuration is their store call's duration; zero
// in a SPEC §7 transaction.
func TestObserverCompletionAndReleaseCarryTheirStoreCallsDuration(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}"))
	serve(b.mw.Handler(&counter{status: 400}), req("POST", "/x", "5d1c2b3a-4e5f-4a6b-9c7d-8e9f0a1b2c3d", "{}"))
	tx := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		_ = inTx(r.Context(), b.store, nil, func() error { return nil })
	}))
	serve(tx, req("POST", "/tx", "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "{}"))
	var last time.Duration // of the store call before each event
	n := 0
	for _, e := range rec.all() {
		switch e := e.(type) {
		case observe.StoreCallEvent:
			last = e.Duration
		case observe.CompletionEvent:
			n++
			if want := map[bool]time.Duration{false: last, true: 0}[e.InTx]; e.StoreDuration != want || (!e.InTx && want <= 0) {
				t.Errorf("completion (in tx: %v): StoreDuration %v, want %v", e.InTx, e.StoreDuration, want)
			}
		case observe.ReleaseEvent:
			n++
			if e.StoreDuration != last || last <= 0 {
				t.Errorf("release: StoreDuration %v, want its store call's %v", e.StoreDuration, last)
			}
		}
	}
	if n != 3 {
		t.Fatalf("%d completions and releases, want 3: %s", n, strings.Join(rec.take(), " "))
	}
}

func TestMultiObserverTellsEachObserverInOrder(t *testing.T) {
	t.Parallel()
	var order []string
	var mu sync.Mutex
	note := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		order = append(order, s)
	}
	first := &observe.Observer{Claimed: func(e observe.ClaimEvent) { note("first:" + string(e.Outcome)) }}
	second := &observe.Observer{
		Claimed:   func(e observe.ClaimEvent) { note("second:" + string(e.Outcome)) },
		Completed: func(e observe.CompletionEvent) { note("second:" + string(e.Result)) },
	}
	b := setup(t, func(c *idem.Config) { c.Observer = observe.Multi(first, nil, &observe.Observer{}, second) })
	serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}"))
	if got := strings.Join(order, " "); got != "first:acquired second:acquired second:stored" {
		t.Errorf("events %q, want each observer told in order", got)
	}
	if m := observe.Multi(nil, &observe.Observer{}); m != nil {
		t.Errorf("MultiObserver of nothing = %+v, want nil (costs nothing)", m)
	}
	if m := observe.Multi(second); m.Claimed == nil || m.Completed == nil || m.StoreCall != nil {
		t.Errorf("MultiObserver of one: %+v, want its funcs only", m)
	}
}

// The steps of a resumable operation (SPEC §13) are told: committed, returned saved
// on the retry that resumes the operation, fenced out once the key was taken over,
// and failed when the store does not save the result.
func TestObserverSeesStepsCommittedSavedFencedAndFailed(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	var down atomic.Bool
	down.Store(true)
	h := b.mw.Route(idem.RouteOptions{Name: "charges.create"})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := idem.Step(r.Context(), "charge_pending", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if down.Load() {
			http.Error(w, "processor down", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	serve(h, req("POST", "/v1/charges", key, "{}"))
	wantEvents(t, "first attempt", rec, "store:claim", "claimed:acquired", "store:step", "step:charge_pending:committed",
		"store:release", "released")
	down.Store(false)
	serve(h, req("POST", "/v1/charges", key, "{}"))
	// Its holder released it (nothing died): resumed, not took_over.
	wantEvents(t, "the retry resumes", rec, "store:claim", "claimed:resumed", "step:charge_pending:saved",
		"store:complete", "completed:stored")
	for _, e := range rec.all() {
		if e, ok := e.(observe.StepEvent); ok && (e.Route != "charges.create" || e.KeyHash == "" || e.Context == nil) {
			t.Errorf("step event %+v lacks the route, the key's hash or the context", e)
		}
	}

	// A holder whose key was taken over is fenced out; a store that fails, failed.
	g := b.mw.Guard()
	call := idem.Call{Scope: "alice", Key: "key-fenced-0001", Name: "charges.create"}
	h1, _, err := g.Begin(t.Context(), call)
	if err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(idem.DefaultLease + time.Second)
	h2, _, err := g.Begin(t.Context(), call)
	if err != nil {
		t.Fatal(err)
	}
	rec.take()
	one := func(context.Context) (int, error) { return 1, nil }
	if _, err := idem.Step(h1.Context(), "a", one); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the fenced-out holder's step = %v, want ErrLeaseLost", err)
	}
	wantEvents(t, "fenced out", rec, "store:step!", "step:a:lease_lost!")
	b.store.down.Store(true)
	if _, err := idem.Step(h2.Context(), "a", one); !errors.Is(err, idem.ErrStoreUnavailable) {
		t.Fatalf("a step on a store that is down = %v, want ErrStoreUnavailable", err)
	}
	wantEvents(t, "store down", rec, "store:step!", "step:a:failed!")
}

// A completer's passes are told per record: resumed, failed (tried again later),
// taken by another caller first, and without a resume function (looked at again
// after a backoff); each pass ends with the store's count of unfinished operations.
// The events of the operation it resumes carry the operation's name as their route,
// and its queries are store calls.
func TestObserverSeesWhatTheCompleterDidWithEachRecord(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	clock := newClock()
	g, st := newGuard(t, func(c *idem.GuardConfig) { c.Observer = rec.observer(); c.Clock = clock.Now })
	failing := true
	g.RegisterResume("charges.create", func(ctx context.Context, h *idem.Handle) error {
		if _, err := idem.Step(ctx, "charge_pending", func(context.Context) (int, error) { return 0, errors.New("ran again") }); err != nil {
			return err
		}
		if failing {
			return errors.New("processor down")
		}
		return h.SetResult("ch_1")
	})
	// A holder that died after its step committed, under each operation name.
	begin := func(name, k string) {
		h, _, err := g.Begin(t.Context(), idem.Call{Scope: "alice", Key: k, Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := idem.Step(h.Context(), "charge_pending", func(context.Context) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
	}
	begin("charges.create", "key-charge-0001")
	begin("refunds.create", "key-refund-0001")
	clock.Advance(idem.DefaultLease + time.Second)
	rec.take()

	c := idem.NewCompleter(g, idem.CompleterConfig{RetryBackoff: time.Minute, MaxRetryBackoff: time.Minute})
	if p := c.Pass(t.Context()); p.Failed != 1 || p.Skipped != 1 {
		t.Fatalf("first pass = %+v, want one failed and one skipped", p)
	}
	wantEvents(t, "a failing resume and an operation without a function", rec,
		"store:list_resumable", "store:claim", "step:charge_pending:saved", "store:release", "released", "resume:failed!",
		"resume:no_function", "store:count_unfinished", "unfinished:2")

	failing = false
	clock.Advance(2 * time.Minute)
	if p := c.Pass(t.Context()); p.Resumed != 1 {
		t.Fatalf("second pass = %+v, want one resumed", p)
	}
	events := rec.all()
	wantEvents(t, "the resume that succeeds; the record without a function, looked at again after its backoff", rec,
		"store:list_resumable", "store:claim", "step:charge_pending:saved", "store:complete", "completed:stored", "resume:resumed",
		"resume:no_function", "store:count_unfinished", "unfinished:1")
	for _, e := range events {
		switch e := e.(type) {
		case observe.CompletionEvent:
			if e.Route != "charges.create" {
				t.Errorf("the resumed operation's completion has route %q, want its operation's name", e.Route)
			}
		case observe.ResumeEvent:
			if e.Result == observe.ResumeNoFunction {
				if e.Route != "refunds.create" || e.RecoveryPoint != "charge_pending" || e.KeyHash == "" {
					t.Errorf("resume event %+v lacks the route, recovery point or key hash", e)
				}
			} else if e.Route != "charges.create" || e.RecoveryPoint != "charge_pending" || e.KeyHash == "" || e.Duration <= 0 {
				t.Errorf("resume event %+v lacks the route, recovery point, key hash or duration", e)
			}
		case observe.UnfinishedEvent:
			if e.OldestAge < idem.DefaultLease {
				t.Errorf("unfinished event %+v: the oldest is older than a lease", e)
			}
		}
	}

	// Another caller holds the record when the completer claims it.
	begin("charges.create", "key-charge-0002")
	clock.Advance(idem.DefaultLease + time.Second)
	other := func() {
		h, _, err := g.Begin(t.Context(), idem.Call{Scope: "alice", Key: "key-charge-0002", Name: "charges.create"})
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { _ = h.Release() })
	}
	st.beforeClaim.Store(&other)
	rec.take()
	if p := c.Pass(t.Context()); p.Skipped != 2 {
		t.Fatalf("third pass = %+v, want two skipped", p)
	}
	if got := strings.Join(rec.take(), " "); !strings.HasSuffix(got, "resume:taken store:count_unfinished unfinished:2") {
		t.Errorf("third pass: events %s, want them to end with resume:taken, then the count of the two unfinished", got)
	}
}

// MultiObserver fans out every func of Observer, those added later included.
func TestMultiObserverFansOutEveryFunc(t *testing.T) {
	t.Parallel()
	calls := map[string]int{}
	var o observe.Observer
	v := reflect.ValueOf(&o).Elem()
	for i := range v.NumField() {
		name := v.Type().Field(i).Name
		v.Field(i).Set(reflect.MakeFunc(v.Field(i).Type(), func([]reflect.Value) []reflect.Value {
			calls[name]++
			return nil
		}))
	}
	m := reflect.ValueOf(observe.Multi(&o, &o)).Elem()
	for i := range m.NumField() {
		f := m.Field(i)
		if f.IsNil() {
			t.Errorf("MultiObserver dropped %s", m.Type().Field(i).Name)
			continue
		}
		f.Call([]reflect.Value{reflect.Zero(f.Type().In(0))})
	}
	for name, n := range calls {
		if n != 2 {
			t.Errorf("%s told %d observers, want 2", name, n)
		}
	}
}

// A renewal that the end of its operation calls off (the heartbeat stops it for the
// completion) is not a store error: idem_store_errors_total{op="renew"} must not count
// healthy requests (issue 19 item 4; the alert docs/operations.md gives fired on them).
func TestObserverDoesNotCountARenewalCalledOffByTheEndOfItsOperation(t *testing.T) {
	t.Parallel()
	b, rec := observed(t, nil)
	b.store.renewBlocks = make(chan struct{})
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	h := newHeld()
	done := make(chan struct{})
	go func() { serve(b.mw.Handler(h), req("POST", "/x", key, "{}")); close(done) }()
	<-h.entered
	b.clock.Advance(10 * time.Second)
	b.ticker.Tick()
	<-b.store.renewBlocks // a renewal is under way in the store
	close(h.gate)         // the handler answers: the heartbeat stops, calling the renewal off
	<-done
	if err := <-renewed; !errors.Is(err, context.Canceled) {
		t.Fatalf("the renewal ended with %v, want it called off (context.Canceled)", err)
	}
	wantEvents(t, "a renewal called off", rec, "store:claim", "claimed:acquired", "store:complete", "completed:stored")
}

// A keyed request without a route name (a whole framework router wrapped, before it
// matched) is labelled route="" in every metric: the middleware says so once, naming
// the fix, instead of leaving the labels empty without a word (issue 19).
func TestAnUnnamedRouteIsWarnedOfOnceWhenObserved(t *testing.T) {
	t.Parallel()
	b, _ := observed(t, nil)
	h := b.mw.Handler(&counter{})
	serve(h, req("POST", "/x", key, "{}"))
	serve(h, req("POST", "/y", key+"2", "{}"))
	if n := strings.Count(b.logs.String(), "without a route name"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, b.logs)
	}
	named, _ := observed(t, nil)
	mux := http.NewServeMux()
	mux.Handle("POST /x", named.mw.Handler(&counter{}))
	serve(named.mw.Route(idem.RouteOptions{Name: "charges.create"})(&counter{}), req("POST", "/x", key, "{}"))
	serve(mux, req("POST", "/x", key+"3", "{}"))
	if strings.Contains(named.logs.String(), "without a route name") {
		t.Fatalf("a named route was warned of:\n%s", named.logs)
	}
}
