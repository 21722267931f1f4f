package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Who is asking, and one client cannot starve the rest (SPEC §17, §19): real `idem
// proxy` processes with forward authentication, per-client shares of the body budget,
// a minimum upload rate and bounds per principal.

// fwdAuth is a forward-auth endpoint: it allows the bearer tokens it knows, naming
// their principal in X-Principal, and refuses the others 401 with WWW-Authenticate.
type fwdAuth struct {
	srv   *httptest.Server
	mu    sync.Mutex
	users map[string]string
}

func startFwdAuth(t *testing.T, users map[string]string) *fwdAuth {
	a := &fwdAuth{users: users}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		principal, ok := a.users[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		a.mu.Unlock()
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":"invalid_token","from":"auth"}`))
			return
		}
		w.Header().Set("X-Principal", principal)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *fwdAuth) revoke(token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.users, token)
}

// clientWith returns a client whose bearer token is token.
func clientWith(token string) *client {
	c := newClient()
	c.token = token
	return c
}

func TestProxyForwardAuthentication(t *testing.T) {
	t.Parallel()
	up := startGoUpstream(t)
	auth := startFwdAuth(t, map[string]string{"sk_old_" + randHex(4): "acct_1", "sk_other": "acct_2"})
	var oldToken string
	for tok := range auth.users {
		if strings.HasPrefix(tok, "sk_old_") {
			oldToken = tok
		}
	}
	newToken := "sk_new_" + randHex(4)
	auth.mu.Lock()
	auth.users[newToken] = "acct_1"
	auth.mu.Unlock()
	store := newStore(t, storeSQLite)
	px := startProxy(t, up.proc(t), "--store", store, "--auth-url", auth.srv.URL+"/check", "--auth-timeout", "2s")

	key := newKey()
	first := proxyPost(t, clientWith(oldToken), px.URL(), "/v1/echo", key, `{"amount": 2000}`)
	want201(t, "an allowed keyed POST", first)
	// Two tokens of one principal (a rotated API key) share its keys.
	rotated := proxyPost(t, clientWith(newToken), px.URL(), "/v1/echo", key, `{"amount": 2000}`)
	if !rotated.replayed() || string(rotated.Body) != string(first.Body) {
		t.Fatalf("the principal's other token: %s, want the replay", rotated)
	}
	if other := proxyPost(t, clientWith("sk_other"), px.URL(), "/v1/echo", key, `{"amount": 2000}`); other.replayed() {
		t.Fatalf("another principal got the replay: %s", other)
	}
	// A revoked token's retry gets the auth endpoint's 401, and no replay.
	auth.revoke(oldToken)
	revoked := proxyPost(t, clientWith(oldToken), px.URL(), "/v1/echo", key, `{"amount": 2000}`)
	if revoked.Status != http.StatusUnauthorized || revoked.replayed() || !strings.Contains(string(revoked.Body), `"from":"auth"`) ||
		revoked.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("a revoked token's retry: %s, want the auth endpoint's 401", revoked)
	}
	// The auth endpoint down: 503 auth_unavailable with Retry-After, never a replay.
	auth.srv.Close()
	down := proxyPost(t, clientWith(newToken), px.URL(), "/v1/echo", key, `{"amount": 2000}`)
	wantError(t, "the retry while the auth endpoint is down", down, http.StatusServiceUnavailable, "auth_unavailable")
	if down.Header.Get("Retry-After") == "" || down.replayed() {
		t.Fatalf("the retry while the auth endpoint is down: %s, want Retry-After and no replay", down)
	}
	if _, total := up.deliveries(); total != 2 {
		t.Fatalf("the upstream received %d requests, want 2 (acct_1's and acct_2's)", total)
	}
}

// slowUpload opens a connection and sends a keyed POST announcing a 1 MiB body, all
// of it but the last byte, and holds it: the flood of issue 38 (benchtool holdbodies).
func slowUpload(t *testing.T, addr string, header string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	const size = 1 << 20
	fmt.Fprintf(conn, "POST /v1/echo HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nIdempotency-Key: %s\r\n%s\r\n",
		addr, size, newKey(), header)
	body := make([]byte, size-1)
	for i := range body {
		body[i] = 'x'
	}
	// A refused one (401, 503 proxy_busy: Connection: close) stops being read.
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, _ = conn.Write(body)
	return conn
}

// 100 slow uploads from one source under made-up credentials (and 10 without any)
// leave another principal's keyed requests answered: the ones without credentials are
// refused before their bodies are read, the others hold at most their address's share
// of the budget (without it they held all of it: issue 38), and the minimum upload
// rate cuts them off.
func TestProxySlowUploadsFromOneSourceLeaveOtherPrincipalsServed(t *testing.T) {
	t.Parallel()
	up := startGoUpstream(t)
	px := startProxy(t, up.proc(t), "--store", newStore(t, storeSQLite), "--client-address-header", "X-Real-IP",
		"--read-timeout", "2m")
	addr := strings.TrimPrefix(px.URL(), "http://")
	var flood []net.Conn
	for i := range 110 {
		header := "X-Real-IP: 203.0.113.7\r\n"
		if i < 100 {
			header += "Authorization: Bearer made_up_" + strconv.Itoa(i) + "\r\n"
		}
		flood = append(flood, slowUpload(t, addr, header))
	}
	c := newClient()
	for i := range 20 {
		res := c.do(t, px.URL(), request{method: "POST", path: "/v1/echo", key: newKey(), contentType: contentJSON,
			body: []byte(`{"amount": 2000}`), header: http.Header{"X-Real-IP": {"198.51.100.1"}}})
		want201(t, "another principal's keyed POST #"+strconv.Itoa(i+1)+" beside the flood", res)
	}
	// The anonymous ones were refused 401; the others are cut off at the minimum upload
	// rate (1 KiB/s over 10 s) or were refused 503 past their address's share.
	statuses := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, conn := range flood {
		wg.Go(func() {
			conn.SetReadDeadline(time.Now().Add(40 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			status := 0
			if err == nil {
				status = resp.StatusCode
				resp.Body.Close()
			}
			mu.Lock()
			statuses[status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	// (A refused connection may be reset before its answer is read: 0.)
	for status := range statuses {
		if status != 0 && status != http.StatusUnauthorized && status != http.StatusRequestTimeout && status != http.StatusServiceUnavailable {
			t.Fatalf("the flood's answers by status: %v, want 401, 408 upload_too_slow or 503 proxy_busy", statuses)
		}
	}
	if statuses[http.StatusRequestTimeout] == 0 {
		t.Fatalf("the flood's answers by status: %v, want those that held their bodies cut off with 408 upload_too_slow", statuses)
	}
	if _, total := up.deliveries(); total != 20 {
		t.Fatalf("the upstream received %d requests, want the other principal's 20", total)
	}
}

// One principal past its bound gets 429 quota_exceeded with Retry-After, and the store
// holds nothing of the refused requests; another principal is served.
func TestProxyBoundsPerPrincipal(t *testing.T) {
	t.Parallel()
	up := startGoUpstream(t)
	store := newStore(t, storeSQLite)
	px := startProxy(t, up.proc(t), "--store", store, "--max-stored-bytes-per-principal", "300", "--quota-window", "1h")
	c := newClient()
	var stored []string
	var refused *response
	for i := range 10 {
		key := newKey()
		res := proxyPost(t, c, px.URL(), "/v1/echo", key, `{"amount": 2000}`)
		if res.Status == http.StatusTooManyRequests {
			refused = res
			wantError(t, "past the bound", res, http.StatusTooManyRequests, "quota_exceeded")
			break
		}
		want201(t, "within the bound #"+strconv.Itoa(i+1), res)
		stored = append(stored, key)
	}
	if refused == nil || len(stored) == 0 {
		t.Fatalf("no 429 after %d stored responses", len(stored))
	}
	if ra, err := strconv.Atoi(refused.Header.Get("Retry-After")); err != nil || ra < 3000 || ra > 3600 {
		t.Fatalf("Retry-After %q, want the rest of the hour's window", refused.Header.Get("Retry-After"))
	}
	// Its retries are still replayed; another principal is served.
	if res := proxyPost(t, c, px.URL(), "/v1/echo", stored[0], `{"amount": 2000}`); !res.replayed() {
		t.Fatalf("a retry past the bound: %s, want its replay", res)
	}
	want201(t, "another principal", proxyPost(t, newClient(), px.URL(), "/v1/echo", newKey(), `{"amount": 2000}`))
	// The store holds the stored keys and the other principal's, nothing of the refused.
	out := mustRunIdem(t, "keys", "list", "--store", store, "--json").stdout
	var page struct {
		Records []struct {
			Key string `json:"key"`
		} `json:"records"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("idem keys list --json: %v\n%s", err, out)
	}
	if len(page.Records) != len(stored)+1 {
		t.Fatalf("the store holds %d records, want the %d stored and the other principal's:\n%s", len(page.Records), len(stored), out)
	}
	if _, total := up.deliveries(); total != len(stored)+1 {
		t.Fatalf("the upstream received %d requests, want %d", total, len(stored)+1)
	}
}
