package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/idem-go/idem"
)

const key = "4f1c6a7e-2b7d-4a53-9b0e-0c1f3f2d9a11"

func TestReplayReturnsSameResponse(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := &counter{}
	mw := b.mw.Handler(h)

	first := serve(mw, req("POST", "/v1/charges", key, `{"amount":2000}`))
	second := serve(mw, req("POST", "/v1/charges", key, `{"amount": 2000}`))

	if h.n.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", h.n.Load())
	}
	if first.Code != 201 || second.Code != 201 {
		t.Fatalf("statuses %d, %d; want 201, 201", first.Code, second.Code)
	}
	if first.Body.String() != second.Body.String() {
		t.Errorf("replayed body %q, want %q", second.Body, first.Body)
	}
	for _, hdr := range []string{"Content-Type", "Location"} {
		if got, want := second.Header().Get(hdr), first.Header().Get(hdr); got != want {
			t.Errorf("replayed %s = %q, want %q", hdr, got, want)
		}
	}
	if got := second.Header().Get("Idempotent-Replayed"); got != "true" {
		t.Errorf("Idempotent-Replayed = %q, want true", got)
	}
	if first.Header().Get("Idempotent-Replayed") != "" {
		t.Error("the original response must not say it is replayed")
	}
	for _, hdr := range []string{"Set-Cookie", "X-Request-Note"} {
		if first.Header().Get(hdr) == "" {
			t.Errorf("the original response lacks %s", hdr)
		}
		if second.Header().Get(hdr) != "" {
			t.Errorf("the replay carries %s, which is not on the allow-list", hdr)
		}
	}
}

func TestEveryKeyedResponseEchoesTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(&counter{})
	quoted := `"` + key + `"`
	for name, w := range map[string]*httptest.ResponseRecorder{
		"original": serve(mw, req("POST", "/a", quoted, `{}`)),
		"replay":   serve(mw, req("POST", "/a", quoted, `{}`)),
		"mismatch": serve(mw, req("POST", "/b", quoted, `{}`)),
		"invalid":  serve(mw, req("POST", "/a", "short", `{}`)),
	} {
		want := quoted
		if name == "invalid" {
			want = "short"
		}
		if got := w.Header().Get("Idempotency-Key"); got != want {
			t.Errorf("%s: Idempotency-Key = %q, want %q as received", name, got, want)
		}
	}
}

func TestHandlerRereadsTheBody(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var got string
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = string(body)
		if h := idem.FromContext(r.Context()); h == nil || h.Key() != key || h.Scope() != "alice" {
			t.Errorf("handle = %+v", h)
		}
		w.WriteHeader(201)
	}))
	serve(mw, req("POST", "/v1/charges", key, `{"amount":2000}`))
	if got != `{"amount":2000}` {
		t.Errorf("handler read %q", got)
	}
}

func TestConcurrentDuplicatesExecuteOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	entered, gate := make(chan struct{}), make(chan struct{})
	var runs sync.Map
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Store(r, true)
		close(entered) // a second execution would panic here
		<-gate
		w.WriteHeader(201)
		io.WriteString(w, "charged")
	}))
	const n = 100
	results := make(chan *httptest.ResponseRecorder, n)
	for range n {
		go func() { results <- serve(mw, req("POST", "/v1/charges", key, `{"amount":1}`)) }()
	}
	<-entered
	var got []*httptest.ResponseRecorder
	for range n - 1 { // everyone but the executor answers while it is held
		got = append(got, <-results)
	}
	close(gate)
	got = append(got, <-results)

	var created, inProgress int
	for _, w := range got {
		switch w.Code {
		case 201:
			created++
		case 409:
			inProgress++
			if !strings.Contains(w.Body.String(), idem.CodeRequestInProgress) || w.Header().Get("Retry-After") != "1" {
				t.Errorf("409 without request_in_progress and Retry-After: %v %s", w.Header(), w.Body)
			}
		default:
			t.Errorf("unexpected %d %s", w.Code, w.Body)
		}
	}
	if created != 1 || inProgress != n-1 {
		t.Errorf("created %d, in progress %d; want 1, %d", created, inProgress, n-1)
	}
	if w := serve(mw, req("POST", "/v1/charges", key, `{"amount":1}`)); w.Code != 201 || w.Body.String() != "charged" {
		t.Errorf("after completion: %d %s, want the replay", w.Code, w.Body)
	}
}

func TestConcurrentDuplicatesGetReplayOrInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := &counter{}
	mw := b.mw.Handler(h)
	const n = 100
	var wg sync.WaitGroup
	codes := make([]int, n)
	replayed := make([]bool, n)
	for i := range n {
		wg.Go(func() {
			w := serve(mw, req("POST", "/v1/charges", key, `{"amount":1}`))
			codes[i], replayed[i] = w.Code, w.Header().Get("Idempotent-Replayed") == "true"
			if w.Code == 409 && w.Header().Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After")
			}
		})
	}
	wg.Wait()
	if h.n.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", h.n.Load())
	}
	originals := 0
	for i := range n {
		switch {
		case codes[i] == 201 && !replayed[i]:
			originals++
		case codes[i] == 201 || codes[i] == 409:
		default:
			t.Errorf("unexpected status %d", codes[i])
		}
	}
	if originals != 1 {
		t.Errorf("%d original responses, want 1", originals)
	}
}

func TestKeyReusedWithOtherParameters(t *testing.T) {
	t.Parallel()
	tests := []struct {
		profile     idem.Profile
		status      int
		contentType string
		body        string
	}{
		{idem.ProfileSeed, 409, "application/json",
			`{"error":{"type":"idempotency_error","code":"key_reused","message":"Idempotency key already used with different request parameters."}}` + "\n"},
		{idem.ProfileIETF, 422, "application/problem+json",
			`{"type":"https://idem.dev/problems/key_reused","title":"Idempotency key reused","status":422,"detail":"Idempotency key already used with different request parameters.","code":"key_reused"}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.profile.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *idem.Config) { c.Profile = tt.profile })
			h := &counter{}
			mw := b.mw.Handler(h)
			serve(mw, req("POST", "/v1/charges", key, `{"amount":2000}`))
			w := serve(mw, req("POST", "/v1/charges", key, `{"amount":3000}`))
			if w.Code != tt.status || w.Header().Get("Content-Type") != tt.contentType || w.Body.String() != tt.body {
				t.Errorf("got %d %q %s", w.Code, w.Header().Get("Content-Type"), w.Body)
			}
			if w := serve(mw, req("POST", "/v1/charges", key, `{"amount":2000}`)); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "true" {
				t.Errorf("the record must be untouched by the mismatch: %d", w.Code)
			}
			if h.n.Load() != 1 {
				t.Errorf("handler ran %d times", h.n.Load())
			}
		})
	}
}

func TestReleasingStatusesLetTheRetryExecute(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 401, 403, 404, 409, 422, 429, 500, 503} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			h := &counter{status: status}
			mw := b.mw.Handler(h)
			first := serve(mw, req("POST", "/x", key, `{}`))
			second := serve(mw, req("POST", "/x", key, `{}`))
			if first.Code != status || second.Code != status || h.n.Load() != 2 {
				t.Errorf("statuses %d, %d and %d executions; want %d twice, executed twice", first.Code, second.Code, h.n.Load(), status)
			}
			if second.Header().Get("Idempotent-Replayed") != "" {
				t.Error("a released response must not be replayed")
			}
		})
	}
}

func TestCardDeclinedIsStored(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := &counter{status: http.StatusPaymentRequired}
	mw := b.mw.Handler(h)
	serve(mw, req("POST", "/x", key, `{}`))
	w := serve(mw, req("POST", "/x", key, `{}`))
	if w.Code != 402 || w.Header().Get("Idempotent-Replayed") != "true" || h.n.Load() != 1 {
		t.Errorf("402: got %d replayed=%q after %d executions", w.Code, w.Header().Get("Idempotent-Replayed"), h.n.Load())
	}
}

func TestPanicReleasesTheKeyAndIsRaisedAgain(t *testing.T) {
	t.Parallel()
	for _, value := range []any{http.ErrAbortHandler, "boom"} {
		t.Run(fmt.Sprint(value), func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			panicking := true
			mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if panicking {
					w.WriteHeader(201)
					panic(value)
				}
				w.WriteHeader(201)
			}))
			func() {
				defer func() {
					if got := recover(); got != value {
						t.Errorf("recovered %v, want %v", got, value)
					}
				}()
				serve(mw, req("POST", "/x", key, `{}`))
			}()
			if b.store.releases.Load() != 1 {
				t.Errorf("%d releases, want 1", b.store.releases.Load())
			}
			panicking = false
			if w := serve(mw, req("POST", "/x", key, `{}`)); w.Code != 201 || w.Header().Get("Idempotent-Replayed") != "" {
				t.Errorf("retry after panic: %d replayed=%q, want a fresh execution", w.Code, w.Header().Get("Idempotent-Replayed"))
			}
		})
	}
}

func TestHandlerOverridesTheStorePolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		status    int
		store     bool
		wantCalls int64
	}{
		{"stores a 500", 500, true, 1},
		{"releases a 201", 201, false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			var n int64
			mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n++
				idem.FromContext(r.Context()).SetStore(tt.store)
				w.WriteHeader(tt.status)
			}))
			serve(mw, req("POST", "/x", key, `{}`))
			w := serve(mw, req("POST", "/x", key, `{}`))
			if w.Code != tt.status || n != tt.wantCalls {
				t.Errorf("got %d after %d executions, want %d after %d", w.Code, n, tt.status, tt.wantCalls)
			}
		})
	}
}

func TestBodyOverTheLimitIsRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		chunked bool
	}{{"content length", false}, {"chunked", true}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *idem.Config) { c.MaxBodyBytes = 16 })
			h := &counter{}
			mw := b.mw.Handler(h)
			r := req("POST", "/x", key, strings.Repeat("a", 17))
			if tt.chunked {
				r.ContentLength = -1
				r.Body = io.NopCloser(strings.NewReader(strings.Repeat("a", 17)))
			}
			w := serve(mw, r)
			wantCode(t, w, 413, idem.CodeBodyTooLarge)
			if tt.chunked && w.Header().Get("Connection") != "close" {
				t.Error("a chunked body refused mid-way must close the connection")
			}
			if b.store.calls() != 0 || h.n.Load() != 0 {
				t.Errorf("%d store calls and %d executions for a refused body", b.store.calls(), h.n.Load())
			}
			// A body exactly at the limit is accepted.
			if w := serve(mw, req("POST", "/y", key, strings.Repeat("a", 16))); w.Code != 201 {
				t.Errorf("body at the limit: %d", w.Code)
			}
		})
	}
}

// A client that announces a large body and sends little of it costs memory in
// proportion to what it sent, never to what Content-Length promised (SPEC §15).
// Not parallel: it measures the process's allocations.
func TestBodyMemoryFollowsTheBytesReceivedNotContentLength(t *testing.T) {
	b := setup(t, nil)
	mw := b.mw.Handler(&counter{})
	const requests, announced, sent = 16, 1 << 20, 1 << 10
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range requests {
		r := req("POST", "/x", key, "")
		r.ContentLength = announced
		// The client sends 1 KiB of the 1 MiB it announced, then the connection breaks.
		r.Body = io.NopCloser(io.MultiReader(strings.NewReader(strings.Repeat("a", sent)),
			iotest.ErrReader(io.ErrUnexpectedEOF)))
		wantCode(t, serve(mw, r), 400, idem.CodeBodyUnreadable)
	}
	runtime.ReadMemStats(&after)
	// Announcing decides nothing: 16 requests announcing 1 MiB each may not cost 16 MiB.
	if got := after.TotalAlloc - before.TotalAlloc; got > requests*announced/8 {
		t.Errorf("%d requests that each sent %d bytes of the %d they announced allocated %d bytes, want under %d",
			requests, sent, announced, got, requests*announced/8)
	}
}

func TestMethodTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		method, key string
		status      int
		keyed       bool
	}{
		{"POST", "", 400, false},
		{"PATCH", "", 400, false},
		{"POST", key, 201, true},
		{"PATCH", key, 201, true},
		{"PUT", "", 201, false},
		{"DELETE", "", 201, false},
		{"PUT", key, 201, true},
		{"DELETE", key, 201, true},
		{"GET", key, 201, false},
		{"HEAD", key, 201, false},
		{"OPTIONS", key, 201, false},
		{"GET", "x", 201, false}, // an invalid key on a safe method is ignored too
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.key, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			mw := b.mw.Handler(&counter{})
			w := serve(mw, req(tt.method, "/x", tt.key, ""))
			if w.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.status, w.Body)
			}
			if tt.status == 400 && !strings.Contains(w.Body.String(), idem.CodeKeyRequired) {
				t.Errorf("missing key: %s", w.Body)
			}
			if keyed := b.store.claims.Load() > 0; keyed != tt.keyed {
				t.Errorf("claimed = %v, want %v", keyed, tt.keyed)
			}
			if !tt.keyed && w.Header().Get("Idempotency-Key") != "" {
				t.Error("an unkeyed request's response must not carry Idempotency-Key")
			}
		})
	}
}

func TestInvalidKeysAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(&counter{})
	for name, r := range map[string]*http.Request{
		"too short": req("POST", "/x", "1234567", "{}"),
		"list":      req("POST", "/x", key+", "+key, "{}"),
		"two headers": func() *http.Request {
			r := req("POST", "/x", key, "{}")
			r.Header.Add("Idempotency-Key", key)
			return r
		}(),
		"parameter": req("POST", "/x", `"`+key+`";a=1`, "{}"),
	} {
		w := serve(mw, r)
		if w.Code != 400 || !strings.Contains(w.Body.String(), idem.CodeKeyInvalid) {
			t.Errorf("%s: %d %s", name, w.Code, w.Body)
		}
		if strings.Contains(w.Body.String(), key) {
			t.Errorf("%s: the error body reveals the key", name)
		}
	}
	if b.store.calls() != 0 {
		t.Errorf("%d store calls for invalid keys", b.store.calls())
	}
}

// A key that is too short is refused with a message that says the minimum, so that a
// client that sent "k4" learns what to send.
func TestShortKeyErrorSaysTheMinimum(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	w := serve(b.mw.Handler(&counter{}), req("POST", "/x", "k4", "{}"))
	want := "The Idempotency-Key header is invalid: key is 2 characters, at least 8 required."
	if w.Code != 400 || !strings.Contains(w.Body.String(), `"code":"key_invalid"`) || !strings.Contains(w.Body.String(), want) {
		t.Fatalf("POST with key k4 = %d %s, want 400 key_invalid saying %q", w.Code, w.Body, want)
	}
}

func TestRouteOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	t.Run("optional POST passes a request without key", func(t *testing.T) {
		mw := b.mw.Route(idem.RouteOptions{Requirement: idem.KeyOptional})(&counter{})
		if w := serve(mw, req("POST", "/x", "", "{}")); w.Code != 201 {
			t.Errorf("%d", w.Code)
		}
	})
	t.Run("off ignores the key", func(t *testing.T) {
		mw := b.mw.Route(idem.RouteOptions{Requirement: idem.KeyOff})(&counter{})
		before := b.store.claims.Load()
		serve(mw, req("POST", "/x", "x", "{}"))
		if b.store.claims.Load() != before {
			t.Error("a route with the key off claimed")
		}
	})
	t.Run("required PUT refuses a request without key", func(t *testing.T) {
		mw := b.mw.Route(idem.RouteOptions{Requirement: idem.KeyRequired})(&counter{})
		wantCode(t, serve(mw, req("PUT", "/x", "", "{}")), 400, idem.CodeKeyRequired)
	})
	t.Run("route store policy", func(t *testing.T) {
		h := &counter{status: 500}
		mw := b.mw.Route(idem.RouteOptions{StorePolicy: func(int) bool { return true }})(h)
		serve(mw, req("POST", "/p", "route-policy-key", "{}"))
		serve(mw, req("POST", "/p", "route-policy-key", "{}"))
		if h.n.Load() != 1 {
			t.Errorf("%d executions, want the 500 stored", h.n.Load())
		}
	})
	t.Run("route TTL", func(t *testing.T) {
		h := &counter{}
		mw := b.mw.Route(idem.RouteOptions{TTL: time.Hour})(h)
		serve(mw, req("POST", "/t", "route-ttl-key", "{}"))
		b.clock.Advance(59 * time.Minute)
		serve(mw, req("POST", "/t", "route-ttl-key", "{}"))
		if h.n.Load() != 1 {
			t.Fatalf("replay within the TTL executed again")
		}
		b.clock.Advance(time.Minute)
		serve(mw, req("POST", "/t", "route-ttl-key", "{}"))
		if h.n.Load() != 2 {
			t.Errorf("a request after the route's TTL must execute afresh")
		}
	})
}

func TestScopeIsRequired(t *testing.T) {
	t.Parallel()
	tests := map[string]func(*http.Request) (string, error){
		"empty": func(*http.Request) (string, error) { return "", nil },
		"error": func(*http.Request) (string, error) { return "x", errors.New("no") },
	}
	for name, scope := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *idem.Config) { c.Scope = scope })
			h := &counter{}
			w := serve(b.mw.Handler(h), req("POST", "/x", key, "{}"))
			wantCode(t, w, 401, idem.CodeScopeRequired)
			if b.store.calls() != 0 || h.n.Load() != 0 {
				t.Errorf("%d store calls, %d executions", b.store.calls(), h.n.Load())
			}
		})
	}
	t.Run("missing bearer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		r := req("POST", "/x", key, "{}")
		r.Header.Del("Authorization")
		wantCode(t, serve(b.mw.Handler(&counter{}), r), 401, idem.CodeScopeRequired)
		if b.store.calls() != 0 {
			t.Errorf("%d store calls", b.store.calls())
		}
	})
}

func TestKeysOfOnePrincipalAreNeverReplayedToAnother(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := &counter{}
	mw := b.mw.Handler(h)
	serve(mw, req("POST", "/x", key, "{}"))
	r := req("POST", "/x", key, "{}")
	r.Header.Set("Authorization", "Bearer bob")
	if w := serve(mw, r); w.Header().Get("Idempotent-Replayed") != "" || h.n.Load() != 2 {
		t.Error("bob got alice's response")
	}
}

func TestStoreUnavailableThenRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	h := &counter{}
	mw := b.mw.Handler(h)
	b.store.down.Store(true)
	w := serve(mw, req("POST", "/x", key, "{}"))
	wantCode(t, w, 503, idem.CodeStoreUnavailable)
	if w.Header().Get("Retry-After") != "1" || w.Header().Get("Idempotency-Key") != key {
		t.Errorf("503 headers: %v", w.Header())
	}
	if h.n.Load() != 0 {
		t.Error("the handler ran without a claim")
	}
	b.store.down.Store(false)
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 201 || h.n.Load() != 1 {
		t.Errorf("after recovery: %d, %d executions", w.Code, h.n.Load())
	}
}

func TestStoreFailingAtCompletionStillSendsTheResponse(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.store.down.Store(true) // the store goes away while the handler runs
		w.WriteHeader(201)
	}))
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 201 {
		t.Errorf("got %d, want the handler's 201: its effects happened", w.Code)
	}
}

func TestRetryAfterIsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.RetryAfter = 2500 * time.Millisecond })
	b.store.down.Store(true)
	if got := serve(b.mw.Handler(&counter{}), req("POST", "/x", key, "{}")).Header().Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After = %q, want 3 (rounded up)", got)
	}
}

func TestInFlightWaitReplaysTheFirstResponse(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.InFlightWait = time.Minute })
	entered, gate := make(chan struct{}), make(chan struct{})
	var n int
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		close(entered)
		<-gate
		w.WriteHeader(201)
		io.WriteString(w, "first")
	}))
	waiting := make(chan struct{})
	idem.OnWait(b.mw, func() { close(waiting) })
	go serve(mw, req("POST", "/x", key, "{}"))
	<-entered
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- serve(mw, req("POST", "/x", key, "{}")) }()
	<-waiting
	close(gate)
	w := <-second
	if w.Code != 201 || w.Body.String() != "first" || w.Header().Get("Idempotent-Replayed") != "true" || n != 1 {
		t.Errorf("waiting duplicate got %d %q after %d executions", w.Code, w.Body, n)
	}
}

func TestInFlightWaitClaimsAReleasedKey(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.InFlightWait = time.Minute })
	entered, gate := make(chan struct{}), make(chan struct{})
	var calls sync.WaitGroup
	var n int
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		if n == 1 {
			close(entered)
			<-gate
			w.WriteHeader(503) // released
			return
		}
		w.WriteHeader(201)
	}))
	waiting := make(chan struct{})
	idem.OnWait(b.mw, func() { close(waiting) })
	calls.Go(func() { serve(mw, req("POST", "/x", key, "{}")) })
	<-entered
	second := make(chan *httptest.ResponseRecorder)
	go func() { second <- serve(mw, req("POST", "/x", key, "{}")) }()
	<-waiting
	close(gate)
	if w := <-second; w.Code != 201 || n != 2 {
		t.Errorf("waiting duplicate got %d after %d executions, want to execute itself", w.Code, n)
	}
	calls.Wait()
}

func TestLogsNeverContainTheKeyNorTheBody(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.store.down.Store(true)
		w.WriteHeader(201)
		io.WriteString(w, "secret-response")
	}))
	serve(mw, req("POST", "/x", key, `{"card":"secret-body"}`))
	serve(mw, req("POST", "/x", key, `{"card":"secret-body"}`))
	logs := b.logs.String()
	if !strings.Contains(logs, "key_hash=") {
		t.Fatalf("expected store failures to be logged with a key hash:\n%s", logs)
	}
	for _, secret := range []string{key, "secret-body", "secret-response"} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain %q:\n%s", secret, logs)
		}
	}
}

func TestInFlightWaitEndsWithInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.InFlightWait = 20 * time.Millisecond })
	h := newHeld()
	mw := b.mw.Handler(h)
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/x", key, "{}")); close(done) }()
	<-h.entered
	w := serve(mw, req("POST", "/x", key, "{}"))
	wantCode(t, w, 409, idem.CodeRequestInProgress)
	if w.Header().Get("Retry-After") != "1" || b.store.gets.Load() == 0 {
		t.Errorf("Retry-After %q after %d polls", w.Header().Get("Retry-After"), b.store.gets.Load())
	}
	close(h.gate)
	<-done
}

func TestClientGoingAwayDoesNotAbandonTheOperation(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	started, release, ctxErr := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	var runs atomic.Int64
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		<-release
		ctxErr <- r.Context().Err()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"ch_1"}`)
	}))

	clientCtx, hangUp := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve(mw, req("POST", "/v1/charges", key, `{"amount":2000}`).WithContext(clientCtx))
	}()
	<-started
	hangUp() // the client disconnects while the handler runs
	close(release)
	<-done

	if err := <-ctxErr; err != nil {
		t.Fatalf("the handler's context ended with the client: %v", err)
	}
	retry := serve(mw, req("POST", "/v1/charges", key, `{"amount":2000}`))
	if retry.Code != http.StatusCreated || retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry got %d (replayed %q), want the stored 201", retry.Code, retry.Header().Get("Idempotent-Replayed"))
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

// Every answer the middleware produces itself to a keyed request carries the key as
// received (SPEC §6), and the retryable ones Retry-After (SPEC §9).
func TestEveryMiddlewareErrorEchoesTheKey(t *testing.T) {
	t.Parallel()
	type answer struct {
		w          *httptest.ResponseRecorder
		status     int
		code       string
		retryAfter bool
	}
	answers := map[string]answer{}

	b := setup(t, func(c *idem.Config) { c.MaxBodyBytes = 16 })
	h := newHeld()
	mw := b.mw.Handler(h)
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/held", key, "{}")); close(done) }()
	<-h.entered
	answers["in progress"] = answer{serve(mw, req("POST", "/held", key, "{}")), 409, idem.CodeRequestInProgress, true}
	close(h.gate)
	<-done

	answers["body too large"] = answer{serve(mw, req("POST", "/big", key, strings.Repeat("a", 17))), 413, idem.CodeBodyTooLarge, false}
	noBearer := req("POST", "/x", key, "{}")
	noBearer.Header.Del("Authorization")
	answers["no scope"] = answer{serve(mw, noBearer), 401, idem.CodeScopeRequired, false}

	unstored := setup(t, func(c *idem.Config) { c.MaxResponseBytes = 4 })
	big := unstored.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, "more than four bytes")
	}))
	serve(big, req("POST", "/unstored", key, "{}"))
	answers["response not stored"] = answer{serve(big, req("POST", "/unstored", key, "{}")), 409, idem.CodeResponseNotStored, false}

	down := setup(t, nil)
	down.store.down.Store(true)
	answers["store unavailable"] = answer{serve(down.mw.Handler(&counter{}), req("POST", "/x", key, "{}")), 503, idem.CodeStoreUnavailable, true}

	for name, a := range answers {
		t.Run(name, func(t *testing.T) {
			wantCode(t, a.w, a.status, a.code)
			if got := a.w.Header().Get("Idempotency-Key"); got != key {
				t.Errorf("Idempotency-Key = %q, want %q", got, key)
			}
			if got := a.w.Header().Get("Retry-After"); (got != "") != a.retryAfter {
				t.Errorf("Retry-After = %q; want one: %v", got, a.retryAfter)
			}
		})
	}
}

// A replay carries every header of the default allow-list and none of those that
// belong to one response or one connection (SPEC §6): Set-Cookie, Date, hop-by-hop.
func TestReplayCarriesTheDefaultStoredHeadersOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	stored := map[string]string{
		"Content-Type": "application/json", "Content-Encoding": "identity", "Content-Language": "en",
		"Content-Disposition": "inline", "Location": "/v1/charges/ch_1", "Etag": `"v1"`,
		"Last-Modified": "Sun, 01 Mar 2026 12:00:00 GMT", "Link": `</v1/charges>; rel="collection"`,
		"Cache-Control": "no-store", "Vary": "Authorization",
	}
	never := map[string]string{
		"Set-Cookie": "session=1", "Date": "Sun, 01 Mar 2026 12:00:00 GMT", "Connection": "keep-alive",
		"Keep-Alive": "timeout=5", "Proxy-Connection": "keep-alive", "Proxy-Authenticate": "Basic",
		"Trailer": "X-Checksum", "Upgrade": "h2c", "Te": "trailers", "X-Unlisted": "1",
	}
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, hs := range []map[string]string{stored, never} {
			for k, v := range hs {
				w.Header().Set(k, v)
			}
		}
		w.WriteHeader(201)
		io.WriteString(w, `{"id":"ch_1"}`)
	}))
	serve(mw, req("POST", "/x", key, "{}"))
	replay := serve(mw, req("POST", "/x", key, "{}"))
	if replay.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("not a replay: %d %v", replay.Code, replay.Header())
	}
	for k, v := range stored {
		if got := replay.Header().Get(k); got != v {
			t.Errorf("replayed %s = %q, want %q", k, got, v)
		}
	}
	for k := range never {
		if got := replay.Header().Values(k); len(got) != 0 {
			t.Errorf("the replay carries %s: %q", k, got)
		}
	}
}
