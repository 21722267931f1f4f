package proxy_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/proxy"
)

// authServer is a forward-auth endpoint (nginx auth_request, Traefik ForwardAuth): it
// allows the bearer tokens it knows, naming their principal in X-Principal, and
// refuses the others 401 with WWW-Authenticate.
type authServer struct {
	srv   *httptest.Server
	calls atomic.Int64
	mu    sync.Mutex
	users map[string]string // token → principal
	last  http.Header       // of the last question
	hold  chan struct{}     // when set, every question waits on it
}

func newAuthServer(t *testing.T, users map[string]string) *authServer {
	a := &authServer{users: users}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.calls.Add(1)
		a.mu.Lock()
		a.last = r.Header.Clone()
		hold := a.hold
		principal, ok := a.users[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		a.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
			}
		}
		if r.Method != http.MethodGet || r.ContentLength > 0 {
			http.Error(w, "want a GET without a body", http.StatusTeapot)
			return
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="api", error="invalid_token"`)
			w.Header().Set("X-Internal", "not for the client")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":"invalid_token"}`))
			return
		}
		w.Header().Set("X-Principal", principal)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *authServer) revoke(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.users, token)
}

func (a *authServer) url() *url.URL {
	u, _ := url.Parse(a.srv.URL + "/auth")
	return u
}

// With forward authentication every keyed request is asked about before anything is
// claimed or replayed: a revoked token's retry gets the auth endpoint's 401 and no
// replay; two tokens of one principal share its keys (a rotated key keeps them);
// a refusal reaches the client as the auth endpoint wrote it.
func TestForwardAuthDecidesBeforeAnyClaimOrReplay(t *testing.T) {
	t.Parallel()
	auth := newAuthServer(t, map[string]string{"sk_old": "acct_1", "sk_new": "acct_1", "sk_other": "acct_2"})
	b := setup(t, func(c *proxy.Config) { c.AuthURL = auth.url() })
	first := b.send("POST", "/v1/echo", key1, "sk_old", `{"amount":1}`)
	if first.status != http.StatusCreated {
		t.Fatalf("an allowed request: %d %s", first.status, first.body)
	}
	q := auth.last
	if q.Get("Authorization") != "Bearer sk_old" || q.Get("X-Forwarded-Method") != "POST" || q.Get("X-Forwarded-Uri") != "/v1/echo" || q.Get("X-Forwarded-Host") == "" {
		t.Fatalf("the auth endpoint was asked with %v", q)
	}
	// The rotated key of the same principal finds the key: its replay.
	rotated := b.send("POST", "/v1/echo", key1, "sk_new", `{"amount":1}`)
	if !rotated.replayed() || rotated.body != first.body {
		t.Fatalf("the same principal's other token: %d %s, want the replay", rotated.status, rotated.body)
	}
	// Another principal does not.
	if other := b.send("POST", "/v1/echo", key1, "sk_other", `{"amount":1}`); other.replayed() {
		t.Fatalf("another principal got the replay: %s", other.body)
	}
	// Revoked: the auth endpoint's 401 as it wrote it, and no replay.
	auth.revoke("sk_old")
	revoked := b.send("POST", "/v1/echo", key1, "sk_old", `{"amount":1}`)
	if revoked.status != http.StatusUnauthorized || revoked.replayed() || revoked.body != `{"error":"invalid_token"}` ||
		revoked.header.Get("WWW-Authenticate") == "" || revoked.header.Get("X-Internal") != "" {
		t.Fatalf("a revoked token's retry: %d %v %s, want the auth endpoint's 401 (its WWW-Authenticate, not its internal headers)", revoked.status, revoked.header, revoked.body)
	}
	if n := b.up.count("/v1/echo"); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2 (the first principal's, the second's)", n)
	}
	// A keyless request is not asked about: the upstream authenticates it.
	before := auth.calls.Load()
	b.send("GET", "/v1/echo", "", "sk_old", "")
	if auth.calls.Load() != before {
		t.Fatal("a keyless GET was sent to the auth endpoint")
	}
}

// An auth endpoint that is down, slower than AuthTimeout, or that allows without
// naming the principal gets 503 auth_unavailable with Retry-After: never a replay,
// never a forward.
func TestAnAuthEndpointThatFailsIs503NeverAReplay(t *testing.T) {
	t.Parallel()
	auth := newAuthServer(t, map[string]string{"sk_1": "acct_1", "sk_anon": ""})
	b := setup(t, func(c *proxy.Config) { c.AuthURL, c.AuthTimeout = auth.url(), 300*time.Millisecond })
	if first := b.send("POST", "/v1/echo", key1, "sk_1", `{}`); first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	want503 := func(what string, a answer) {
		t.Helper()
		if a.status != http.StatusServiceUnavailable || a.code() != proxy.CodeAuthUnavailable || a.header.Get("Retry-After") == "" || a.replayed() {
			t.Fatalf("%s: %d %v %s, want 503 auth_unavailable with Retry-After", what, a.status, a.header, a.body)
		}
	}
	// Slow.
	auth.mu.Lock()
	auth.hold = make(chan struct{})
	auth.mu.Unlock()
	start := time.Now()
	want503("the retry while the auth endpoint hangs", b.send("POST", "/v1/echo", key1, "sk_1", `{}`))
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the answer took %v, want within the auth timeout", d)
	}
	auth.mu.Lock()
	close(auth.hold)
	auth.hold = nil
	auth.mu.Unlock()
	// A 2xx without a principal.
	want503("a 2xx without X-Principal", b.send("POST", "/v1/echo", "key-proxy-test-0002", "sk_anon", `{}`))
	if !strings.Contains(b.logs.String(), "without naming its principal") {
		t.Fatalf("no error logged:\n%s", b.logs)
	}
	// Down.
	auth.srv.Close()
	want503("the retry while the auth endpoint is down", b.send("POST", "/v1/echo", key1, "sk_1", `{}`))
	if n := b.up.count("/v1/echo"); n != 1 {
		t.Fatalf("the upstream ran %d times, want once", n)
	}
}

// Without forward authentication the scope header is normalised: the scheme's case,
// surrounding and inner white space do not make another principal, and a credential
// without a token is no principal (401, before the body is read).
func TestTheScopeHeaderIsNormalisedAndASchemeAloneIs401(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.sendHeader("POST", "/v1/echo", `{}`, http.Header{"Idempotency-Key": {key1}, "Authorization": {"Bearer sk_1"}})
	for _, spelling := range []string{"bearer sk_1", "  BEARER   sk_1 ", "Bearer\tsk_1"} {
		a := b.sendHeader("POST", "/v1/echo", `{}`, http.Header{"Idempotency-Key": {key1}, "Authorization": {spelling}})
		if !a.replayed() || a.body != first.body {
			t.Errorf("%q: %d %s, want the replay of Bearer sk_1's", spelling, a.status, a.body)
		}
	}
	if a := b.sendHeader("POST", "/v1/echo", `{}`, http.Header{"Idempotency-Key": {key1}, "Authorization": {"Bearer sk_2"}}); a.replayed() {
		t.Error("another token got the replay")
	}
	for _, alone := range []string{"Bearer", "bearer  ", "Basic"} {
		a := b.sendHeader("POST", "/v1/echo", `{}`, http.Header{"Idempotency-Key": {key1}, "Authorization": {alone}})
		if a.status != http.StatusUnauthorized || a.code() != idem.CodeScopeRequired || a.header.Get("Idempotency-Key") != key1 {
			t.Errorf("%q: %d %s, want 401 scope_required with the key echoed", alone, a.status, a.body)
		}
	}
	if n := b.up.count("/v1/echo"); n != 2 {
		t.Fatalf("the upstream ran %d times, want 2", n)
	}
	// A token without a scheme is a principal of its own.
	if a := b.sendHeader("POST", "/v1/echo", `{}`, http.Header{"Idempotency-Key": {key1}, "Authorization": {"sk_live_1"}}); a.status != http.StatusCreated {
		t.Fatalf("a bare token: %d %s", a.status, a.body)
	}
}

// With one shared scope every client is the same principal: the bounds per principal
// would bound the whole proxy, and are off.
func TestTheBoundsPerPrincipalAreOffInASharedScope(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) { c.SharedScope, c.Idem.MaxStoredBytesPerScope = true, 1 })
	for _, key := range []string{key1, "key-proxy-test-0002", "key-proxy-test-0003"} {
		if a := b.send("POST", "/v1/echo", key, "", `{}`); a.status != http.StatusCreated {
			t.Fatalf("%s: %d %s, want 201", key, a.status, a.body)
		}
	}
	s := setup(t, func(c *proxy.Config) { c.Idem.MaxStoredBytesPerScope = 1 })
	s.send("POST", "/v1/echo", key1, "tok_a", `{}`)
	if a := s.send("POST", "/v1/echo", "key-proxy-test-0002", "tok_a", `{}`); a.status != http.StatusTooManyRequests || a.code() != idem.CodeQuotaExceeded {
		t.Fatalf("a principal past its bound: %d %s, want 429 quota_exceeded", a.status, a.body)
	}
}
