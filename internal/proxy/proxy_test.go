package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/proxy"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/sqlite"
)

// upstream is a Go HTTP API standing behind the proxy in these tests (e2e runs Node.js
// and Python ones). It counts the requests of each path and keeps the headers of the
// last one. Its paths:
//
//	/v1/echo?status=N   201 (or N) JSON of what it received, with Location and Set-Cookie
//	/v1/chunked         the same JSON in two flushed writes: no Content-Length
//	/v1/sse             an event stream: "first", then, once release is closed, "second"
//	/v1/big?size=N      N bytes with a Content-Length (&chunked=1: without)
//	/v1/trailer         a body and a trailer
//	/v1/early           103 Early Hints with a Link header, then 201 without it
//	/v1/slow            answers once release is closed
//	/v1/drop            closes the connection without answering
//	/v1/broken          201 with a Content-Length of 100, then closes after 10 bytes
//	/v1/sse-broken      an event stream that closes after its first event
//	/v1/trailer-undeclared  a body and a trailer it did not declare
//	/ws                 a protocol upgrade that echoes what it reads
type upstream struct {
	srv         *httptest.Server
	release     chan struct{}
	releaseOnce sync.Once

	mu      sync.Mutex
	calls   map[string]int
	headers http.Header // of the last request
	host    string      // of the last request
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{release: make(chan struct{}), calls: map[string]int{}}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	t.Cleanup(u.unblock) // before Close: a held handler must end
	return u
}

// srvURL is the upstream's base URL.
func (u *upstream) srvURL() *url.URL {
	v, _ := url.Parse(u.srv.URL)
	return v
}

// unblock closes release, once.
func (u *upstream) unblock() { u.releaseOnce.Do(func() { close(u.release) }) }

func (u *upstream) count(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[path]
}

func (u *upstream) last() (http.Header, string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.headers.Clone(), u.host
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.calls[r.URL.Path]++
	n := u.calls[r.URL.Path]
	u.headers, u.host = r.Header.Clone(), r.Host
	u.mu.Unlock()
	q := r.URL.Query()
	echo := func() []byte {
		b, _ := json.Marshal(map[string]any{"n": n, "method": r.Method, "path": r.URL.Path, "body": string(body)})
		return b
	}
	switch r.URL.Path {
	case "/v1/echo":
		status := http.StatusCreated
		if s := q.Get("status"); s != "" {
			status, _ = strconv.Atoi(s)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/v1/things/%d", n))
		w.Header().Set("Set-Cookie", fmt.Sprintf("session=%d", n))
		w.Header().Set("X-Upstream-Call", strconv.Itoa(n))
		if h := q.Get("header"); h != "" {
			w.Header().Set(h, "1") // what a gateway in front of the application adds
		}
		w.WriteHeader(status)
		_, _ = w.Write(echo())
	case "/v1/chunked":
		b := echo()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b[:len(b)/2])
		http.NewResponseController(w).Flush()
		_, _ = w.Write(b[len(b)/2:])
	case "/v1/sse":
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "data: first %d\n\n", n)
		http.NewResponseController(w).Flush()
		<-u.release
		fmt.Fprintf(w, "data: second %d\n\n", n)
	case "/v1/big":
		size, _ := strconv.Atoi(q.Get("size"))
		b := bytes.Repeat([]byte{'x'}, size)
		copy(b, strconv.Itoa(n)+":")
		w.Header().Set("Content-Type", "text/plain")
		if q.Get("chunked") == "" {
			w.Header().Set("Content-Length", strconv.Itoa(size))
		}
		w.WriteHeader(http.StatusCreated)
		for len(b) > 0 {
			k := min(len(b), 4096)
			_, _ = w.Write(b[:k])
			b = b[k:]
			if q.Get("chunked") != "" {
				http.NewResponseController(w).Flush()
			}
		}
	case "/v1/trailer":
		w.Header().Set("Trailer", "X-Checksum")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(echo())
		w.Header().Set("X-Checksum", "abc")
	case "/v1/trailer-undeclared":
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(echo())
		http.NewResponseController(w).Flush() // chunked: net/http sends trailers only then
		w.Header().Set(http.TrailerPrefix+"X-Sum", "def")
	case "/v1/early":
		// 103 Early Hints with a Link, then a 201 without it.
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(echo())
	case "/v1/slow":
		<-u.release
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(echo())
	case "/v1/broken", "/v1/sse-broken":
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if r.URL.Path == "/v1/broken" {
			fmt.Fprintf(rw, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"n\": %d, ", n)
		} else {
			fmt.Fprintf(rw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			ev := fmt.Sprintf("data: first %d\n\n", n)
			fmt.Fprintf(rw, "%x\r\n%s\r\n", len(ev), ev)
		}
		rw.Flush()
		conn.Close()
	case "/v1/drop":
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	case "/ws":
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprint(rw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		rw.Flush()
		line, _ := rw.ReadString('\n')
		fmt.Fprint(rw, "echo "+line)
		rw.Flush()
	default:
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(echo())
	}
}

// bundle is a proxy on a fresh SQLite store in front of an upstream.
type bundle struct {
	t     *testing.T
	proxy *proxy.Proxy
	store *sqlite.Store
	up    *upstream
	url   string // the proxy's
	logs  *testkit.Buffer
}

func setup(t *testing.T, configure ...func(*proxy.Config)) *bundle {
	t.Helper()
	ctx := testenv.Context(t)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b := &bundle{t: t, store: st, up: newUpstream(t), logs: &testkit.Buffer{}}
	target, _ := url.Parse(b.up.srv.URL)
	cfg := proxy.Config{
		Upstream:   target,
		Idem:       idem.Config{Store: st},
		HealthPath: "/healthz",
		Logger:     slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	for _, c := range configure {
		c(&cfg)
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.proxy = p
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	b.url = srv.URL
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("proxy logs:\n%s", b.logs.String())
		}
	})
	return b
}

// answer is a response read whole.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// code is the §9 code of an error answer, in the seed profile.
func (a answer) code() string {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(a.body), &e)
	return e.Error.Code
}

// send sends method path with body through the proxy, with key (none when "") and
// Authorization: Bearer token (none when "").
func (b *bundle) send(method, path, key, token, body string) answer {
	b.t.Helper()
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return b.sendHeader(method, path, body, h)
}

// sendHeader sends method path with body through the proxy, with the header fields of
// h (and a JSON Content-Type unless h has one).
func (b *bundle) sendHeader(method, path, body string, h http.Header) answer {
	b.t.Helper()
	req, err := http.NewRequest(method, b.url+path, strings.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(got)}
}

// open sends a keyed POST from tok_a through the proxy and returns the response
// unread, for a test that reads it as it comes, trailers included.
func (b *bundle) open(path, key string) *http.Response {
	b.t.Helper()
	req, _ := http.NewRequest("POST", b.url+path, strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Authorization", "Bearer tok_a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// noRedirects is a client that returns a redirect as the answer.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// record reads the record of key for the principal of token.
func (b *bundle) record(token, key string) (*idemstore.Record, error) {
	return b.store.RecordGet(testenv.Context(b.t), &idemstore.GetParams{Scope: sha256Hex("Bearer " + token), Key: key})
}

const key1 = "key-proxy-test-0001"

func TestAKeyedPostIsForwardedOnceAndItsRetryReplayedByteForByte(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.send("POST", "/v1/echo?x=1", key1, "tok_a", `{"amount": 2000}`)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %d replayed=%v %s", first.status, first.replayed(), first.body)
	}
	if first.header.Get("Set-Cookie") == "" || first.header.Get("Idempotency-Key") != key1 {
		t.Fatalf("first: the client gets the upstream's headers and its key back: %v", first.header)
	}
	retry := b.send("POST", "/v1/echo?x=1", key1, "tok_a", `{"amount": 2000}`)
	if retry.status != first.status || retry.body != first.body || !retry.replayed() {
		t.Fatalf("retry: %d %q replayed=%v; want %d %q replayed", retry.status, retry.body, retry.replayed(), first.status, first.body)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if retry.header.Get(h) != first.header.Get(h) {
			t.Errorf("retry's %s = %q, want the stored %q", h, retry.header.Get(h), first.header.Get(h))
		}
	}
	for _, h := range []string{"Set-Cookie", "X-Upstream-Call"} {
		if retry.header.Get(h) != "" {
			t.Errorf("retry replays %s, which is not on the allow-list of stored headers", h)
		}
	}
	if n := b.up.count("/v1/echo"); n != 1 {
		t.Fatalf("the upstream executed %d times, want 1", n)
	}
}

func TestTheUpstreamGetsTheRequestAsSentWithTheDerivedKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	req, _ := http.NewRequest("POST", b.url+"/v1/echo?b=2&a=1", strings.NewReader(`{"amount": 2000}`))
	req.Host = "api.example.com"
	req.Header.Set("Idempotency-Key", key1)
	req.Header.Set("Authorization", "Bearer tok_a")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("X-Custom", "kept")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var echo struct{ Body, Path string }
	if err := json.Unmarshal(body, &echo); err != nil || echo.Body != `{"amount": 2000}` || echo.Path != "/v1/echo" {
		t.Fatalf("the upstream received %s (%v)", body, err)
	}
	h, host := b.up.last()
	rec, err := b.record("tok_a", key1)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"Idempotency-Key":   rec.DerivedKey(proxy.UpstreamKeyStep), // replaces the client's
		"Authorization":     "Bearer tok_a",
		"X-Custom":          "kept",
		"X-Forwarded-For":   "203.0.113.9, 127.0.0.1",
		"X-Forwarded-Proto": "https",
		"X-Forwarded-Host":  "api.example.com",
	} {
		if got := h.Get(name); got != want {
			t.Errorf("the upstream got %s %q, want %q", name, got, want)
		}
	}
	if host != "api.example.com" {
		t.Errorf("the upstream got Host %q, want the client's", host)
	}
}

func TestAChunkedResponseIsStoredWhole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.send("POST", "/v1/chunked", key1, "tok_a", `{}`)
	retry := b.send("POST", "/v1/chunked", key1, "tok_a", `{}`)
	if first.status != http.StatusCreated || retry.body != first.body || !retry.replayed() {
		t.Fatalf("first %d %q, retry %d %q replayed=%v", first.status, first.body, retry.status, retry.body, retry.replayed())
	}
	if n := b.up.count("/v1/chunked"); n != 1 {
		t.Fatalf("the upstream executed %d times, want 1", n)
	}
	if strings.Contains(b.logs.String(), "cannot be stored") {
		t.Fatalf("a chunked response within the limit was passed through:\n%s", b.logs)
	}
}

func TestAChangedBodyIsKeyReusedAndDoesNotReachTheUpstream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send("POST", "/v1/echo", key1, "tok_a", `{"amount": 2000}`)
	got := b.send("POST", "/v1/echo", key1, "tok_a", `{"amount": 3000}`)
	if got.status != http.StatusConflict || got.code() != idem.CodeKeyReused {
		t.Fatalf("changed body: %d %s, want 409 key_reused", got.status, got.body)
	}
	if n := b.up.count("/v1/echo"); n != 1 {
		t.Fatalf("the upstream executed %d times, want 1", n)
	}
}

func TestUnprotectedRequestsPassThroughUntouched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for j, tc := range []struct{ method, key, token string }{
		{"GET", key1, "tok_a"},    // a safe method: the key is ignored
		{"POST", "", "tok_a"},     // no key
		{"PUT", key1, "tok_a"},    // not a protected method
		{"DELETE", key1, "tok_a"}, // not a protected method
		{"POST", "", ""},          // no key, no principal
	} {
		path := "/v1/pass-" + strconv.Itoa(j)
		for i := 1; i <= 2; i++ {
			got := b.send(tc.method, path, tc.key, tc.token, `{}`)
			if got.status != http.StatusOK || got.replayed() || got.header.Get("Idempotency-Key") != "" {
				t.Fatalf("%s %s #%d: %d replayed=%v key echoed %q", tc.method, path, i, got.status, got.replayed(), got.header.Get("Idempotency-Key"))
			}
			if n := b.up.count(path); n != i {
				t.Fatalf("%s %s: the upstream executed %d times after %d requests", tc.method, path, n, i)
			}
			h, _ := b.up.last()
			if got := h.Get("Idempotency-Key"); got != tc.key {
				t.Fatalf("%s %s: the upstream got Idempotency-Key %q, want the client's %q untouched", tc.method, path, got, tc.key)
			}
		}
	}
}

func TestRequireKeyRefusesAKeylessRequestOnItsRoutesOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.RequireKey = []string{"POST /v1/echo", "/v1/things/{id}/pay"} })
	for _, path := range []string{"/v1/echo", "//v1/echo", "/v1/things/42/pay"} {
		got := b.send("POST", path, "", "tok_a", `{}`)
		if got.status != http.StatusBadRequest || got.code() != idem.CodeKeyRequired {
			t.Errorf("POST %s without a key: %d %s, want 400 key_required", path, got.status, got.body)
		}
	}
	if n := b.up.count("/v1/echo") + b.up.count("/v1/things/42/pay"); n != 0 {
		t.Fatalf("refused requests reached the upstream %d times", n)
	}
	// Another method of a pattern with a method, and another route, pass through.
	if got := b.send("GET", "/v1/echo", "", "tok_a", ""); got.status != http.StatusCreated {
		t.Fatalf("GET /v1/echo: %d", got.status)
	}
	if got := b.send("POST", "/v1/other", "", "tok_a", `{}`); got.status != http.StatusOK {
		t.Fatalf("POST /v1/other: %d", got.status)
	}
	// A required route's key is honoured, whatever the method.
	for range 2 {
		if got := b.send("PUT", "/v1/things/7/pay", key1, "tok_a", `{}`); got.status != http.StatusOK {
			t.Fatalf("PUT /v1/things/7/pay: %d", got.status)
		}
	}
	if n := b.up.count("/v1/things/7/pay"); n != 1 {
		t.Fatalf("a keyed PUT on a required route executed %d times, want 1", n)
	}
}

// A router such as Express sends /V1/Echo and /v1/echo/ to the handler of /v1/echo, a
// servlet container /v1/echo;jsessionid=1, and many decode %2F: none sidesteps the key
// that a RequireKey route requires.
func TestRequireKeyCannotBeSidesteppedByHowThePathIsSpelled(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.RequireKey = []string{"POST /v1/charges", "POST /v1/orders/{id}/pay"} })
	for _, path := range []string{"/V1/Charges", "/v1/charges/", "/v1/charges//", "/v1/charges;jsessionid=1", "/v1%2Fcharges",
		"/v1/ORDERS/ord_1/PAY", "/v1/orders/ord_1/pay;x=1/", "/v1/orders/ord_1%2Fpay"} {
		got := b.send("POST", path, "", "tok_a", `{}`)
		if got.status != http.StatusBadRequest || got.code() != idem.CodeKeyRequired {
			t.Errorf("POST %s without a key: %d %s, want 400 key_required", path, got.status, got.body)
		}
	}
	if got := b.send("POST", "/v1/chargesx", "", "tok_a", `{}`); got.status != http.StatusOK {
		t.Fatalf("POST /v1/chargesx is another route: %d %s", got.status, got.body)
	}
}

// curl --http2 offers every http:// request an upgrade to h2c: the offer is ignored (as
// Go's server ignores it), the upstream is not asked to switch, and the request is
// protected like any other; only a WebSocket GET bypasses the middleware.
func TestAnH2COfferIsIgnoredAndTheRequestProtected(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.RequireKey = []string{"POST /v1/charges"} })
	send := func(path, key string) answer {
		h := http.Header{"Authorization": {"Bearer tok_a"}, "Connection": {"Upgrade, HTTP2-Settings"},
			"Upgrade": {"h2c"}, "Http2-Settings": {"AAMAAABkAARAAAAAAAIAAAAA"}}
		if key != "" {
			h.Set("Idempotency-Key", key)
		}
		return b.sendHeader("POST", path, `{}`, h)
	}
	first, retry := send("/v1/echo", key1), send("/v1/echo", key1)
	if first.status != http.StatusCreated || !retry.replayed() || retry.body != first.body || b.up.count("/v1/echo") != 1 {
		t.Fatalf("an h2c offer with a key: %d, retry %d replayed=%v, %d executions; want one, replayed", first.status, retry.status, retry.replayed(), b.up.count("/v1/echo"))
	}
	if h, _ := b.up.last(); h.Get("Upgrade") != "" || h.Get("Http2-Settings") != "" {
		t.Fatalf("the upstream was offered the upgrade: %v", h)
	}
	if got := send("/v1/charges", ""); got.status != http.StatusBadRequest || got.code() != idem.CodeKeyRequired {
		t.Fatalf("an h2c offer without a key on a RequireKey route: %d %s, want 400 key_required", got.status, got.body)
	}
}

// Two empty Authorization fields are no principal: they would put every such client
// in one scope.
func TestAScopeHeaderWhoseEveryValueIsEmptyIs401(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, values := range [][]string{{""}, {"", ""}, {" ", ""}} {
		got := b.sendHeader("POST", "/v1/echo", `{}`, http.Header{"Idempotency-Key": {key1}, "Authorization": values})
		if got.status != http.StatusUnauthorized {
			t.Errorf("Authorization %q: %d, want 401", values, got.status)
		}
	}
	if n := b.up.count("/v1/echo"); n != 0 {
		t.Fatalf("refused requests reached the upstream %d times", n)
	}
}

// With ScopeCookie the principal is one named cookie: another cookie that changes (an
// analytics id) is the same principal, another session is another one, and a request
// without it is 401.
func TestTheScopeCookieIsThePrincipalWhateverTheOtherCookies(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.ScopeCookie = "session" })
	send := func(cookie string) answer {
		h := http.Header{"Idempotency-Key": {key1}}
		if cookie != "" {
			h.Set("Cookie", cookie)
		}
		return b.sendHeader("POST", "/v1/echo", `{}`, h)
	}
	first := send("session=s1; _ga=1")
	again := send("_ga=2; session=s1")
	other := send("session=s2; _ga=1")
	if first.status != http.StatusCreated || !again.replayed() || other.replayed() || b.up.count("/v1/echo") != 2 {
		t.Fatalf("first %d, same session replayed=%v, other session replayed=%v, %d executions; want 2", first.status, again.replayed(), other.replayed(), b.up.count("/v1/echo"))
	}
	for _, cookie := range []string{"", "_ga=1", "session=", "session=s1; session=s2"} {
		if got := send(cookie); got.status != http.StatusUnauthorized {
			t.Errorf("Cookie %q: %d, want 401", cookie, got.status)
		}
	}
}

func TestTheScopeIsTheHashedHeaderAndAKeyedRequestWithoutItIs401(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if got := b.send("POST", "/v1/echo", key1, "", `{}`); got.status != http.StatusUnauthorized || got.code() != idem.CodeScopeRequired {
		t.Fatalf("no Authorization: %d %s, want 401 scope_required", got.status, got.body)
	}
	a := b.send("POST", "/v1/echo", key1, "tok_a", `{}`)
	other := b.send("POST", "/v1/echo", key1, "tok_b", `{}`)
	if a.status != http.StatusCreated || other.status != http.StatusCreated || other.replayed() || other.body == a.body {
		t.Fatalf("two principals, one key: %d %q and %d %q replayed=%v; want two executions", a.status, a.body, other.status, other.body, other.replayed())
	}
	for _, tok := range []string{"tok_a", "tok_b"} {
		if _, err := b.record(tok, key1); err != nil {
			t.Fatalf("no record under the scope hex SHA-256(%q): %v", "Bearer "+tok, err)
		}
	}
	if strings.Contains(b.logs.String(), "tok_") {
		t.Fatalf("a token reached the logs:\n%s", b.logs)
	}
}

func TestASharedScopeNeedsNoHeader(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.SharedScope = true })
	b.send("POST", "/v1/echo", key1, "", `{}`)
	if got := b.send("POST", "/v1/echo", key1, "tok_other", `{}`); !got.replayed() {
		t.Fatalf("shared scope: %d replayed=%v, want the replay whatever the Authorization", got.status, got.replayed())
	}
	if _, err := b.store.RecordGet(testenv.Context(t), &idemstore.GetParams{Scope: proxy.SharedScope, Key: key1}); err != nil {
		t.Fatal(err)
	}
}

func TestTheUpstreamsStatusesAreStoredOrReleasedAsSection6Says(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		status int
		stored bool
	}{
		{200, true}, {201, true}, {302, true}, {402, true}, {404, false}, {409, false},
		{422, false}, {429, false}, {400, false}, {500, false}, {503, false},
	} {
		path := "/v1/echo?status=" + strconv.Itoa(tc.status)
		key := "key-status-" + strconv.Itoa(tc.status)
		before := b.up.count("/v1/echo")
		first := b.send("POST", path, key, "tok_a", `{}`)
		retry := b.send("POST", path, key, "tok_a", `{}`)
		executions := b.up.count("/v1/echo") - before
		if first.status != tc.status || retry.status != tc.status {
			t.Errorf("status %d: first %d, retry %d", tc.status, first.status, retry.status)
		}
		if tc.stored && (executions != 1 || !retry.replayed() || retry.body != first.body) {
			t.Errorf("status %d is stored: %d executions, retry replayed=%v", tc.status, executions, retry.replayed())
		}
		if !tc.stored && (executions != 2 || retry.replayed()) {
			t.Errorf("status %d releases the key: %d executions, retry replayed=%v", tc.status, executions, retry.replayed())
		}
	}
}

// A 502 or 504 from the upstream is what a gateway in front of the application answers
// when it lost or timed out the application's reply: the upstream may have acted, so the
// record is kept, as for the proxy's own timeout (SPEC §17). The client gets the
// answer; a retry gets outcome_unknown, or under take_over is forwarded again under the
// same derived key.
func TestAnUpstreams502Or504IsUnknownNotFailure(t *testing.T) {
	t.Parallel()
	for _, status := range []int{502, 504} {
		for _, takeOver := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d take_over=%v", status, takeOver), func(t *testing.T) {
				t.Parallel()
				hooked := &hookCounts{}
				b := setup(t, func(c *proxy.Config) { c.TakeOverOnLapse, c.Hooks = takeOver, hooked.hooks() })
				path := "/v1/echo?status=" + strconv.Itoa(status)
				first := b.send("POST", path, key1, "tok_a", `{}`)
				if first.status != status || first.replayed() {
					t.Fatalf("first: %d %s, want the upstream's %d", first.status, first.body, status)
				}
				firstKey, _ := b.up.last()
				retry := b.send("POST", path, key1, "tok_a", `{}`)
				switch {
				case !takeOver && (retry.code() != "outcome_unknown" || b.up.count("/v1/echo") != 1):
					t.Fatalf("retry: %d %s after %d deliveries, want outcome_unknown and one delivery", retry.status, retry.body, b.up.count("/v1/echo"))
				case takeOver && b.up.count("/v1/echo") != 2:
					t.Fatalf("retry: %d %s after %d deliveries, want it forwarded again", retry.status, retry.body, b.up.count("/v1/echo"))
				}
				if again, _ := b.up.last(); takeOver && again.Get("Idempotency-Key") != firstKey.Get("Idempotency-Key") {
					t.Fatalf("the retry's derived key %q is not the first's %q", again.Get("Idempotency-Key"), firstKey.Get("Idempotency-Key"))
				}
				if want := b.up.count("/v1/echo"); hooked.get("gateway") != want {
					t.Fatalf("Hooks.UpstreamFailed told of %d gateway answers, want %d", hooked.get("gateway"), want)
				}
			})
		}
	}
}

// An event stream passes through as the upstream sends it: the client reads the first
// event while the upstream still holds the second. It is stored once it ended within
// MaxStoredBody, so that a retry gets the same events, replayed, and the upstream runs
// once.
func TestAnEventStreamPassesThroughAsItComesAndIsStoredWhenItEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resp := b.open("/v1/sse", key1)
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	if err != nil || line != "data: first 1\n" {
		t.Fatalf("first event: %q, %v", line, err)
	}
	if resp.Header.Get("Idempotency-Key") != key1 {
		t.Fatalf("the stream's headers lack the key: %v", resp.Header)
	}
	b.up.unblock()
	rest, _ := io.ReadAll(r)
	if string(rest) != "\ndata: second 1\n\n" {
		t.Fatalf("rest of the stream: %q", rest)
	}
	resp.Body.Close()
	waitCompleted(t, b, "tok_a", key1)
	got := b.send("POST", "/v1/sse", key1, "tok_a", `{}`)
	if !got.replayed() || got.body != "data: first 1\n\ndata: second 1\n\n" || got.header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("retry: %d replayed=%v %q %v, want the same events replayed", got.status, got.replayed(), got.body, got.header)
	}
	if n := b.up.count("/v1/sse"); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// An event stream that grows past MaxStoredBody is not stored: its repeats get 409
// response_not_stored, and the upstream never runs again.
func TestAnEventStreamOverTheLimitIsResponseNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.MaxStoredBody = 10 })
	b.up.unblock()
	first := b.send("POST", "/v1/sse", key1, "tok_a", `{}`)
	if first.body != "data: first 1\n\ndata: second 1\n\n" {
		t.Fatalf("the client got %q", first.body)
	}
	waitCompleted(t, b, "tok_a", key1)
	if got := b.send("POST", "/v1/sse", key1, "tok_a", `{}`); got.status != http.StatusConflict || got.code() != idem.CodeResponseNotStored {
		t.Fatalf("retry: %d %s, want 409 response_not_stored", got.status, got.body)
	}
	if n := b.up.count("/v1/sse"); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// waitCompleted waits until the key's record is completed: the middleware completes it
// after the response was sent.
func waitCompleted(t *testing.T, b *bundle, token, key string) *idemstore.Record {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := b.record(token, key)
		if err == nil && rec.State == idemstore.StateCompleted {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key's record was not completed: %v %v", rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A response that cannot be stored whole passes through as the upstream sends it,
// trailers included, and is never a reason to run twice: its repeats get 409
// response_not_stored, as the library's own do (SPEC §6).
func TestAResponseThatCannotBeStoredWholePassesThroughAndIsNeverRunAgain(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	b := setup(t, func(c *proxy.Config) { c.MaxStoredBody = limit })
	for _, tc := range []struct{ name, path, reason, trailer, value string }{
		{"Content-Length over the limit", fmt.Sprintf("/v1/big?size=%d", limit+1), "too_large", "", ""},
		{"a chunked body growing over the limit", fmt.Sprintf("/v1/big?size=%d&chunked=1", 3*limit), "too_large", "", ""},
		{"declared trailers", "/v1/trailer", "trailers", "X-Checksum", "abc"},
		{"undeclared trailers", "/v1/trailer-undeclared", "trailers", "X-Sum", "def"},
	} {
		key := "key-whole-" + tc.reason + strconv.Itoa(len(tc.path))
		u, _ := url.Parse(tc.path)
		before := b.up.count(u.Path)
		resp := b.open(tc.path, key)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("%s: %d", tc.name, resp.StatusCode)
		}
		if size := u.Query().Get("size"); size != "" && strconv.Itoa(len(body)) != size {
			t.Fatalf("%s: the client got %d bytes, want %s", tc.name, len(body), size)
		}
		if tc.trailer != "" && resp.Trailer.Get(tc.trailer) != tc.value {
			t.Fatalf("%s: the client got trailers %v, want %s: %s", tc.name, resp.Trailer, tc.trailer, tc.value)
		}
		waitCompleted(t, b, "tok_a", key)
		retry := b.send("POST", tc.path, key, "tok_a", `{}`)
		if retry.status != http.StatusConflict || retry.code() != idem.CodeResponseNotStored || retry.replayed() {
			t.Fatalf("%s: retry %d %s, want 409 response_not_stored", tc.name, retry.status, retry.body)
		}
		if n := b.up.count(u.Path) - before; n != 1 {
			t.Fatalf("%s: the upstream ran %d times, want 1", tc.name, n)
		}
		if !strings.Contains(b.logs.String(), "reason="+tc.reason) {
			t.Fatalf("%s: no warning with reason=%s:\n%s", tc.name, tc.reason, b.logs)
		}
	}
	// At the limit, it is stored.
	path := fmt.Sprintf("/v1/big?size=%d&chunked=1", limit)
	first := b.send("POST", path, "key-at-the-limit", "tok_a", `{}`)
	if retry := b.send("POST", path, "key-at-the-limit", "tok_a", `{}`); !retry.replayed() || retry.body != first.body {
		t.Fatalf("a body of exactly MaxStoredBody is stored: replayed=%v", retry.replayed())
	}
}

// A request that reached the upstream and lost its reply (the upstream closed the
// connection without answering, or broke its body after the status) is never run a
// second time under the policy unknown: the client and every retry get 500
// outcome_unknown, and the record is marked so at once, for an operator to resolve.
func TestALostReplyIsOutcomeUnknownAndNeverRunAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/v1/drop", "/v1/broken"} {
		// A request before, so that the lost one goes on a kept-alive connection:
		// there http.Transport re-sends a request it takes for replayable (one with
		// an Idempotency-Key header) when the connection breaks after it was written.
		b.send("GET", "/v1/warm", "", "tok_a", "")
		key := "key-lost" + strings.ReplaceAll(path, "/", "-")
		for i := 1; i <= 3; i++ {
			got := b.send("POST", path, key, "tok_a", `{}`)
			if got.status != http.StatusInternalServerError || got.code() != idem.CodeOutcomeUnknown || got.replayed() {
				t.Fatalf("POST %s #%d: %d %s, want 500 outcome_unknown", path, i, got.status, got.body)
			}
		}
		if n := b.up.count(path); n != 1 {
			t.Fatalf("POST %s reached the upstream %d times, want 1", path, n)
		}
		rec, err := b.record("tok_a", key)
		if err != nil || rec.Response == nil || !rec.Response.OutcomeUnknown {
			t.Fatalf("POST %s: the record is %+v (%v), want it marked outcome unknown", path, rec, err)
		}
	}
}

// A streamed response whose body broke after the status went to the client: the
// client's connection is aborted (the break is passed on), and the record is kept.
func TestABrokenStreamAbortsTheClientAndIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t)
	resp := b.open("/v1/sse-broken", key1)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil || !strings.HasPrefix(string(body), "data: first 1") {
		t.Fatalf("the client read %q, %v; want the first event and a broken body", body, err)
	}
	if got := b.send("POST", "/v1/sse-broken", key1, "tok_a", `{}`); got.code() != idem.CodeOutcomeUnknown {
		t.Fatalf("retry: %d %s, want 500 outcome_unknown", got.status, got.body)
	}
	if n := b.up.count("/v1/sse-broken"); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// Under take_over, a lost reply keeps the record too: the client gets 502
// upstream_reply_lost with Retry-After, and its retry is forwarded again under the
// same derived key, for the upstream to deduplicate.
func TestALostReplyUnderTakeOverIsForwardedAgainUnderTheSameDerivedKey(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.TakeOverOnLapse = true })
	first := b.send("POST", "/v1/drop", key1, "tok_a", `{}`)
	if first.status != http.StatusBadGateway || first.code() != proxy.CodeUpstreamReplyLost || first.header.Get("Retry-After") == "" {
		t.Fatalf("first: %d %s %v, want 502 upstream_reply_lost with Retry-After", first.status, first.body, first.header)
	}
	h1, _ := b.up.last()
	b.send("POST", "/v1/drop", key1, "tok_a", `{}`)
	h2, _ := b.up.last()
	if n := b.up.count("/v1/drop"); n != 2 {
		t.Fatalf("the retry reached the upstream %d times in all, want 2", n)
	}
	if k := h1.Get("Idempotency-Key"); k == "" || h2.Get("Idempotency-Key") != k {
		t.Fatalf("derived keys %q then %q, want the same", k, h2.Get("Idempotency-Key"))
	}
}

// An upstream that is slower than UpstreamTimeout: the client gets 504 with
// Retry-After at once, a duplicate meanwhile 409 in flight, and the proxy waits on and
// stores the upstream's answer, which the retry gets: one execution.
func TestASlowUpstreamsAnswerIsStoredForTheRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.UpstreamTimeout = 100 * time.Millisecond })
	first := b.send("POST", "/v1/slow", key1, "tok_a", `{}`)
	if first.status != http.StatusGatewayTimeout || first.code() != proxy.CodeUpstreamTimeout || first.header.Get("Retry-After") == "" ||
		first.header.Get("Idempotency-Key") != key1 {
		t.Fatalf("first: %d %s %v, want 504 upstream_timeout with Retry-After and the key", first.status, first.body, first.header)
	}
	if dup := b.send("POST", "/v1/slow", key1, "tok_a", `{}`); dup.status != http.StatusConflict || dup.code() != idem.CodeRequestInProgress {
		t.Fatalf("duplicate while waiting: %d %s, want 409 request_in_progress", dup.status, dup.body)
	}
	b.up.unblock()
	waitCompleted(t, b, "tok_a", key1)
	retry := b.send("POST", "/v1/slow", key1, "tok_a", `{}`)
	if retry.status != http.StatusCreated || !retry.replayed() || !strings.Contains(retry.body, `"n":1`) {
		t.Fatalf("retry: %d replayed=%v %s, want the upstream's 201 replayed", retry.status, retry.replayed(), retry.body)
	}
	if n := b.up.count("/v1/slow"); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

// Past UpstreamWaitLimit, or when the proxy shuts down while it waits, the outcome is
// unknown: the record is kept and marked, and no retry runs the request again.
func TestAnUpstreamPastTheWaitLimitOrAShutdownIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) {
		c.UpstreamTimeout, c.UpstreamWaitLimit = 50*time.Millisecond, 300*time.Millisecond
	})
	if first := b.send("POST", "/v1/slow", key1, "tok_a", `{}`); first.status != http.StatusGatewayTimeout {
		t.Fatalf("first: %d %s, want 504", first.status, first.body)
	}
	waitUnknown(t, b, "tok_a", key1)
	if got := b.send("POST", "/v1/slow", key1, "tok_a", `{}`); got.code() != idem.CodeOutcomeUnknown {
		t.Fatalf("retry past the wait limit: %d %s, want 500 outcome_unknown", got.status, got.body)
	}

	s := setup(t, func(c *proxy.Config) { c.UpstreamTimeout = 50 * time.Millisecond })
	if first := s.send("POST", "/v1/slow", key1, "tok_a", `{}`); first.status != http.StatusGatewayTimeout {
		t.Fatalf("first: %d %s, want 504", first.status, first.body)
	}
	s.proxy.Shutdown(0)
	waitUnknown(t, s, "tok_a", key1)
	if n := b.up.count("/v1/slow") + s.up.count("/v1/slow"); n != 2 {
		t.Fatalf("the upstreams ran %d times, want once each", n)
	}
}

// A shutdown lets an upstream that is slower than UpstreamTimeout answer within its
// grace: the answer is stored, the retry replays it, nothing is left unknown.
func TestAShutdownWaitsForASlowUpstreamWithinItsGrace(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.UpstreamTimeout = 50 * time.Millisecond })
	if first := b.send("POST", "/v1/slow", key1, "tok_a", `{}`); first.status != http.StatusGatewayTimeout {
		t.Fatalf("first: %d %s, want 504", first.status, first.body)
	}
	done := make(chan struct{})
	go func() {
		b.proxy.Shutdown(time.Minute)
		close(done)
	}()
	b.up.unblock()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Shutdown did not return once the upstream answered")
	}
	rec := waitCompleted(t, b, "tok_a", key1)
	if rec.Response == nil || rec.Response.OutcomeUnknown || rec.Response.Status != http.StatusCreated {
		t.Fatalf("the record after the shutdown: %+v, want the upstream's 201 stored", rec.Response)
	}
	if got := b.send("POST", "/v1/slow", key1, "tok_a", `{}`); got.status != http.StatusCreated || !got.replayed() {
		t.Fatalf("the retry: %d %s, want the 201 replayed", got.status, got.body)
	}
}

// waitUnknown waits until the key's record is marked outcome unknown.
func waitUnknown(t *testing.T, b *bundle, token, key string) {
	t.Helper()
	rec := waitCompleted(t, b, token, key)
	if rec.Response == nil || !rec.Response.OutcomeUnknown {
		t.Fatalf("the record is completed with %+v, want outcome unknown", rec.Response)
	}
}

// A request that provably never reached the upstream releases its key: 502
// upstream_unavailable, and the retry, once the upstream is back, executes once.
func TestAnUpstreamThatWasDownRunsTheRetryOnceWhenItIsBack(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b := setup(t, func(c *proxy.Config) { c.Upstream = &url.URL{Scheme: "http", Host: addr} })
	if got := b.send("POST", "/v1/echo", key1, "tok_a", `{}`); got.status != http.StatusBadGateway || got.code() != proxy.CodeUpstreamUnavailable {
		t.Fatalf("%d %s, want 502 upstream_unavailable", got.status, got.body)
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the upstream's port was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: b.up.srv.Config.Handler}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	for i := 0; i < 2; i++ {
		got := b.send("POST", "/v1/echo", key1, "tok_a", `{}`)
		if got.status != http.StatusCreated || got.replayed() != (i == 1) {
			t.Fatalf("after the upstream came back, #%d: %d replayed=%v", i+1, got.status, got.replayed())
		}
	}
	if n := b.up.count("/v1/echo"); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}

func TestAnUpstreamThatIsDownGets502(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	b := setup(t, func(c *proxy.Config) { c.Upstream = &url.URL{Scheme: "http", Host: addr} })
	got := b.send("POST", "/v1/echo", key1, "tok_a", `{}`)
	if got.status != http.StatusBadGateway || got.code() != proxy.CodeUpstreamUnavailable {
		t.Fatalf("%d %s, want 502 upstream_unavailable", got.status, got.body)
	}
	if _, err := b.record("tok_a", key1); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the key is not released: %v", err)
	}
}

// A WebSocket upgrade goes to the upstream as is, through the middleware's back: no
// key is claimed (an upgraded connection has no response to store), with a warning when
// the request carried one.
func TestAProtocolUpgradeIsForwardedWithoutAClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.Methods = []string{"GET", "POST"} })
	conn, err := net.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nAuthorization: Bearer tok_a\r\nIdempotency-Key: %s\r\n\r\n", key1)
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	fmt.Fprint(conn, "ping\n")
	if line, err := r.ReadString('\n'); err != nil || line != "echo ping\n" {
		t.Fatalf("through the upgraded connection: %q %v", line, err)
	}
	if _, err := b.record("tok_a", key1); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the upgrade claimed its key: %v", err)
	}
	if !strings.Contains(b.logs.String(), "WebSocket upgrade carries an idempotency key") {
		t.Fatalf("no warning about the key:\n%s", b.logs)
	}
}

// deadHolder claims key as a proxy that died mid-forward would have left it: in flight,
// its lease lapsed a minute ago, under record id recordID.
func deadHolder(t *testing.T, b *bundle, path, body, recordID string) {
	t.Helper()
	r := httptest.NewRequest("POST", path, nil)
	r.Header.Set("Content-Type", "application/json")
	_, err := b.store.RecordClaim(testenv.Context(t), &idemstore.ClaimParams{
		Scope: sha256Hex("Bearer tok_a"), Key: key1, Fingerprint: idem.FingerprintRequest(r, []byte(body)),
		Token: "dead-holder", RecordID: recordID, Lease: time.Second, TTL: time.Hour,
		Now: time.Now().Add(-time.Minute),
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestARetryAfterADeadHolderIsOutcomeUnknownByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	deadHolder(t, b, "/v1/echo", `{}`, "rec-dead-1")
	for i := range 2 {
		got := b.send("POST", "/v1/echo", key1, "tok_a", `{}`)
		if got.status != http.StatusInternalServerError || got.code() != idem.CodeOutcomeUnknown {
			t.Fatalf("retry %d: %d %s, want 500 outcome_unknown", i, got.status, got.body)
		}
	}
	if n := b.up.count("/v1/echo"); n != 0 {
		t.Fatalf("the upstream executed %d times, want 0", n)
	}
}

func TestATakeOverForwardsAgainUnderTheDeadHoldersDerivedKey(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.TakeOverOnLapse = true })
	deadHolder(t, b, "/v1/echo", `{}`, "rec-dead-2")
	got := b.send("POST", "/v1/echo", key1, "tok_a", `{}`)
	if got.status != http.StatusCreated || got.replayed() {
		t.Fatalf("takeover: %d %s", got.status, got.body)
	}
	h, _ := b.up.last()
	rec, err := b.record("tok_a", key1)
	if err != nil || rec.ID != "rec-dead-2" {
		t.Fatalf("the record after the takeover: %+v, %v; want the dead holder's", rec, err)
	}
	if want := rec.DerivedKey(proxy.UpstreamKeyStep); h.Get("Idempotency-Key") != want {
		t.Fatalf("the takeover sent Idempotency-Key %q, want the dead holder's %q", h.Get("Idempotency-Key"), want)
	}
}

func TestTheHealthPathPingsTheStoreAndOptionallyTheUpstream(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.UpstreamHealthPath = "/up" })
	if got := b.send("GET", "/healthz", "", "", ""); got.status != http.StatusOK || got.body != "{\"status\":\"ok\"}\n" {
		t.Fatalf("healthz: %d %q", got.status, got.body)
	}
	if n := b.up.count("/up"); n != 1 {
		t.Fatalf("the upstream's health path was checked %d times", n)
	}
	bad := setup(t, func(c *proxy.Config) { c.UpstreamHealthPath = "/v1/drop" })
	if got := bad.send("GET", "/healthz", "", "", ""); got.status != http.StatusServiceUnavailable || !strings.Contains(got.body, "upstream") {
		t.Fatalf("healthz with a failing upstream: %d %q", got.status, got.body)
	}
}

func TestNewRefusesABadConfigNamingTheField(t *testing.T) {
	t.Parallel()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{DisableCleaner: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	up, _ := url.Parse("http://127.0.0.1:3000")
	for _, tc := range []struct {
		name string
		cfg  proxy.Config
		want string
	}{
		{"no upstream", proxy.Config{Idem: idem.Config{Store: st}}, "Config.Upstream is required"},
		{"ftp upstream", proxy.Config{Upstream: &url.URL{Scheme: "ftp", Host: "h"}, Idem: idem.Config{Store: st}}, "Config.Upstream"},
		{"upstream with a query", proxy.Config{Upstream: &url.URL{Scheme: "http", Host: "h", RawQuery: "a=1"}, Idem: idem.Config{Store: st}}, "Config.Upstream"},
		{"no store", proxy.Config{Upstream: up}, "Config.Idem.Store"},
		{"bad pattern", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, RequireKey: []string{"POST v1"}}, "Config.RequireKey"},
		{"conflicting patterns", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, RequireKey: []string{"POST /a/{x}", "POST /{y}/b"}}, "Config.RequireKey"},
		{"duplicate pattern", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, RequireKey: []string{"POST /a", "POST /a"}}, "given twice"},
		{"bad scope header", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, ScopeHeader: "X Y"}, "Config.ScopeHeader"},
		{"bad method", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, Methods: []string{"PO ST"}}, "Config.Methods"},
		{"ttl under the lease", proxy.Config{Upstream: up, Idem: idem.Config{Store: st, TTL: time.Second}}, "Config.TTL"},
		{"health path", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, HealthPath: "healthz"}, "Config.HealthPath"},
		{"wait limit under the timeout", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, UpstreamTimeout: time.Minute, UpstreamWaitLimit: time.Second}, "Config.UpstreamWaitLimit"},
		{"bad scope cookie", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, ScopeCookie: "a b"}, "Config.ScopeCookie"},
		{"scope cookie and shared scope", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, ScopeCookie: "s", SharedScope: true}, "Config.ScopeCookie"},
		{"bad route", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, Routes: []string{"POST v1"}}, "Config.Routes"},
		{"negative body budget", proxy.Config{Upstream: up, Idem: idem.Config{Store: st}, MaxBufferedBodies: -1}, "Config.MaxBufferedBodies"},
	} {
		_, err := proxy.New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}

// With AccessLog every request gets one info line: its route, status, outcome and the
// key's short hash, never the key or a token.
func TestTheAccessLogSaysWhatHappenedToEachRequest(t *testing.T) {
	t.Parallel()
	logs := &testkit.Buffer{}
	b := setup(t, func(c *proxy.Config) {
		c.AccessLog, c.Routes = true, []string{"POST /v1/echo"}
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	b.send("POST", "/v1/echo", key1, "tok_a", `{}`)
	b.send("POST", "/v1/echo", key1, "tok_a", `{}`)
	b.send("POST", "/v1/echo", key1, "tok_a", `{"other":1}`)
	b.send("GET", "/v1/echo", "", "tok_a", "")
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	want := []string{
		`route="POST /v1/echo" status=201 outcome=forwarded`,
		`route="POST /v1/echo" status=201 outcome=replayed`,
		`route="POST /v1/echo" status=409 outcome=answered`,
		`route=passthrough status=201 outcome=forwarded`,
	}
	if len(lines) != len(want) {
		t.Fatalf("%d access lines, want %d:\n%s", len(lines), len(want), logs)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) || (i < 3 && !strings.Contains(lines[i], "key_hash=")) {
			t.Errorf("line %d:\n%s\nwant %s and the key's hash", i+1, lines[i], w)
		}
	}
	if strings.Contains(logs.String(), key1) || strings.Contains(logs.String(), "tok_a") {
		t.Fatalf("a key or a token reached the access log:\n%s", logs)
	}
}

// renewFails is an SQLite store whose renewals fail once fail is set, as a store that
// went away does: the holder's lease is lost while it forwards.
type renewFails struct {
	*sqlite.Store
	fail atomic.Bool
}

func (s *renewFails) RecordRenew(ctx context.Context, p *idemstore.RenewParams) (time.Time, error) {
	if s.fail.Load() {
		return time.Time{}, errors.New("store down")
	}
	return s.Store.RecordRenew(ctx, p)
}

// A holder that loses its lease (its renewals fail) after the request was written
// does not know what the upstream did either: the record is kept, never released, so
// that no retry forwards the request again under a new derived key.
func TestALeaseLostAfterTheRequestWasWrittenKeepsTheRecord(t *testing.T) {
	t.Parallel()
	var st *renewFails
	b := setup(t, func(c *proxy.Config) {
		st = &renewFails{Store: c.Idem.Store.(*sqlite.Store)}
		c.Idem.Store, c.Idem.Lease, c.UpstreamTimeout = st, time.Second, time.Minute
	})
	st.fail.Store(true)
	first := b.send("POST", "/v1/slow", key1, "tok_a", `{}`)
	if first.status/100 == 2 || first.replayed() {
		t.Fatalf("first: %d %s, want a failure: the lease was lost", first.status, first.body)
	}
	st.fail.Store(false)
	b.up.unblock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := b.send("POST", "/v1/slow", key1, "tok_a", `{}`)
		if got.code() == idem.CodeOutcomeUnknown {
			break
		}
		if got.code() != idem.CodeRequestInProgress || time.Now().After(deadline) {
			t.Fatalf("a retry: %d %s, want 409 in flight until the lease lapses, then 500 outcome_unknown", got.status, got.body)
		}
		time.Sleep(50 * time.Millisecond) // a poll: the lease lapses by the store's clock
	}
	if n := b.up.count("/v1/slow"); n != 1 {
		t.Fatalf("the upstream ran %d times, want 1", n)
	}
}
