package idem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/memory"
)

// unknownHandler says that its operation's outcome is unknown (a foreign call's reply
// was lost) and answers 502, counting its executions and the record ids it ran under.
type unknownHandler struct {
	n   atomic.Int64
	ids []string
}

func (u *unknownHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.n.Add(1)
	h := idem.FromContext(r.Context())
	u.ids = append(u.ids, h.RecordID())
	h.SetOutcomeUnknown()
	w.WriteHeader(http.StatusBadGateway)
	_, _ = io.WriteString(w, "reply lost")
}

// An operation whose outcome is unknown is neither stored nor released (SPEC §17, "not
// knowing is not failure"): under the policy unknown the record is marked at once,
// and every repeat gets 500 outcome_unknown without running the operation again.
func TestAnOutcomeUnknownUnderThePolicyUnknownIsNeverRunAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := &unknownHandler{}
	mw := b.mw.Route(idem.RouteOptions{OnLapse: idem.LapseUnknown})(h)
	first := serve(mw, req("POST", "/x", key, `{}`))
	if first.Code != http.StatusBadGateway || first.Body.String() != "reply lost" {
		t.Fatalf("first: %d %q, want the handler's own answer", first.Code, first.Body)
	}
	rec, err := b.store.RecordGet(context.Background(), &idemstore.GetParams{Scope: "alice", Key: key, Now: b.clock.Now()})
	if err != nil || rec.Response == nil || !rec.Response.OutcomeUnknown {
		t.Fatalf("the record is %+v (%v), want it marked outcome unknown before any repeat", rec, err)
	}
	for i := range 2 {
		got := serve(mw, req("POST", "/x", key, `{}`))
		if got.Code != http.StatusInternalServerError || !strings.Contains(got.Body.String(), idem.CodeOutcomeUnknown) || got.Header().Get("Idempotent-Replayed") != "" {
			t.Fatalf("repeat %d: %d %q, want 500 outcome_unknown", i+1, got.Code, got.Body)
		}
	}
	if n := h.n.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// Under the policy take_over the record is kept with its lease ended: the next repeat
// takes it over at once, under the same record id (and the same derived keys).
func TestAnOutcomeUnknownUnderTakeOverIsTakenOverUnderTheSameRecordID(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := &unknownHandler{}
	mw := b.mw.Route(idem.RouteOptions{OnLapse: idem.LapseTakeOver})(h)
	serve(mw, req("POST", "/x", key, `{}`))
	second := serve(mw, req("POST", "/x", key, `{}`))
	if second.Code != http.StatusBadGateway || h.n.Load() != 2 {
		t.Fatalf("repeat: %d after %d executions, want the operation run again", second.Code, h.n.Load())
	}
	if h.ids[0] == "" || h.ids[1] != h.ids[0] {
		t.Fatalf("record ids %q, want the same twice", h.ids)
	}
}

// AnswerNow answers the client at once while the handler runs on; what the handler
// writes afterwards is stored, and the repeat gets it, replayed.
func TestAnswerNowAnswersTheClientAndStoresWhatTheHandlerWritesAfter(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if err := b.mw.AnswerNow(w, func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusGatewayTimeout)
			_, _ = io.WriteString(w, "later")
		}); err != nil {
			t.Error(err)
		}
		if err := b.mw.AnswerNow(w, func(http.ResponseWriter) {}); err == nil {
			t.Error("a second AnswerNow answered too")
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "done")
	}))
	first := serve(mw, req("POST", "/x", key, `{}`))
	if first.Code != http.StatusGatewayTimeout || first.Body.String() != "later" || first.Header().Get("Content-Length") != "5" ||
		first.Header().Get("Idempotency-Key") != key || first.Header().Get("Connection") != "close" {
		t.Fatalf("first: %d %q %v, want the early answer whole, with the key", first.Code, first.Body, first.Header())
	}
	retry := serve(mw, req("POST", "/x", key, `{}`))
	if retry.Code != http.StatusCreated || retry.Body.String() != "done" || retry.Header().Get("Idempotent-Replayed") != "true" || n.Load() != 1 {
		t.Fatalf("retry: %d %q replayed=%q after %d executions, want the stored 201", retry.Code, retry.Body, retry.Header().Get("Idempotent-Replayed"), n.Load())
	}
	if err := b.mw.AnswerNow(httptest.NewRecorder(), func(http.ResponseWriter) {}); err == nil {
		t.Fatal("AnswerNow answered outside the middleware")
	}
}

// TeeStream: a flushed response reaches the client as it is written and is still
// stored whole when it ends within the limit; over the limit it is not stored.
func TestATeedStreamIsStoredWhenItEndsWithinTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.MaxResponseBytes = 8 })
	var n atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		if !b.mw.TeeStream(w) {
			t.Error("TeeStream: not the middleware's writer")
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "a\n")
		http.NewResponseController(w).Flush()
		_, _ = io.WriteString(w, strings.Repeat("b", len(r.URL.Query().Get("more"))))
	}))
	first := serve(mw, req("POST", "/x", key, `{}`))
	retry := serve(mw, req("POST", "/x", key, `{}`))
	if !first.Flushed || first.Body.String() != "a\n" || retry.Body.String() != "a\n" || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("first flushed=%v %q, retry %q replayed=%q; want the stream replayed", first.Flushed, first.Body, retry.Body, retry.Header().Get("Idempotent-Replayed"))
	}
	const other = "5a0d7d4e-2b7d-4a53-9b0e-0c1f3f2d9a12"
	over := serve(mw, req("POST", "/x?more=1234567890", other, `{}`))
	overRetry := serve(mw, req("POST", "/x?more=1234567890", other, `{}`))
	if over.Body.Len() != 12 || overRetry.Code != http.StatusConflict || !strings.Contains(overRetry.Body.String(), idem.CodeResponseNotStored) || n.Load() != 2 {
		t.Fatalf("over the limit: client got %q, retry %d %q after %d executions; want response_not_stored", over.Body, overRetry.Code, overRetry.Body, n.Load())
	}
}

// The trailers of a response that passes through reach the client: they are set in
// the header map after the body, once the header went to the client.
func TestAPassThroughResponsesTrailersReachTheClient(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	srv := httptest.NewServer(b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Declared")
		_, _ = io.WriteString(w, "body")
		http.NewResponseController(w).Flush()
		w.Header().Set("X-Declared", "d")
		w.Header().Set(http.TrailerPrefix+"X-Undeclared", "u")
	})))
	defer srv.Close()
	r, _ := http.NewRequest("POST", srv.URL+"/x", strings.NewReader(`{}`))
	r.Header.Set("Authorization", "Bearer alice")
	r.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Trailer.Get("X-Declared") != "d" || resp.Trailer.Get("X-Undeclared") != "u" {
		t.Fatalf("trailers %v, want X-Declared: d and X-Undeclared: u", resp.Trailer)
	}
}

// Outside the middleware, a caller of Guard.Begin that does not know whether its
// operation happened ends the claim with SetOutcomeUnknown and Complete: under the
// policy unknown every repeat gets ErrOutcomeUnknown; under take_over the repeat takes
// the record over under the same record id.
func TestGuardCallersSettleAnUnknownOutcomeWithComplete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		policy idem.LapsePolicy
		check  func(t *testing.T, h *idem.Handle, err error, firstID string)
	}{
		{idem.LapseUnknown, func(t *testing.T, h *idem.Handle, err error, _ string) {
			if !errors.Is(err, idem.ErrOutcomeUnknown) {
				t.Fatalf("a repeat under the policy unknown: %v, want ErrOutcomeUnknown", err)
			}
		}},
		{idem.LapseTakeOver, func(t *testing.T, h *idem.Handle, err error, firstID string) {
			if err != nil || h == nil || !h.TookOver() || h.RecordID() != firstID {
				t.Fatalf("a repeat under take_over: %v, took over %v; want the record taken over under id %s", err, h != nil && h.TookOver(), firstID)
			}
			_ = h.Release()
		}},
	} {
		g := idem.NewGuard(idem.GuardConfig{Store: memory.New(), Logger: slog.New(slog.DiscardHandler)})
		call := idem.Call{Scope: "alice", Key: "key-unknown-1", Fingerprint: idem.FingerprintInput("op", []byte("x")), OnLapse: tc.policy}
		h, _, err := g.Begin(ctx, call)
		if err != nil {
			t.Fatal(err)
		}
		h.SetOutcomeUnknown()
		if err := h.Complete(); err != nil {
			t.Fatalf("Complete after SetOutcomeUnknown: %v", err)
		}
		again, _, err := g.Begin(ctx, call)
		tc.check(t, again, err, h.RecordID())
	}
}
