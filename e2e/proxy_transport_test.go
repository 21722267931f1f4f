package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/h2fault"
)

// Nothing below the proxy re-sends a protected request (SPEC §17): real `idem proxy`
// processes in front of Go upstreams that count what they receive by the derived key
// and lose the reply in the ways by which Go's HTTP clients re-send by themselves.

// goUpstream is a counting upstream in this process:
//
//	GET  /warm            200: opens a kept-alive connection from the proxy
//	any  /v1/drop         counted, then the connection closed without an answer
//	POST /v1/gw?status=N  counted, answered N (a gateway's 502 or 504 after acting)
//	POST /v1/echo?status=N  counted, answered N (201 by default) with the delivery's number;
//	                      with &once=1, N only to the first delivery of a derived key
type goUpstream struct {
	srv *httptest.Server
	mu  sync.Mutex
	by  map[string]int // deliveries by derived key
	all []string       // the derived keys, in order
}

func startGoUpstream(t *testing.T) *goUpstream {
	u := &goUpstream{by: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

// proc is the upstream as startProxy takes it.
func (u *goUpstream) proc(t *testing.T) *upstreamProc {
	return &upstreamProc{t: t, lang: "go", url: u.srv.URL}
}

func (u *goUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/warm" {
		return
	}
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.by[key]++
	first := u.by[key] == 1
	n := len(u.all) + 1
	u.all = append(u.all, key)
	u.mu.Unlock()
	status := http.StatusCreated
	if s := r.URL.Query().Get("status"); s != "" && (first || r.URL.Query().Get("once") == "") {
		status, _ = strconv.Atoi(s)
	}
	switch r.URL.Path {
	case "/v1/drop":
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close()
		}
	default:
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(`{"delivery":` + strconv.Itoa(n) + `}`))
	}
}

// deliveries returns the deliveries of every derived key received, in order.
func (u *goUpstream) deliveries() (keys []string, total int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.all...), len(u.all)
}

// warm sends a keyless GET through the proxy, which opens a kept-alive connection to
// the upstream that the next request reuses.
func warm(t *testing.T, c *client, base string) {
	t.Helper()
	if res := c.do(t, base, request{method: "GET", path: "/warm"}); res.Status != http.StatusOK {
		t.Fatalf("the warm-up GET: %s", res)
	}
}

// A keyed GET (--methods GET, or a --require-key pattern with GET) whose reply is lost
// on a kept-alive connection: Go's transport takes a GET for replayable and would
// send it again by itself; the upstream gets it once, and every answer is
// outcome_unknown. The access log says so, a line per request at the default level.
func TestProxySendsAKeyedGetWhoseReplyIsLostOnAReusedConnectionOnce(t *testing.T) {
	t.Parallel()
	for _, flags := range [][]string{{"--methods", "GET,POST"}, {"--require-key", "GET /v1/drop"}} {
		t.Run(strings.Join(flags, " "), func(t *testing.T) {
			t.Parallel()
			up := startGoUpstream(t)
			px := startProxy(t, up.proc(t), append([]string{"--store", newStore(t, storeSQLite), "--access-log"}, flags...)...)
			c := newClient()
			warm(t, c, px.URL())
			key := newKey()
			for i := range 3 {
				res := c.do(t, px.URL(), request{method: "GET", path: "/v1/drop", key: key})
				wantError(t, "keyed GET #"+strconv.Itoa(i+1), res, http.StatusInternalServerError, "outcome_unknown")
			}
			if keys, total := up.deliveries(); total != 1 {
				t.Fatalf("the upstream received the keyed GET %d times (%v), want once", total, keys)
			}
			// --access-log at the default --log-level info: one line per request (the
			// warm-up and the three GETs), without the key or the token. A request's line
			// follows its answer.
			waitFor(t, 10*time.Second, "an access log line per request", func() (bool, string) {
				n := strings.Count(px.output(), `msg="idem proxy: request"`)
				return n == 4, fmt.Sprintf("%d lines for 4 requests", n)
			})
			out := px.output()
			if strings.Contains(out, "level=ERROR") {
				t.Fatalf("the transport tried to send it again:\n%s", out)
			}
			if n := strings.Count(out, `msg="idem proxy: request"`); n != 4 {
				t.Fatalf("%d access log lines for 4 requests:\n%s", n, out)
			}
			if strings.Contains(out, key) || strings.Contains(out, c.token) {
				t.Fatalf("the key or the token reached the log:\n%s", out)
			}
		})
	}
}

// An HTTPS upstream speaking HTTP/2 that resets the stream with PROTOCOL_ERROR after
// acting, once or every time: Go's HTTP/2 client would retry the stream (577
// executions in 3 s when it resets every time); the upstream gets each key once.
func TestProxyNeverRetriesAnHTTP2StreamResetAfterActing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode h2fault.Mode
	}{{"once", h2fault.ResetOnce}, {"every time", h2fault.ResetAlways}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			up, err := h2fault.Start(tc.mode, dir)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(up.Close)
			px := newCommand(t, "proxy", "--upstream", up.URL, "--store", newStore(t, storeSQLite), "--methods", "GET,POST")
			px.env = []string{"SSL_CERT_FILE=" + up.CAFile}
			px.start("127.0.0.1:0")
			c := newClient()
			for _, method := range []string{"POST", "GET"} {
				key := newKey()
				for i := range 3 {
					req := request{method: method, path: "/v1/charges", key: key}
					if method == "POST" {
						req.contentType, req.body = contentJSON, []byte(`{"amount": 2000}`)
					}
					wantError(t, method+" #"+strconv.Itoa(i+1), c.do(t, px.URL(), req), http.StatusInternalServerError, "outcome_unknown")
				}
			}
			if keys, total := up.Counts(); keys != 2 || total != 2 {
				t.Fatalf("the upstream received %d requests under %d derived keys, want 2 and 2", total, keys)
			}
			if out := px.output(); strings.Contains(out, "level=ERROR") {
				t.Fatalf("the transport tried to send a request again:\n%s", out)
			}
		})
	}
}

// An upstream answering 502 or 504 after acting (a gateway in front of it lost or
// timed out the reply): the client gets the answer, the retries outcome_unknown, and
// the upstream each key once.
func TestProxyKeepsTheRecordOfAnUpstreams502Or504(t *testing.T) {
	t.Parallel()
	up := startGoUpstream(t)
	px := startProxy(t, up.proc(t), "--store", newStore(t, storeSQLite))
	c := newClient()
	for _, status := range []int{502, 504} {
		key := newKey()
		path := "/v1/gw?status=" + strconv.Itoa(status)
		first := proxyPost(t, c, px.URL(), path, key, `{"amount": 2000}`)
		if first.Status != status || first.replayed() {
			t.Fatalf("the first answer: %s, want the upstream's %d", first, status)
		}
		for i := range 2 {
			wantError(t, strconv.Itoa(status)+"'s retry #"+strconv.Itoa(i+1), proxyPost(t, c, px.URL(), path, key, `{"amount": 2000}`),
				http.StatusInternalServerError, "outcome_unknown")
		}
	}
	if keys, total := up.deliveries(); total != 2 {
		t.Fatalf("the upstream received %d requests (%v), want one per key", total, keys)
	}
}

// A rolling deploy: a proxy told to stop (SIGTERM) while the upstream works past
// --upstream-timeout (its client got 504) waits for the answer within
// --shutdown-grace and stores it, so that the retry, through the next proxy, gets it
// rather than an outcome for an operator to resolve.
func TestProxyShutdownWaitsForASlowUpstreamWithinItsGrace(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, langNode)
	store := newStore(t, storeSQLite)
	px := startProxy(t, up, "--store", store, "--upstream-timeout", "300ms", "--shutdown-grace", "30s")
	c := newClient()
	slow := newKeyed(c, px.URL(), "")
	slow.path = "/v1/charges?hold=" + slow.key
	wantError(t, "a request slower than --upstream-timeout", slow.send(t), http.StatusGatewayTimeout, "upstream_timeout")
	px.signal(syscall.SIGTERM)
	// The proxy stopped accepting: it is shutting down, and the upstream still works.
	waitFor(t, 10*time.Second, "the proxy to stop accepting", func() (bool, string) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(px.URL(), "http://"))
		if err == nil {
			conn.Close()
			return false, "still accepting"
		}
		return true, ""
	})
	up.release(slow.key)
	if err := px.wait(stopTimeout); err != nil {
		t.Fatalf("the proxy after SIGTERM: %v", err)
	}
	next := startProxy(t, up, "--store", store)
	slow.base = next.URL()
	if res := slow.send(t); res.Status != http.StatusCreated || !res.replayed() {
		t.Fatalf("the retry through the next proxy: %s, want the upstream's 201 replayed", res)
	}
	up.wantCounts("a request answered during the shutdown, and its retry", 1, 1)
}

// A key released by the upstream's own answer (500, 503, a §6 4xx) is retried under
// the same derived key as its first attempt, so that an upstream deduplicating by it
// stays safe: the derived key comes from the scope, the key, the request's fingerprint
// and the step, not from the record, which the release deleted.
func TestProxyRetriesAReleasedKeyUnderTheSameDerivedKey(t *testing.T) {
	t.Parallel()
	up := startGoUpstream(t)
	px := startProxy(t, up.proc(t), "--store", newStore(t, storeSQLite))
	c := newClient()
	for _, status := range []int{500, 503, 422} {
		key := newKey()
		path := "/v1/echo?once=1&status=" + strconv.Itoa(status)
		if res := proxyPost(t, c, px.URL(), path, key, `{"amount": 2000}`); res.Status != status {
			t.Fatalf("the first attempt: %s, want the upstream's %d", res, status)
		}
		if res := proxyPost(t, c, px.URL(), path, key, `{"amount": 2000}`); res.Status != http.StatusCreated {
			t.Fatalf("the retry after a released %d: %s, want it executed afresh", status, res)
		}
	}
	keys, total := up.deliveries()
	if total != 6 {
		t.Fatalf("the upstream received %d requests, want 6", total)
	}
	for i := 0; i < len(keys); i += 2 {
		if keys[i] == "" || keys[i] != keys[i+1] {
			t.Fatalf("attempt %d was sent under %q and its retry under %q, want the same derived key", i/2+1, keys[i], keys[i+1])
		}
	}
	if keys[0] == keys[2] || keys[2] == keys[4] {
		t.Fatalf("two keys share a derived key: %v", keys)
	}
}
