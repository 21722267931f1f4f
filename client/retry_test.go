package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// Through a network that loses 30% of the replies after the server committed and
// resets 10% of the connections, 200 logical charges leave exactly 200 charges, and
// every call gets the 201 of its own charge.
func TestChargesThroughLossyNetworkExecuteExactlyOnce(t *testing.T) {
	t.Parallel()
	seed := faultSeed(t)
	api := newPaymentsAPI(t, idem.ProfileSeed)
	proxy := newFaultProxy(t, api.addr, seed, faultRates{reset: 0.10, dropReply: 0.30, delay: 0.10})
	base := &http.Transport{MaxIdleConnsPerHost: 8}
	t.Cleanup(base.CloseIdleConnections)
	var resendLogs atomic.Int64
	tr := &Transport{
		Base:        base,
		Budget:      NewBudget(1, 100, 1000), // generous: a retry per request and then some
		MaxAttempts: 30,                      // 0.4³⁰: no charge runs out of attempts
		Backoff:     ExponentialBackoff(time.Millisecond, 20*time.Millisecond, nil),
		Logger:      slog.New(countingHandler{msg: "client: admitting the http.Transport's re-send", n: &resendLogs}),
	}
	c := NewClient(tr)

	const n, workers = 200, 4
	type result struct {
		id, key  string
		attempts int
	}
	results := make([]result, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				id, key, attempts := chargeOnce(t, c, proxy.URL(), i)
				results[i] = result{id, key, attempts}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	totalAttempts := 0
	byID := map[string]result{}
	for i, r := range results {
		if prev, dup := byID[r.id]; dup {
			t.Errorf("charges %d and the one keyed %s got the same charge %s", i, prev.key, r.id)
		}
		byID[r.id] = r
		totalAttempts += r.attempts
	}
	charges := listCharges(t, api)
	if len(charges) != n {
		t.Fatalf("%d charges exist after %d logical charges, want exactly %d", len(charges), n, n)
	}
	for _, ch := range charges {
		r, ok := byID[ch.ID]
		if !ok {
			t.Errorf("charge %s exists but no call returned it", ch.ID)
			continue
		}
		if ch.IdempotencyKey == nil || *ch.IdempotencyKey != r.key {
			t.Errorf("charge %s has idempotency_key %v, want %s", ch.ID, ch.IdempotencyKey, r.key)
		}
	}
	t.Logf("faults: %d reset, %d replies dropped, %d delayed, %d clean; %d attempts for %d charges, in which %d attempts saw re-sends by the http.Transport; %d requests reached the server",
		proxy.count(faultReset), proxy.count(faultDropReply), proxy.count(faultDelay), proxy.count(faultNone),
		totalAttempts, n, resendLogs.Load(), api.requests.Load())
	if proxy.count(faultReset) == 0 || proxy.count(faultDropReply) == 0 {
		t.Fatalf("the proxy injected no resets or no lost replies; the test proved nothing")
	}
	// Every request the proxy relayed was counted as an attempt, the http.Transport's
	// silent re-sends included (the count may only err on the high side, for a write
	// that never left the client).
	if seenByProxy := proxy.count(faultReset) + proxy.count(faultDropReply) + proxy.count(faultDelay) + proxy.count(faultNone); int64(totalAttempts) < seenByProxy {
		t.Fatalf("%d attempts counted, but the proxy relayed %d requests: re-sends went uncounted", totalAttempts, seenByProxy)
	}
	if resendLogs.Load() == 0 {
		t.Fatalf("the http.Transport re-sent nothing on its own; the test did not exercise re-send counting")
	}
	if totalAttempts <= n {
		t.Fatalf("%d attempts for %d charges: nothing was retried", totalAttempts, n)
	}
}

// chargeOnce makes logical charge i (amount 100+i, customer cust_i) through c: even
// charges carry the caller's own key, odd ones the Transport's. It checks that the
// call returned the 201 of its own charge and returns the charge's id, the key sent
// and the attempts made.
func chargeOnce(t *testing.T, c *http.Client, base string, i int) (id, key string, attempts int) {
	customer := fmt.Sprintf("cust_%03d", i)
	req := chargeRequest(t, base, fmt.Sprintf(`{"amount": %d, "currency": "usd", "customer_id": %q}`, 100+i, customer))
	ownKey := ""
	if i%2 == 0 {
		ownKey = fmt.Sprintf("caller-key-%03d", i)
		req.Header.Set(HeaderKey, ownKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("charge %d: %v", i, err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("charge %d: %d %s, want 201", i, resp.StatusCode, b)
		return
	}
	key = resp.Request.Header.Get(HeaderKey)
	switch {
	case ownKey != "" && key != ownKey:
		t.Errorf("charge %d: the Transport sent key %q, want the caller's %q", i, key, ownKey)
	case ownKey == "" && !uuidV4.MatchString(key):
		t.Errorf("charge %d: the Transport sent key %q, want a UUID v4", i, key)
	}
	var ch chargeJSON
	if err := json.Unmarshal(b, &ch); err != nil {
		t.Errorf("charge %d: %v in %s", i, err, b)
		return
	}
	if ch.IdempotencyKey == nil || *ch.IdempotencyKey != key || ch.Amount != int64(100+i) || ch.CustomerID == nil || *ch.CustomerID != customer {
		t.Errorf("charge %d (key %s): got the 201 of another charge: %s", i, key, b)
	}
	if got := resp.Header.Get(HeaderKey); got != key {
		t.Errorf("charge %d: response Idempotency-Key %q, want %q", i, got, key)
	}
	return ch.ID, key, Attempts(resp)
}

// A 409 request_in_progress is retried, with the same key and body, no sooner than
// its Retry-After, in both error profiles.
func TestRequestInProgressIsRetriedAfterRetryAfter(t *testing.T) {
	t.Parallel()
	for _, profile := range []idem.Profile{idem.ProfileSeed, idem.ProfileIETF} {
		t.Run(profile.String(), func(t *testing.T) {
			t.Parallel()
			type seen struct {
				at        time.Time
				key, body string
			}
			var (
				mu    sync.Mutex
				calls []seen
			)
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				calls = append(calls, seen{time.Now(), r.Header.Get(HeaderKey), string(b)})
				first := len(calls) == 1
				mu.Unlock()
				if first {
					idem.WriteError(w, r, profile, idem.CodeRequestInProgress, "") // sets Retry-After: 1
					return
				}
				w.WriteHeader(http.StatusCreated)
			}))
			t.Cleanup(ts.Close)
			// No backoff: only Retry-After can make the Transport wait.
			c := NewClient(&Transport{Backoff: noBackoff, Logger: quietLogger(), Budget: NewBudget(0, 0, 1)})
			resp, err := c.Do(chargeRequest(t, ts.URL, `{"amount": 100, "currency": "usd"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || Attempts(resp) != 2 || len(calls) != 2 {
				t.Fatalf("got %d after %d attempt(s), %d calls; want 201 after 2", resp.StatusCode, Attempts(resp), len(calls))
			}
			if waited := calls[1].at.Sub(calls[0].at); waited < time.Second {
				t.Fatalf("retried %v after the 409, want ≥ Retry-After: 1 (1s)", waited)
			}
			if calls[0].key == "" || calls[0].key != calls[1].key || calls[0].body != calls[1].body {
				t.Fatalf("attempts differ: %+v", calls)
			}
		})
	}
}

// key_reused is final: the Transport returns it at once, after one attempt, in both
// profiles (409 seed, 422 ietf), against the real payments API.
func TestKeyReusedIsReturnedWithoutRetry(t *testing.T) {
	t.Parallel()
	for _, profile := range []idem.Profile{idem.ProfileSeed, idem.ProfileIETF} {
		t.Run(profile.String(), func(t *testing.T) {
			t.Parallel()
			api := newPaymentsAPI(t, profile)
			c := NewClient(&Transport{Logger: quietLogger()})
			send := func(body string) *http.Response {
				req := chargeRequest(t, api.url, body)
				req.Header.Set(HeaderKey, "reused-key-0001")
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			first := send(`{"amount": 100, "currency": "usd"}`)
			first.Body.Close()
			if first.StatusCode != http.StatusCreated {
				t.Fatalf("first charge: %d", first.StatusCode)
			}
			resp := send(`{"amount": 999, "currency": "usd"}`)
			defer resp.Body.Close()
			if want := profile.Status(idem.CodeKeyReused); resp.StatusCode != want {
				t.Fatalf("reused key: %d, want %d", resp.StatusCode, want)
			}
			if got := ErrorCode(resp); got != idem.CodeKeyReused {
				t.Fatalf("code %q, want key_reused (and a readable body)", got)
			}
			if Attempts(resp) != 1 || api.requests.Load() != 2 {
				t.Fatalf("%d attempt(s), %d requests at the server; want 1 attempt, 2 requests", Attempts(resp), api.requests.Load())
			}
		})
	}
}

// With the server always failing, the Transport stops when the budget is spent, says
// so, and makes no more attempts than the budget allows, counting the
// http.Transport's own re-sends.
func TestRetryBudgetStopsRetriesAndCountsTransportResends(t *testing.T) {
	t.Parallel()
	const burst = 5
	run := func(t *testing.T, req *http.Request) (*RetryError, *Budget, *staleConnServer) {
		// Every first request of a connection gets 503, every later one is dropped.
		srv := newStaleConnServer(t, 0, http.StatusServiceUnavailable)
		u := "http://" + srv.ln.Addr().String()
		req.URL, _ = req.URL.Parse(u + req.URL.Path)
		budget := newBudget(0, 0, burst, newFrozenClock().Now) // no deposits, no refill
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		c := NewClient(&Transport{Base: base, Budget: budget, MaxAttempts: 100, Backoff: noBackoff, Logger: quietLogger()})
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("got %d, want an error", resp.StatusCode)
		}
		var re *RetryError
		if !errors.As(err, &re) || !errors.Is(err, ErrBudgetExhausted) || !strings.Contains(err.Error(), "retry budget exhausted (Transport.Budget; client.NewBudget") ||
			re.Limit != LimitBudget {
			t.Fatalf("error %v, want a RetryError wrapping ErrBudgetExhausted and naming Transport.Budget", err)
		}
		if int64(re.Attempts) != srv.requests.Load() {
			t.Fatalf("%d attempts counted, the server received %d requests", re.Attempts, srv.requests.Load())
		}
		if re.Resends == 0 {
			t.Fatalf("no re-send counted; the test did not make the http.Transport re-send")
		}
		t.Logf("%v (resends %d, tokens left %v)", err, re.Resends, budget.Tokens())
		return re, budget, srv
	}
	t.Run("request with a body stays within the budget", func(t *testing.T) {
		t.Parallel()
		re, budget, _ := run(t, chargeRequest(t, "http://placeholder", `{"amount": 100, "currency": "usd"}`))
		// 1 first attempt + the free re-send of the first broken connection + burst
		// tokens spent on retries and re-sends; the re-send that found no token left
		// was refused before it happened.
		if re.Attempts != 1+1+burst || budget.Tokens() != 0 {
			t.Fatalf("%d attempts, %v tokens left; want %d attempts, 0 tokens", re.Attempts, budget.Tokens(), 1+1+burst)
		}
	})
	t.Run("body-less request overdraws by its last re-send", func(t *testing.T) {
		t.Parallel()
		req, _ := http.NewRequest(http.MethodGet, "http://placeholder/v1/charges", nil)
		re, budget, _ := run(t, req)
		// The http.Transport can re-send a body-less GET whatever GetBody says: the
		// re-send of the last retry is charged as a debt.
		if re.Attempts != 1+burst+1 || budget.Tokens() != -1 {
			t.Fatalf("%d attempts, %v tokens left; want %d attempts, -1 tokens", re.Attempts, budget.Tokens(), burst+2)
		}
	})
}

// A context deadline ends the retries on time: when the next wait would pass the
// deadline the Transport stops at once, and a deadline reached while waiting ends
// the wait; the error wraps context.DeadlineExceeded.
func TestContextDeadlineEndsRetriesOnTime(t *testing.T) {
	t.Parallel()
	// The slack absorbs a loaded machine; a client that ignored the deadline would wait
	// 10 s (Retry-After) or go on for up to 1000 attempts.
	const deadline, slack = 300 * time.Millisecond, time.Second
	for _, tc := range []struct {
		name       string
		retryAfter string
		backoff    Backoff
	}{
		{"Retry-After beyond the deadline", "10", noBackoff},
		{"backoff waits reach the deadline", "", func(int, *http.Response) time.Duration { return 40 * time.Millisecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int64
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			t.Cleanup(ts.Close)
			c := NewClient(&Transport{Backoff: tc.backoff, MaxAttempts: 1000, Budget: NewBudget(0, 0, 1000), Logger: quietLogger()})
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ts.URL, strings.NewReader("{}"))
			start := time.Now()
			resp, err := c.Do(req)
			elapsed := time.Since(start)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("got %d, want an error", resp.StatusCode)
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "giving up after") {
				t.Fatalf("error %v, want one wrapping context.DeadlineExceeded", err)
			}
			if elapsed > deadline+slack {
				t.Fatalf("returned after %v, want within %v of the %v deadline", elapsed, slack, deadline)
			}
			t.Logf("%v after %v and %d calls", err, elapsed.Round(time.Millisecond), calls.Load())
		})
	}
}
