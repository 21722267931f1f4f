package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/observe"
)

// The middleware (through its guard) logs a store outage once per interval, whatever
// the number of requests that fail on it.
func TestAStoreOutageIsLoggedOncePerInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.store.down.Store(true)
	h := b.mw.Handler(&counter{})
	for i := range 20 {
		wantCode(t, serve(h, req("POST", "/x", key+itoa(int64(i)), "{}")), 503, idem.CodeStoreUnavailable)
	}
	if n := strings.Count(b.logs.String(), "idem: store claim failed"); n != 1 {
		t.Fatalf("%d lines for 20 failed claims in one interval, want 1:\n%s", n, b.logs)
	}
}

// stepRoute is a route whose operation commits the step charge_pending, then calls a
// processor that is down while down is set (answering 503, which releases the key and
// keeps the record, SPEC §13); when hold is not nil its first run signals stepped after
// the step and stalls until hold is closed. Its resume function is the same operation.
func stepRoute(b *bundle, down *atomic.Bool, hold chan struct{}, stepped chan<- struct{}) http.Handler {
	errDown := errors.New("processor down")
	var stalled atomic.Bool
	op := func(ctx context.Context) error {
		if _, err := idem.Step(ctx, "charge_pending", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
			return err
		}
		if hold != nil && stalled.CompareAndSwap(false, true) {
			stepped <- struct{}{}
			<-hold // the holder stalls here, its lease lapsing
		}
		if down.Load() {
			return errDown
		}
		return nil
	}
	resume := func(ctx context.Context, h *idem.Handle) error {
		if err := op(ctx); err != nil {
			return err
		}
		h.SetResponse(&idem.Response{Status: http.StatusCreated, Body: []byte("ch_1")})
		return nil
	}
	return b.mw.Route(idem.RouteOptions{Name: "charges.create", Resume: resume})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := op(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ch_1")
	}))
}

// resumeBy resumes the operation of key as via says: the client's retry, or a pass of
// the completer; it returns the log lines written meanwhile.
func resumeBy(t *testing.T, b *bundle, h http.Handler, via string) string {
	t.Helper()
	mark := len(b.logs.String())
	switch via {
	case "the client's retry":
		if w := serve(h, req("POST", "/v1/charges", key, "{}")); w.Code != http.StatusCreated {
			t.Fatalf("the retry got %d %s, want 201", w.Code, w.Body)
		}
	case "the completer":
		if p := idem.NewCompleter(b.mw.Guard(), idem.CompleterConfig{}).Pass(t.Context()); p.Resumed != 1 || p.Err != nil {
			t.Fatalf("completer pass %+v, want one record resumed", p)
		}
	}
	return b.logs.String()[mark:]
}

// After a handler answered 503 following a committed step, its release ends the lease
// and keeps the record (no holder): the retry, or the completer, that resumes it says
// so, and says nothing of a takeover, a lapsed lease or a holder that died; its claim
// event is "resumed", not "took_over".
func TestResumingAReleasedRecordIsNoTakeover(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"the client's retry", "the completer"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			var outcomes testkit.Buffer
			b := setup(t, func(c *idem.Config) {
				c.Observer = &observe.Observer{Claimed: func(e observe.ClaimEvent) { fmt.Fprintln(&outcomes, e.Outcome) }}
			})
			var down atomic.Bool
			down.Store(true)
			h := stepRoute(b, &down, nil, nil)
			wantCode(t, serve(h, req("POST", "/v1/charges", key, "{}")), http.StatusServiceUnavailable, "")
			down.Store(false)
			lines := resumeBy(t, b, h, via)
			for _, wolf := range []string{"took over", "lapsed", "died", "take over"} {
				if strings.Contains(lines, wolf) {
					t.Errorf("resuming a released record logged %q:\n%s", wolf, lines)
				}
			}
			if !strings.Contains(lines, "resuming an operation its holder released after a step committed") {
				t.Errorf("the resume of a released record was not logged as one:\n%s", lines)
			}
			if via == "the client's retry" && outcomes.String() != "acquired\nresumed\n" {
				t.Errorf("claim outcomes %q, want acquired then resumed", outcomes.String())
			}
		})
	}
}

// A holder that stalls past its lease after a step committed is taken over: the retry,
// or the completer, that resumes it says that the lease lapsed.
func TestTakingOverALapsedLeaseSaysSo(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"the client's retry", "the completer"} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			var down atomic.Bool
			hold, stepped := make(chan struct{}), make(chan struct{})
			h := stepRoute(b, &down, hold, stepped)
			first := make(chan int)
			go func() { first <- serve(h, req("POST", "/v1/charges", key, "{}")).Code }()
			<-stepped
			b.clock.Advance(idem.DefaultLease + time.Second) // no renewal: the manual ticker never ticks
			lines := resumeBy(t, b, h, via)
			close(hold)
			if code := <-first; code != http.StatusServiceUnavailable {
				t.Errorf("the stalled holder got %d, want 503 (fenced out)", code)
			}
			want := "took over a key whose lease lapsed; resuming after its last committed step"
			if via == "the completer" {
				want = "resuming an operation whose holder's lease lapsed after a step committed"
			}
			if !strings.Contains(lines, want) || strings.Contains(lines, "released after a step") {
				t.Errorf("the takeover of a lapsed lease logged no %q:\n%s", want, lines)
			}
		})
	}
}
