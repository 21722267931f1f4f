package client

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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
		_, err = fastClient(&Transport{NewKey: noKey, MaxAttempts: 3}).Do(req)
		var re *RetryError
		var op *net.OpError
		if !errors.As(err, &re) || re.Attempts != 3 || !errors.As(err, &op) || op.Op != "dial" {
			t.Fatalf("error %v, want 3 attempts ending with a dial error", err)
		}
	})
}

// After MaxAttempts the Transport gives up with "giving up after N attempt(s)",
// wrapping the last answer.
func TestMaxAttemptsEndsRetries(t *testing.T) {
	t.Parallel()
	ts, seen := flakyServer(t, 100, http.StatusServiceUnavailable, http.StatusOK)
	req, _ := http.NewRequest(http.MethodPut, ts.URL+"/v1/orders/ord_1", strings.NewReader("{}"))
	_, err := fastClient(&Transport{MaxAttempts: 3}).Do(req)
	want := "PUT " + ts.URL + "/v1/orders/ord_1 giving up after 3 attempt(s): 503 Service Unavailable"
	var se *StatusError
	if err == nil || !strings.Contains(err.Error(), want) || !errors.As(err, &se) || se.StatusCode != 503 || len(seen()) != 3 {
		t.Fatalf("error %v after %d requests; want %q wrapping a StatusError", err, len(seen()), want)
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
