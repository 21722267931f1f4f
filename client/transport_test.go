package client

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// attemptLog is what a test server saw of each attempt.
type attemptLog struct {
	method, key, body, contentLength string
	hasKey                           bool
}

// flakyServer fails the first `failures` requests with status fail, then answers ok.
func flakyServer(t *testing.T, failures, fail, ok int) (*httptest.Server, func() []attemptLog) {
	var (
		mu   sync.Mutex
		seen []attemptLog
	)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, attemptLog{r.Method, r.Header.Get(HeaderKey), string(b), r.Header.Get("Content-Length"), len(r.Header.Values(HeaderKey)) > 0})
		n := len(seen)
		mu.Unlock()
		if n <= failures {
			w.WriteHeader(fail)
			return
		}
		w.WriteHeader(ok)
	}))
	t.Cleanup(ts.Close)
	return ts, func() []attemptLog {
		mu.Lock()
		defer mu.Unlock()
		return append([]attemptLog(nil), seen...)
	}
}

func fastClient(t *Transport) *http.Client {
	if t.Backoff == nil {
		t.Backoff = noBackoff
	}
	if t.Logger == nil {
		t.Logger = quietLogger()
	}
	return NewClient(t)
}

// Every attempt of a logical request sends the same key and the same body bytes with
// their Content-Length, whether the body can be rebuilt with GetBody, has to be
// buffered, or is absent (nil, or http.NoBody as http.NewRequest makes of an empty
// reader: the wire request then holds the key under its lower-case name, see
// Transport, and the caller still sees it under the canonical one).
func TestBodyAndKeyAreTheSameOnEveryAttempt(t *testing.T) {
	t.Parallel()
	const body = `{"amount": 2000, "currency": "usd", "customer_id": "cust_abc123"}`
	for name, tc := range map[string]struct {
		newReq func(url string) *http.Request
		body   string
	}{
		"GetBody": {func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
			return req
		}, body},
		"one-shot reader": {func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url, io.MultiReader(strings.NewReader(body)))
			if req.GetBody != nil || req.ContentLength != 0 {
				t.Fatal("want a body that cannot be rebuilt, of unknown length")
			}
			return req
		}, body},
		"PATCH": {func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPatch, url, io.NopCloser(strings.NewReader(body)))
			return req
		}, body},
		"no body": {func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url, nil)
			return req
		}, ""},
		"NoBody": {func(url string) *http.Request {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(""))
			return req
		}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ts, seen := flakyServer(t, 2, http.StatusBadGateway, http.StatusCreated)
			resp, err := fastClient(&Transport{}).Do(tc.newReq(ts.URL))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			attempts := seen()
			if len(attempts) != 3 || Attempts(resp) != 3 {
				t.Fatalf("%d attempts at the server, Attempts = %d; want 3", len(attempts), Attempts(resp))
			}
			length := strconv.Itoa(len(tc.body))
			for i, a := range attempts {
				if a.body != tc.body || a.contentLength != length || a.key != attempts[0].key || !uuidV4.MatchString(a.key) {
					t.Fatalf("attempt %d: %+v; want the body, Content-Length %s and the key of attempt 0 (%s)", i, a, length, attempts[0].key)
				}
			}
			if got := resp.Request.Header.Get(HeaderKey); got != attempts[0].key {
				t.Fatalf("resp.Request carries key %q, the server saw %q", got, attempts[0].key)
			}
		})
	}
}

// A caller's key is sent unchanged; idempotent methods are retried and get no key.
func TestCallerKeyIsKeptAndIdempotentMethodsGetNoKey(t *testing.T) {
	t.Parallel()
	t.Run("caller key", func(t *testing.T) {
		t.Parallel()
		ts, seen := flakyServer(t, 1, http.StatusServiceUnavailable, http.StatusCreated)
		req, _ := http.NewRequest(http.MethodPost, ts.URL, strings.NewReader("{}"))
		req.Header.Set(HeaderKey, `"caller-key-1"`)
		resp, err := fastClient(&Transport{}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for _, a := range seen() {
			if a.key != `"caller-key-1"` {
				t.Fatalf("sent key %q, want the caller's", a.key)
			}
		}
		if req.Header.Get(HeaderKey) != `"caller-key-1"` {
			t.Fatal("the caller's request was modified")
		}
	})
	for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			ts, seen := flakyServer(t, 1, http.StatusServiceUnavailable, http.StatusOK)
			req, _ := http.NewRequest(method, ts.URL, nil)
			resp, err := fastClient(&Transport{}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			attempts := seen()
			if resp.StatusCode != http.StatusOK || len(attempts) != 2 {
				t.Fatalf("%d after %d attempts, want 200 after 2", resp.StatusCode, len(attempts))
			}
			for _, a := range attempts {
				if a.hasKey {
					t.Fatalf("%s sent with a key", method)
				}
			}
		})
	}
}

// A POST whose key generation is disabled is not retried once it may have reached
// the server, but is when its connection could not even be made.
func TestKeylessPostIsRetriedOnlyWhenNeverSent(t *testing.T) {
	t.Parallel()
	noKey := func() string { return "" }
	t.Run("answered", func(t *testing.T) {
		t.Parallel()
		ts, seen := flakyServer(t, 1, http.StatusServiceUnavailable, http.StatusCreated)
		req, _ := http.NewRequest(http.MethodPost, ts.URL, strings.NewReader("{}"))
		resp, err := fastClient(&Transport{NewKey: noKey}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || Attempts(resp) != 1 || len(seen()) != 1 || seen()[0].hasKey {
			t.Fatalf("%d after %d attempt(s), want the 503 after 1 without a key", resp.StatusCode, Attempts(resp))
		}
	})
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // nothing listens there now: every dial is refused
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr, strings.NewReader("{}"))
		// Refused attempts are waits, bounded by MaxWait, not by MaxAttempts.
		const maxWait = 200 * time.Millisecond
		backoff := func(int, *http.Response) time.Duration { return 10 * time.Millisecond }
		_, err = fastClient(&Transport{NewKey: noKey, MaxAttempts: 1, MaxWait: maxWait, Backoff: backoff}).Do(req)
		var re *RetryError
		var op *net.OpError
		if !errors.As(err, &re) || re.Attempts < 3 || !errors.As(err, &op) || op.Op != "dial" || re.Limit != LimitMaxWait ||
			re.Elapsed < maxWait || !strings.Contains(err.Error(), "refused connections for Transport.MaxWait (200ms)") {
			t.Fatalf("error %v, want several refused attempts ending with a dial error at Transport.MaxWait", err)
		}
	})
}

// After MaxAttempts the Transport gives up with "giving up after N attempt(s)",
// naming the setting, wrapping the last answer.
func TestMaxAttemptsEndsRetries(t *testing.T) {
	t.Parallel()
	ts, seen := flakyServer(t, 100, http.StatusServiceUnavailable, http.StatusOK)
	req, _ := http.NewRequest(http.MethodPut, ts.URL+"/v1/orders/ord_1", strings.NewReader("{}"))
	_, err := fastClient(&Transport{MaxAttempts: 3}).Do(req)
	prefix := "PUT " + ts.URL + "/v1/orders/ord_1 giving up after 3 attempt(s) in "
	cause := ": Transport.MaxAttempts (3) reached; last attempt: 503 Service Unavailable"
	var se *StatusError
	var re *RetryError
	if err == nil || !strings.Contains(err.Error(), prefix) || !strings.Contains(err.Error(), cause) || !errors.As(err, &se) ||
		se.StatusCode != 503 || !errors.As(err, &re) || re.Limit != LimitMaxAttempts || len(seen()) != 3 {
		t.Fatalf("error %v after %d requests; want %q…%q wrapping a StatusError", err, len(seen()), prefix, cause)
	}
}

// A Retry-After longer than MaxRetryAfter is capped, in both forms.
func TestRetryAfterIsCappedByMaxRetryAfter(t *testing.T) {
	t.Parallel()
	const limit = 50 * time.Millisecond
	for name, value := range map[string]string{
		"seconds":   "3600",
		"HTTP-date": time.Now().Add(time.Hour).UTC().Format(http.TimeFormat),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var (
				mu    sync.Mutex
				times []time.Time
			)
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				times = append(times, time.Now())
				n := len(times)
				mu.Unlock()
				if n == 1 {
					w.Header().Set("Retry-After", value)
					w.WriteHeader(http.StatusTooManyRequests)
				}
			}))
			t.Cleanup(ts.Close)
			resp, err := fastClient(&Transport{MaxRetryAfter: limit}).Get(ts.URL)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if waited := times[1].Sub(times[0]); waited < limit || waited > 10*time.Second {
				t.Fatalf("waited %v, want the Retry-After capped to %v", waited, limit)
			}
		})
	}
}

// trackedBody records whether it was read to the end and closed.
type trackedBody struct {
	io.Reader
	eof, closed bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.Reader.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *trackedBody) Close() error { b.closed = true; return nil }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The responses the Transport retries are drained and closed; the one it returns is
// left to the caller.
func TestDiscardedResponsesAreDrainedAndClosed(t *testing.T) {
	t.Parallel()
	var bodies []*trackedBody
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		b := &trackedBody{Reader: strings.NewReader(`{"error":{"code":"request_in_progress"}}`)}
		bodies = append(bodies, b)
		status := http.StatusConflict
		if len(bodies) == 3 {
			status = http.StatusCreated
		}
		return &http.Response{StatusCode: status, Header: http.Header{"Content-Type": {"application/json"}}, Body: b, Request: r}, nil
	})
	req, _ := http.NewRequest(http.MethodPost, "http://api.test/v1/charges", strings.NewReader("{}"))
	resp, err := fastClient(&Transport{Base: base}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range bodies[:2] {
		if !b.eof || !b.closed {
			t.Fatalf("discarded response %d: drained %v, closed %v", i, b.eof, b.closed)
		}
	}
	if bodies[2].closed || resp.StatusCode != http.StatusCreated || Attempts(resp) != 3 {
		t.Fatalf("returned response closed %v, %d after %d attempts", bodies[2].closed, resp.StatusCode, Attempts(resp))
	}
}

// A configuration mistake panics at construction and names the field.
func TestNewClientRejectsInvalidFields(t *testing.T) {
	t.Parallel()
	for field, tr := range map[string]*Transport{
		"Transport.MaxAttempts":   {MaxAttempts: -1},
		"Transport.MaxRetryAfter": {MaxRetryAfter: -time.Second},
	} {
		func() {
			defer func() {
				if msg, _ := recover().(string); !strings.HasPrefix(msg, "client: "+field) {
					t.Errorf("panic %q, want one naming %s", msg, field)
				}
			}()
			NewClient(tr)
		}()
	}
}

// 409 request_in_progress is a wait, not a failure: with MaxAttempts 1 and an empty
// budget, a request whose key stays in progress for five answers still gets its 201,
// paced by Retry-After; MaxWait ends the wait, naming itself, when the key stays in
// progress longer.
func TestRequestInProgressWaitsWithoutAttemptsOrBudget(t *testing.T) {
	t.Parallel()
	inProgress := func(n int64) *httptest.Server {
		var calls atomic.Int64
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if calls.Add(1) <= n {
				idem.WriteError(w, r, idem.ProfileSeed, idem.CodeRequestInProgress, "")
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		t.Cleanup(ts.Close)
		return ts
	}
	// Retry-After: 1 would make the test take seconds; MaxRetryAfter caps it.
	limits := func() *Transport {
		return &Transport{MaxAttempts: 1, Budget: newBudget(0, 0, 0, newFrozenClock().Now), MaxRetryAfter: 10 * time.Millisecond}
	}
	t.Run("the key is freed", func(t *testing.T) {
		t.Parallel()
		resp, err := fastClient(limits()).Do(chargeRequest(t, inProgress(5).URL, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || Attempts(resp) != 6 {
			t.Fatalf("%d after %d attempt(s), want 201 after 6", resp.StatusCode, Attempts(resp))
		}
	})
	t.Run("the key stays in progress", func(t *testing.T) {
		t.Parallel()
		tr := limits()
		tr.MaxWait = 100 * time.Millisecond
		_, err := fastClient(tr).Do(chargeRequest(t, inProgress(1<<30).URL, "{}"))
		var re *RetryError
		if !errors.As(err, &re) || re.Limit != LimitMaxWait || !strings.Contains(err.Error(), "the key was still in progress for Transport.MaxWait (100ms)") {
			t.Fatalf("error %v, want one naming Transport.MaxWait", err)
		}
	})
}

// AttemptTimeout bounds each attempt: a first attempt that hangs is abandoned after it
// and retried with the same key, and the second attempt's answer is returned, its
// body readable after RoundTrip returned (http.Client.Timeout would have ended the
// whole request instead). A server that always hangs makes the request give up at
// MaxAttempts with the attempt's timeout as the cause; a body that comes later than
// the timeout is cut off.
func TestAttemptTimeoutRetriesAHungAttempt(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	release := make(chan struct{})
	var (
		calls atomic.Int64
		hang  atomic.Bool
		keys  sync.Map
	)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys.Store(r.Header.Get(HeaderKey), true)
		switch {
		case calls.Add(1) == 1 || hang.Load():
			<-release
		case r.URL.Path == "/slow-body":
			w.WriteHeader(http.StatusCreated)
			w.(http.Flusher).Flush()
			select { // the body comes later than the attempt may take
			case <-release:
			case <-time.After(5 * timeout):
			}
			_, _ = io.WriteString(w, `{"object":"charge"}`)
		default:
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"object":"charge"}`)
		}
	}))
	t.Cleanup(ts.Close)
	t.Cleanup(func() { close(release) })
	c := fastClient(&Transport{AttemptTimeout: timeout, MaxAttempts: 2})

	resp, err := c.Do(chargeRequest(t, ts.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	n := 0
	keys.Range(func(any, any) bool { n++; return true })
	if err != nil || string(body) != `{"object":"charge"}` || resp.StatusCode != http.StatusCreated || Attempts(resp) != 2 || n != 1 {
		t.Fatalf("%d %q (%v) after %d attempt(s) with %d keys; want 201 and its body after 2, one key", resp.StatusCode, body, err, Attempts(resp), n)
	}

	req := chargeRequest(t, ts.URL, "{}")
	req.URL.Path = "/slow-body"
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatalf("read %q, want the body cut off by the attempt's timeout", body)
	}

	hang.Store(true)
	_, err = c.Do(chargeRequest(t, ts.URL, "{}"))
	var re *RetryError
	if !errors.As(err, &re) || !errors.Is(err, ErrAttemptTimeout) || re.Limit != LimitMaxAttempts || re.Attempts != 2 ||
		!strings.Contains(err.Error(), "the attempt outlived Transport.AttemptTimeout (200ms)") {
		t.Fatalf("error %v, want 2 attempts that timed out", err)
	}
}

// The budget's warning is one line however many requests it refuses: repeats within
// 10 s are summarised.
func TestBudgetWarningIsSummarised(t *testing.T) {
	t.Parallel()
	ts, _ := flakyServer(t, 1<<30, http.StatusServiceUnavailable, http.StatusOK)
	var warnings atomic.Int64
	logger := slog.New(countingHandler{msg: "client: retry budget exhausted; giving up on a request (raise Transport.Budget: client.NewBudget)", n: &warnings})
	c := fastClient(&Transport{Budget: newBudget(0, 0, 0, newFrozenClock().Now), Logger: logger})
	for range 20 {
		_, err := c.Do(chargeRequest(t, ts.URL, "{}"))
		if !errors.Is(err, ErrBudgetExhausted) {
			t.Fatalf("error %v, want the budget exhausted", err)
		}
	}
	if n := warnings.Load(); n != 1 {
		t.Fatalf("%d warnings for 20 refused retries, want 1 (the rest summarised)", n)
	}
}

// A request that meets two restarts gets a free retry at each: its connection breaks
// (the server was killed mid-request), its retries find connections refused while the
// server is down, and the connection of its first attempt after the restart breaks
// too (the server was killed again). With an empty budget, both broken connections
// are retried, and the third connection's 201 is the answer. A second broken
// connection with no refusal in between still takes a token (see
// TestRetryBudgetStopsRetriesAndCountsTransportResends).
func TestABrokenConnectionAfterARestartIsRetriedFree(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	// breakOne accepts one connection, reads the request's head and closes the
	// connection without an answer: the server died mid-request.
	breakOne := func(ln net.Listener) error {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = http.ReadRequest(bufio.NewReader(c))
		return err
	}
	var refusedFor atomic.Int64 // how long the client found nothing listening
	served := make(chan error, 1)
	go func() {
		if err := breakOne(ln); err != nil {
			served <- err
			return
		}
		ln.Close() // down: the client's retries are refused
		down := time.Now()
		time.Sleep(150 * time.Millisecond)
		ln2, err := net.Listen("tcp", addr) // up again, and killed mid-request
		if err != nil {
			served <- err
			return
		}
		refusedFor.Store(int64(time.Since(down)))
		if err := breakOne(ln2); err != nil {
			served <- err
			return
		}
		served <- http.Serve(ln2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ln2.Close() // the last answer
			w.WriteHeader(http.StatusCreated)
		}))
	}()
	backoff := func(int, *http.Response) time.Duration { return 20 * time.Millisecond }
	c := fastClient(&Transport{Budget: newBudget(0, 0, 0, newFrozenClock().Now), Backoff: backoff})
	resp, err := c.Do(chargeRequest(t, "http://"+addr, "{}"))
	if err != nil {
		t.Fatalf("%v; want 201 after two broken connections, the second after the server was down %v",
			err, time.Duration(refusedFor.Load()))
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || Attempts(resp) < 4 {
		t.Fatalf("%d after %d attempt(s); want 201 after at least 4 (broken, refused, broken, answered)", resp.StatusCode, Attempts(resp))
	}
	if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
		t.Fatal(err)
	}
}

// The retry of a broken connection waits for the server to finish dying. A server
// killed mid-request resets the connections in flight a few milliseconds before its
// listening socket closes, and a connection made meanwhile is accepted and then
// reset too. This server breaks the request marked X-Break, and every connection it
// accepts in the 40 ms after; then it answers 201. With an empty budget, the request
// gets its 201: its one free retry waited out the dying server, whether the
// Transport retried a fresh connection or the http.Transport re-sent the request
// after a reused keep-alive connection broke.
func TestABrokenConnectionsRetryWaitsOutADyingServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var (
		mu    sync.Mutex
		dying time.Time // until when connections are accepted only to be broken
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					mu.Lock()
					now := time.Now()
					broken := now.Before(dying)
					if req.Header.Get("X-Break") == "once" && dying.IsZero() {
						dying, broken = now.Add(40*time.Millisecond), true
					}
					mu.Unlock()
					if broken {
						return
					}
					if _, err := io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	base := "http://" + ln.Addr().String()
	post := func(c *http.Client, header string) (*http.Response, error) {
		req := chargeRequest(t, base, "{}")
		if header != "" {
			req.Header.Set("X-Break", header)
		}
		return c.Do(req)
	}
	for _, reused := range []bool{false, true} {
		mu.Lock()
		dying = time.Time{}
		mu.Unlock()
		c := fastClient(&Transport{Budget: newBudget(0, 0, 0, newFrozenClock().Now), Base: &http.Transport{}})
		if reused { // a keep-alive connection for the http.Transport to reuse
			resp, err := post(c, "")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		resp, err := post(c, "once")
		if err != nil {
			t.Fatalf("reused connection %v: %v; want 201 after the broken connection's free retry", reused, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || Attempts(resp) != 2 {
			t.Fatalf("reused connection %v: %d after %d attempt(s); want 201 after 2", reused, resp.StatusCode, Attempts(resp))
		}
	}
}
