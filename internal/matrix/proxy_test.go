package matrix

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/h2fault"
	"github.com/idem-go/idem/internal/proxy"
)

// upstream is a Go API behind the proxy: POST /v1/charges makes one effect per
// derived key the proxy sends (it counts every delivery too), and answers as its kind
// says; each answer names its execution.
type upstream struct {
	kind string
	// release holds the answers of the slow kind until it is closed.
	release chan struct{}

	mu         sync.Mutex
	deliveries map[string]int // by derived key
	// arrived gets a value (when it has room) on every delivery, for waitDeliveries.
	arrived chan struct{}
}

// waitDeliveries waits until the upstream got n deliveries, for 10 s at most: the slow
// upstream's client is answered 504 after 50 ms, which a loaded machine can reach
// before the forward did.
func (u *upstream) waitDeliveries(t *testing.T, n int) {
	t.Helper()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		if _, total := u.counts(); total >= n {
			return
		}
		select {
		case <-u.arrived:
		case <-timeout.C:
			_, total := u.counts()
			t.Fatalf("the upstream got %d deliveries, want %d", total, n)
		}
	}
}

// upstreamTimeout is the proxy's --upstream-timeout in the cell of the slow upstream,
// which answers once the cell closes release, after every request of the cell was
// answered; the other cells' upstreams answer at once, and get a timeout that a loaded
// machine never reaches (a 504 there would be honest, but not the cell's outcome).
const upstreamTimeout = 50 * time.Millisecond

func timeoutOf(kind string) time.Duration {
	if kind == ProxySlow {
		return upstreamTimeout
	}
	return time.Minute
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key") // derived by the proxy
	if key == "" {
		return // the cell's first request, which opens a kept-alive connection: no effect
	}
	u.mu.Lock()
	u.deliveries[key]++
	n := u.deliveries[key]
	u.mu.Unlock()
	select {
	case u.arrived <- struct{}{}:
	default:
	}
	if r.Header.Get("Upgrade") != "" || r.Header.Get("Http2-Settings") != "" {
		http.Error(w, "the proxy passed an upgrade offer on", http.StatusTeapot)
		return
	}
	id := newID()
	switch u.kind {
	case ProxyStream:
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "data: %s\n\n", id)
		http.NewResponseController(w).Flush()
		fmt.Fprint(w, "data: done\n\n")
		return
	case ProxyTrailers:
		w.Header().Set("Trailer", "X-Checksum")
	case ProxySlow:
		<-u.release
	case ProxyNotForwarded:
		if n == 1 {
			// The gateway could not reach the application, and says so.
			w.Header().Set("X-Idem-Not-Forwarded", "1")
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, "<html>502 Bad Gateway</html>")
			return
		}
	case ProxyGateway:
		// The application acted; the gateway in front of it lost the reply.
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusGatewayTimeout)
		fmt.Fprint(w, "<html>504 Gateway Time-out</html>")
		return
	case ProxyLostReply, ProxyBrokenBody, ProxyGetLost, ProxyBodilessLost:
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		if u.kind == ProxyBrokenBody {
			fmt.Fprintf(rw, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":%q", id)
			rw.Flush()
		}
		conn.Close()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"object":"charge"`, id)
	http.NewResponseController(w).Flush() // chunked: the proxy must store it whole all the same
	if u.kind == ProxyTooLarge {
		fmt.Fprint(w, `,"padding":"`+strings.Repeat("x", 256)+`"`)
	}
	fmt.Fprint(w, `}`)
	if u.kind == ProxyTrailers {
		w.Header().Set("X-Checksum", id)
	}
}

// keys and total are the derived keys the upstream received and its deliveries.
func (u *upstream) counts() (keys, total int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, c := range u.deliveries {
		keys++
		total += c
	}
	return keys, total
}

// TestProxyCombinations runs the proxy's cells (SPEC §17): store × --on-lapse × what
// the upstream answers, the proxy in process in front of a Go upstream.
func TestProxyCombinations(t *testing.T) {
	t.Parallel()
	for _, a := range ProxyAnswers {
		for _, s := range ProxyStores {
			for _, o := range ProxyOptions {
				for _, lapse := range ProxyOnLapse {
					want := ExpectProxy(a, lapse)
					t.Run(fmt.Sprintf("%s on %s, %s, --on-lapse %s, is %s", a, s, o, lapse, want), func(t *testing.T) {
						t.Parallel()
						runProxyCell(t, a, s, o, lapse, want)
					})
				}
			}
		}
	}
}

func runProxyCell(t *testing.T, kind string, s Store, options, lapse string, want Outcome) {
	e := openEnv(t, s)
	up := &upstream{kind: kind, release: make(chan struct{}), deliveries: map[string]int{}, arrived: make(chan struct{}, 1)}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(up.release) }) }
	u, err := url.Parse(upSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			// What the proxy and the middleware said: a 503's cause, a lost lease.
			t.Logf("the proxy's log:\n%s", logs)
		}
	})
	cfg := proxy.Config{Upstream: u, Idem: idem.Config{Store: e.store},
		TakeOverOnLapse: lapse == "take_over", MaxStoredBody: 128, UpstreamTimeout: timeoutOf(kind),
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	if kind == ProxyNotForwarded {
		cfg.NotForwardedHeader = "X-Idem-Not-Forwarded"
	}
	if kind == ProxyH2CUpstream {
		// Only HTTP/2 without TLS: an HTTP/1.1 request would not be answered.
		h2c := httptest.NewUnstartedServer(up)
		h2c.Config.Protocols = new(http.Protocols)
		h2c.Config.Protocols.SetUnencryptedHTTP2(true)
		h2c.Start()
		t.Cleanup(h2c.Close)
		cfg.Upstream, _ = url.Parse(h2c.URL)
		cfg.UpstreamH2C = true
	}
	counts := up.counts
	if mode, ok := h2Modes[kind]; ok {
		h2, err := h2fault.Start(mode, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h2.Close)
		cfg.Upstream, _ = url.Parse(h2.URL)
		cfg.UpstreamTLS = &tls.Config{RootCAs: h2.RootCAs}
		counts = h2.Counts
	}
	// The requests of the cell: a POST with a body, or the transport faults' keyed GET
	// and keyed POST without a body.
	var opts []reqOption
	switch kind {
	case ProxyGetLost:
		cfg.Methods = []string{"POST", "PATCH", "GET"}
		opts = append(opts, withoutBody("GET"))
	case ProxyBodilessLost:
		opts = append(opts, withoutBody("POST"))
	}
	var hooked atomic.Int64
	every := options == ProxyEveryOption
	if every {
		cfg.ScopeCookie, cfg.AccessLog = "session", true
		cfg.RequireKey, cfg.Routes = []string{"POST /v1/charges"}, []string{"POST /v1/"}
		if kind == ProxyGetLost {
			cfg.RequireKey = append(cfg.RequireKey, "GET /v1/charges")
		}
		cfg.MaxBufferedBodies, cfg.MaxBufferedBodiesPerClient, cfg.MinUploadRate = 1<<20, 512<<10, 4<<10
		cfg.UpstreamWaitLimit = 2 * time.Minute
		cfg.Idem.MaxInFlightPerScope, cfg.Idem.MaxStoredBytesPerScope, cfg.Idem.QuotaWindow = 64, 1<<20, time.Minute
		cfg.Hooks = &proxy.Hooks{UpstreamResponse: func(string, int, time.Duration) { hooked.Add(1) }}
		// Sealed records (SPEC §19): the keyed scope of the cookie, sealed responses.
		cfg.Idem.Seal, cfg.Idem.Fingerprint = keyring(t, e.store), idem.FingerprintJSONExcept("metadata")
		// A gateway's marker, and re-sends bounded otherwise than by default.
		cfg.NotForwardedHeader, cfg.UpstreamResends = "X-Idem-Not-Forwarded", 2
	}
	auth := options == ProxyForwardAuth
	if auth {
		// The auth endpoint names the principal of the cell's token; another is
		// revoked.
		authSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer sk_test_matrix" {
				w.Header().Set("WWW-Authenticate", "Bearer")
				http.Error(w, `{"error":"revoked"}`, http.StatusUnauthorized)
				return
			}
			w.Header().Set("X-Principal", "acct_matrix")
		}))
		t.Cleanup(authSrv.Close)
		cfg.AuthURL, _ = url.Parse(authSrv.URL + "/auth")
	}
	p, err := proxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = p
	if every {
		// The principal is the session cookie; an analytics cookie beside it changes on
		// every request and must not make another principal.
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Set("Cookie", "_ga="+newID()+"; session="+strings.ReplaceAll(r.Header.Get("Authorization"), " ", "_"))
			p.ServeHTTP(w, r)
		})
	}
	inner := h
	if kind == ProxyH2C {
		// What curl --http2 adds to every http:// request.
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Set("Connection", "Upgrade, HTTP2-Settings")
			r.Header.Set("Upgrade", "h2c")
			r.Header.Set("Http2-Settings", "AAMAAABkAARAAAAAAAIAAAAA")
			inner.ServeHTTP(w, r)
		})
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(release) // before the servers close (cleanups run last first): a held answer must end
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = duplicates
	// A keyless GET first, forwarded untouched: the cell's requests then reach the
	// upstream on a kept-alive connection, where Go's transport would re-send by itself
	// a request it takes for replayable when the connection breaks after it was written.
	warm(t, client, srv.URL+"/v1/warm")
	seqKey, concKey, first, retry, conc := sendDuplicatesTo(t, client, srv.URL, opts...)
	all := append([]answer{first, retry}, conc...)
	if kind == ProxySlow {
		// Each key's one forward is under way; wait until it arrived, so that what
		// reaches the upstream later is counted as what sent it.
		up.waitDeliveries(t, 2)
	}
	keys, total := counts()
	for _, a := range all {
		if a.replayed && a.status/100 != 2 {
			t.Fatalf("an answer %v says it was replayed", a)
		}
	}

	if every {
		// A request answered 504 early logs its line once the upstream answered.
		answered := 0
		for _, a := range all {
			if a.code != proxy.CodeUpstreamTimeout {
				answered++
			}
		}
		if n := strings.Count(logs.String(), `msg="idem proxy: request"`); n < answered {
			t.Fatalf("%d access log lines for the cell's %d requests answered:\n%s", n, answered, logs)
		}
		if strings.Contains(logs.String(), seqKey) || strings.Contains(logs.String(), "sk_test_matrix") {
			t.Fatalf("a key or a token reached the logs:\n%s", logs)
		}
		if _, h2 := h2Modes[kind]; hooked.Load() == 0 && total > 0 && !h2 && kind != ProxyLostReply && kind != ProxyGetLost && kind != ProxyBodilessLost {
			t.Fatal("the hooks were told of no upstream response")
		}
	}

	// Nothing below the proxy re-sends a protected request: the guard that would stop
	// the transport's re-send (and log it) is never reached.
	if strings.Contains(logs.String(), "tried to send a protected request again") || strings.Contains(logs.String(), "sent a protected request twice") {
		t.Fatalf("the HTTP transport tried to re-send a protected request:\n%s", logs)
	}
	if auth {
		// A revoked token's retry gets the auth endpoint's 401, never the replay, and
		// reaches nothing.
		before := total
		revoked := post(t, client, srv.URL, seqKey, append(opts, func(r *http.Request) { r.Header.Set("Authorization", "Bearer sk_revoked") })...)
		if revoked.status != http.StatusUnauthorized || revoked.replayed || !strings.Contains(revoked.body, "revoked") {
			t.Fatalf("a revoked token's retry: %v, want the auth endpoint's 401", revoked)
		}
		if _, after := counts(); after != before {
			t.Fatalf("a revoked token's retry reached the upstream: %d deliveries, then %d", before, after)
		}
	}

	switch want {
	case ExactlyOnce:
		if first.status/100 != 2 || first.replayed || retry.body != first.body || !retry.replayed {
			t.Fatalf("first %v, retry %v; want a success and its replay", first, retry)
		}
		wantExactlyOnce(t, "the concurrent duplicates", conc)
		if keys != 2 || total != 2 {
			t.Fatalf("the upstream got %d deliveries under %d derived keys for two keys, want 2 and 2", total, keys)
		}
		if strings.Contains(logs.String(), "level=ERROR") {
			t.Fatalf("an error was logged by a combination that holds:\n%s", logs)
		}
	case NotStored:
		if first.status != http.StatusCreated || first.replayed || !strings.Contains(first.body, "padding") && kind == ProxyTooLarge {
			t.Fatalf("first %v: want the upstream's 201 passed through", first)
		}
		if kind == ProxyTrailers && first.trailer.Get("X-Checksum") == "" {
			t.Fatalf("first %v: its trailer did not reach the client", first)
		}
		wantEvery(t, "the repeats", append([]answer{retry}, conc...), http.StatusCreated, idem.CodeResponseNotStored, idem.CodeRequestInProgress)
		wantOneSuccess(t, conc)
		if total != 2 {
			t.Fatalf("the upstream got %d deliveries for two keys, want 2", total)
		}
	case AnsweredLater:
		if first.status != http.StatusGatewayTimeout || first.code != proxy.CodeUpstreamTimeout || first.retryAfter == "" {
			t.Fatalf("first %v: want 504 upstream_timeout with Retry-After", first)
		}
		wantEvery(t, "the repeats", append([]answer{retry}, conc...), http.StatusGatewayTimeout, proxy.CodeUpstreamTimeout, idem.CodeRequestInProgress)
		release()
		for _, key := range []string{seqKey, concKey} {
			later := waitAnswered(t, client, srv.URL, key)
			if later.status != http.StatusCreated || !later.replayed {
				t.Fatalf("once the upstream answered: %v, want its 201 replayed", later)
			}
		}
		if keys, total = counts(); total != 2 {
			t.Fatalf("the upstream got %d deliveries for two keys, want 2", total)
		}
	case Unknown:
		wantEvery(t, "every answer", all, 0, idem.CodeOutcomeUnknown, idem.CodeRequestInProgress)
		if first.code != idem.CodeOutcomeUnknown || total != 2 {
			t.Fatalf("first %v, %d deliveries for two keys: want outcome_unknown and 2", first, total)
		}
	case ReForwarded:
		if first.status != http.StatusBadGateway || first.code != proxy.CodeUpstreamReplyLost || first.retryAfter == "" {
			t.Fatalf("first %v: want 502 upstream_reply_lost with Retry-After", first)
		}
		wantEvery(t, "every answer", all, 0, proxy.CodeUpstreamReplyLost, idem.CodeRequestInProgress)
		if keys != 2 || total < 3 {
			t.Fatalf("the upstream got %d deliveries under %d derived keys, want the retries re-forwarded under the two keys' own", total, keys)
		}
	case GatewayUnknown, GatewayReForwarded:
		if first.status != http.StatusGatewayTimeout || first.code != "" || first.replayed {
			t.Fatalf("first %v: want the gateway's 504 passed on", first)
		}
		if want == GatewayUnknown {
			// The concurrent duplicates' one execution gets the 504 too.
			wantEvery(t, "the retry", []answer{retry}, 0, idem.CodeOutcomeUnknown)
			wantEvery(t, "the concurrent duplicates", conc, http.StatusGatewayTimeout, idem.CodeOutcomeUnknown, idem.CodeRequestInProgress)
			if n := countStatus(conc, http.StatusGatewayTimeout); n != 1 {
				t.Fatalf("%d concurrent duplicates got the gateway's 504, want the one execution's", n)
			}
			if total != 2 {
				t.Fatalf("the upstream got %d deliveries for two keys, want 2", total)
			}
			break
		}
		for _, a := range append([]answer{retry}, conc...) {
			if a.status != http.StatusGatewayTimeout && a.code != idem.CodeRequestInProgress {
				t.Fatalf("a repeat %v: want the gateway's 504 (forwarded again) or an in-flight 409", a)
			}
		}
		if keys != 2 || total < 3 {
			t.Fatalf("the upstream got %d deliveries under %d derived keys, want the retries re-forwarded under the two keys' own", total, keys)
		}
	case NotForwarded:
		if first.status != http.StatusBadGateway || first.code != "" || first.replayed {
			t.Fatalf("first %v: want the gateway's 502 passed on", first)
		}
		if retry.status != http.StatusCreated || retry.replayed {
			t.Fatalf("retry %v: want the 201 of its one execution (the key was released)", retry)
		}
		var rest []answer // but the first's 502
		for _, a := range conc {
			if a.status != http.StatusBadGateway || a.code != "" {
				rest = append(rest, a)
			}
		}
		wantEvery(t, "the concurrent duplicates", rest, http.StatusCreated, idem.CodeRequestInProgress)
		if n := countStatus(conc, http.StatusBadGateway); n > 1 {
			t.Fatalf("%d concurrent duplicates got the gateway's 502, want at most the first's", n)
		}
		executed := 0
		for _, a := range conc {
			if a.status == http.StatusCreated && !a.replayed {
				executed++
			}
		}
		if executed > 1 {
			t.Fatalf("%d concurrent duplicates executed, want at most one", executed)
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		for k, n := range up.deliveries {
			if n > 2 { // the gateway's 502, then at most one execution
				t.Fatalf("the upstream got %d deliveries under one derived key %s, want the refused one and at most one more", n, k)
			}
		}
	default:
		t.Fatalf("no assertion for %v", want)
	}
}

// h2Modes are the cells whose upstream is an h2fault server, by its mode.
var h2Modes = map[string]h2fault.Mode{
	ProxyH2Reset:   h2fault.ResetAlways,
	ProxyH2Refused: h2fault.RefuseOnce,
	ProxyH2GoAway:  h2fault.GoAwayOnce,
}

// warm sends the cell's keyless GET until the upstream answered it within the cell's
// --upstream-timeout, for 10 s at most: in the cell of the slow upstream that timeout
// is 50 ms, which a loaded machine can pass for a GET too (the proxy answers it 504 and
// cancels it, which closes the connection the GET was to keep alive, and tells the
// hooks of no response).
func warm(t *testing.T, client *http.Client, url string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		if resp.StatusCode != http.StatusGatewayTimeout || time.Now().After(deadline) {
			t.Fatalf("the keyless GET that opens a kept-alive connection: %d", resp.StatusCode)
		}
	}
}

// countStatus is how many of answers have status.
func countStatus(answers []answer, status int) int {
	n := 0
	for _, a := range answers {
		if a.status == status {
			n++
		}
	}
	return n
}

// withoutBody makes a cell's request a keyed method request without a body.
func withoutBody(method string) reqOption {
	return func(r *http.Request) {
		r.Method, r.Body, r.GetBody, r.ContentLength = method, http.NoBody, nil, 0
		r.Header.Del("Content-Type")
	}
}

// wantEvery fails unless every answer is a success of status (0: none allowed) or an
// error with one of codes, with Retry-After on each 409 in flight.
func wantEvery(t *testing.T, what string, answers []answer, status int, codes ...string) {
	t.Helper()
	for _, a := range answers {
		ok := status != 0 && a.status == status && a.code == ""
		for _, c := range codes {
			ok = ok || a.code == c
		}
		if !ok {
			t.Fatalf("%s: an answer %v is not one of %d or %v", what, a, status, codes)
		}
		if a.code == idem.CodeRequestInProgress && a.retryAfter == "" {
			t.Fatalf("%s: a 409 in flight without Retry-After: %v", what, a)
		}
	}
}

// wantOneSuccess fails unless exactly one of answers is a success.
func wantOneSuccess(t *testing.T, answers []answer) {
	t.Helper()
	n := 0
	for _, a := range answers {
		if a.status/100 == 2 {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d concurrent duplicates succeeded, want 1: %v", n, answers)
	}
}

// waitAnswered sends key's POST until it is not 409 in flight, within 10 s.
func waitAnswered(t *testing.T, c *http.Client, url, key string) answer {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		a := post(t, c, url, key)
		if a.code != idem.CodeRequestInProgress || time.Now().After(deadline) {
			return a
		}
		time.Sleep(10 * time.Millisecond) // a poll: the answer is stored in the background
	}
}
