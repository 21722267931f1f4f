package e2e

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The proxy at the network boundary (SPEC §17, "not knowing is not failure"): real
// `idem proxy` processes in front of the Node.js and Python upstreams, on SQLite and
// PostgreSQL. In every situation where the proxy cannot know whether the upstream
// acted, one key makes one effect at the upstream, whatever the retries do.

// forEachUpstreamAndSQLStore runs test once per upstream language and SQL store, in
// parallel subtests named like "node/postgres".
func forEachUpstreamAndSQLStore(t *testing.T, test func(t *testing.T, lang upstreamLang, store string)) {
	for _, lang := range upstreamLangs {
		for _, kind := range sqlStores {
			t.Run(string(lang)+"/"+string(kind), func(t *testing.T) {
				t.Parallel()
				test(t, lang, newStore(t, kind))
			})
		}
	}
}

// keyed is one key's POST through a proxy.
type keyed struct {
	c          *client
	base, path string
	key, body  string
	header     http.Header
}

func newKeyed(c *client, base, path string) *keyed {
	return &keyed{c: c, base: base, path: path, key: newKey(), body: `{"amount": 2000, "currency": "usd"}`}
}

func (k *keyed) send(t testing.TB) *response {
	t.Helper()
	return k.c.do(t, k.base, request{method: "POST", path: k.path, key: k.key, contentType: contentJSON, body: []byte(k.body), header: k.header})
}

// sendUntil sends the key's POST until its answer is not 409 request_in_progress,
// within 20 s, and returns that answer.
func (k *keyed) sendUntil(t testing.TB) *response {
	t.Helper()
	var res *response
	waitFor(t, 20*time.Second, "an answer other than 409 request_in_progress", func() (bool, string) {
		res = k.send(t)
		return res.errorCode() != "request_in_progress", res.String()
	})
	return res
}

func TestProxyNeverRunsARequestTwiceWhenItCannotKnowTheOutcome(t *testing.T) {
	t.Parallel()
	forEachUpstreamAndSQLStore(t, func(t *testing.T, lang upstreamLang, store string) {
		up := startUpstream(t, lang)
		px := startProxy(t, up, "--store", store, "--upstream-timeout", "300ms", "--require-key", "POST /v1/charges")
		small := startProxy(t, up, "--store", store, "--max-stored-body", "64")
		c := newClient()
		effects, requests := 0, 0

		// 1. Slower than --upstream-timeout: 504 with Retry-After now, 409 in flight
		// meanwhile, then the upstream's answer, stored and replayed.
		slow := newKeyed(c, px.URL(), "")
		slow.path = "/v1/charges?hold=" + slow.key
		first := slow.send(t)
		wantError(t, "a request slower than --upstream-timeout", first, http.StatusGatewayTimeout, "upstream_timeout")
		if first.Header.Get("Retry-After") == "" {
			t.Fatalf("the 504 has no Retry-After: %s", first)
		}
		wantError(t, "its retry while the upstream works", slow.send(t), http.StatusConflict, "request_in_progress")
		up.release(slow.key)
		answer := slow.sendUntil(t)
		if answer.Status != http.StatusCreated || !answer.replayed() {
			t.Fatalf("the retry once the upstream answered: %s, want its 201 replayed", answer)
		}
		wantReplayOf(t, "another retry", answer, slow.send(t), slow.key)
		effects, requests = effects+1, requests+1
		up.wantCounts("a slow upstream's request and its retries", requests, effects)

		// 2. The upstream acted and the reply was lost (the connection closed after
		// the request was written), and 3. it broke its body after 201: 500
		// outcome_unknown to the client and to every retry.
		for _, fail := range []string{"drop", "break"} {
			lost := newKeyed(c, px.URL(), "/v1/charges?fail="+fail)
			for i := range 3 {
				wantError(t, "?fail="+fail+" #"+strconv.Itoa(i+1), lost.send(t), http.StatusInternalServerError, "outcome_unknown")
			}
			effects, requests = effects+1, requests+1
			up.wantCounts("?fail="+fail+" and its retries", requests, effects)
		}

		// 4. Responses that cannot be stored whole: passed through, never run again.
		large := newKeyed(c, small.URL(), "/v1/charges")
		if res := large.send(t); res.Status != http.StatusCreated || !strings.Contains(string(res.Body), `"effect"`) {
			t.Fatalf("a response over --max-stored-body: %s, want the upstream's 201 passed through", res)
		}
		waitFor(t, 10*time.Second, "409 response_not_stored", func() (bool, string) {
			res := large.send(t)
			return res.errorCode() == "response_not_stored", res.String()
		})
		effects, requests = effects+1, requests+1
		up.wantCounts("a response over --max-stored-body and its retries", requests, effects)
		trailer := newKeyed(c, px.URL(), "/v1/charges?trailer=1")
		if res := trailer.send(t); res.Status != http.StatusCreated || res.Trailer.Get("X-Checksum") != "abc" {
			t.Fatalf("a response with a trailer: %s trailers %v, want 201 with X-Checksum: abc", res, res.Trailer)
		}
		waitFor(t, 10*time.Second, "409 response_not_stored", func() (bool, string) {
			res := trailer.send(t)
			return res.errorCode() == "response_not_stored", res.String()
		})
		effects, requests = effects+1, requests+1
		up.wantCounts("a response with a trailer and its retries", requests, effects)
		stream := newKeyed(c, px.URL(), "/v1/charges?sse=1")
		events := stream.send(t)
		if events.Status != http.StatusOK || !strings.HasSuffix(string(events.Body), "data: done\n\n") {
			t.Fatalf("an event stream: %s", events)
		}
		wantReplayOf(t, "an event stream's retry", events, stream.sendUntil(t), stream.key)
		effects, requests = effects+1, requests+1
		up.wantCounts("an event stream and its retry", requests, effects)

		// 5. An h2c upgrade offer (curl --http2) is protected like any other request,
		// and a --require-key route still wants its key.
		h2c := newKeyed(c, px.URL(), "/v1/charges")
		h2c.header = http.Header{"Connection": {"Upgrade, HTTP2-Settings"}, "Upgrade": {"h2c"}, "Http2-Settings": {"AAMAAABkAARAAAAAAAIAAAAA"}}
		offered := h2c.send(t)
		want201(t, "a keyed POST offering h2c", offered)
		wantReplayOf(t, "its retry", offered, h2c.send(t), h2c.key)
		noKey := c.do(t, px.URL(), request{method: "POST", path: "/v1/charges", contentType: contentJSON, body: []byte(`{}`), header: h2c.header})
		wantError(t, "a keyless POST offering h2c on a --require-key route", noKey, http.StatusBadRequest, "key_required")
		effects, requests = effects+1, requests+1

		up.wantCounts("after every situation and its retries", requests, effects)
	})
}

// Under --on-lapse take_over a lost reply keeps the record too: the client gets 502
// upstream_reply_lost, and its retry is forwarded again under the same derived key,
// which an upstream that deduplicates by it answers with the first effect.
func TestProxyLostReplyUnderTakeOverIsForwardedAgainUnderTheSameDerivedKey(t *testing.T) {
	t.Parallel()
	forEachUpstreamAndSQLStore(t, func(t *testing.T, lang upstreamLang, store string) {
		up := startUpstream(t, lang, "--dedup-header", "Idempotency-Key")
		px := startProxy(t, up, "--store", store, "--on-lapse", "take_over")
		k := newKeyed(newClient(), px.URL(), "/v1/charges?fail=drop")
		first := k.send(t)
		wantError(t, "a lost reply under take_over", first, http.StatusBadGateway, "upstream_reply_lost")
		retry := k.send(t)
		want201(t, "its retry", retry)
		if effectOf(t, retry) != 1 || retry.replayed() {
			t.Fatalf("the retry: want the first effect from the upstream (same derived key), got %s", retry)
		}
		wantReplayOf(t, "a later retry", retry, k.send(t), k.key)
		up.wantCounts("after a lost reply and its retries", 2, 1)
	})
}

// The control: a request that never reached the upstream (it was down) releases its
// key, and the retry, once the upstream is back, executes once.
func TestProxyRunsOnceARetryOfARequestThatNeverReachedTheUpstream(t *testing.T) {
	t.Parallel()
	forEachUpstreamAndSQLStore(t, func(t *testing.T, lang upstreamLang, store string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		down := &upstreamProc{t: t, lang: lang, url: "http://127.0.0.1:" + port}
		px := startProxy(t, down, "--store", store)
		k := newKeyed(newClient(), px.URL(), "/v1/charges")
		wantError(t, "a POST while the upstream is down", k.send(t), http.StatusBadGateway, "upstream_unavailable")
		up := startUpstream(t, lang, "--port", port)
		first := k.send(t)
		want201(t, "the retry once the upstream is back", first)
		wantReplayOf(t, "another retry", first, k.send(t), k.key)
		up.wantCounts("after the upstream came back", 1, 1)
	})
}

// A proxy SIGKILLed while it waits past --upstream-timeout (its client got 504): the
// retries through a second proxy on the same store never execute the request again.
func TestProxyKilledWhileWaitingPastTheUpstreamTimeoutNeverRunsTheRequestTwice(t *testing.T) {
	t.Parallel()
	forEachUpstreamAndSQLStore(t, func(t *testing.T, lang upstreamLang, store string) {
		up := startUpstream(t, lang)
		flags := []string{"--store", store, "--lock-timeout", "1s", "--ttl", "1h", "--upstream-timeout", "300ms"}
		dying, other := startProxy(t, up, flags...), startProxy(t, up, flags...)
		c := newClient()
		k := newKeyed(c, dying.URL(), "")
		k.path = "/v1/charges?hold=" + k.key
		wantError(t, "a request slower than --upstream-timeout", k.send(t), http.StatusGatewayTimeout, "upstream_timeout")
		dying.kill()
		k.base = other.URL()
		wantError(t, "a retry after the lease", k.sendUntil(t), http.StatusInternalServerError, "outcome_unknown")
		up.release(k.key)
		wantError(t, "a later retry", k.send(t), http.StatusInternalServerError, "outcome_unknown")
		up.wantCounts("after the kill and the retries", 1, 1)
	})
}

// idem check passes idem proxy in front of a naive upstream (one that knows nothing of
// keys): every check the proxy is answerable for, on SQLite and PostgreSQL.
func TestIdemCheckPassesTheProxyInFrontOfANaiveUpstream(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			up := startUpstream(t, langNode)
			px := startProxy(t, up, "--store", newStore(t, kind), "--require-key", "POST /v1/charges")
			res := mustRunIdem(t, "check", "--url", px.URL()+"/v1/charges", "--body", `{"amount": 2000, "currency": "usd"}`,
				"--header", "Authorization: Bearer sk_test_check_a", "--as-other", "Authorization: Bearer sk_test_check_b")
			if strings.Contains(res.stdout+res.stderr, "FAIL") {
				t.Fatalf("idem check reports a failure:\n%s%s", res.stdout, res.stderr)
			}
		})
	}
}
