package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// The proxy's tests (SPEC §17): real `idem proxy` processes, on SQLite, PostgreSQL and
// Redis, in front of real non-Go upstreams, testdata/upstream.js (Node.js) and testdata/upstream.py (Python), each
// counting the requests it received and the effects it made (GET /_count), holding a
// request until told (?hold=NAME, POST /_release), and, with --dedup-header,
// deduplicating by a key header as an upstream that honours the derived key does.

// upstreamLang names an upstream of testdata/.
type upstreamLang string

const (
	langNode   upstreamLang = "node"
	langPython upstreamLang = "python"
)

var upstreamLangs = []upstreamLang{langNode, langPython}

// upstreamProc is a running upstream process.
type upstreamProc struct {
	t    testing.TB
	lang upstreamLang
	url  string
	http *http.Client
}

var upstreamListening = regexp.MustCompile(`^upstream listening on (\S+)$`)

// startUpstream starts the upstream of lang on a free loopback port, with args
// (--dedup-header NAME), and kills it at cleanup. It skips the test when the
// interpreter is missing, unless CI=true.
func startUpstream(t testing.TB, lang upstreamLang, args ...string) *upstreamProc {
	t.Helper()
	interpreter, script := "node", "testdata/upstream.js"
	if lang == langPython {
		interpreter, script = "python3", "testdata/upstream.py"
	}
	path, err := exec.LookPath(interpreter)
	if err != nil {
		testenv.Unavailable(t, "%s is not installed (the %s upstream of the proxy's tests)", interpreter, lang)
	}
	if !slices.Contains(args, "--port") {
		args = append([]string{"--port", "0"}, args...)
	}
	cmd := exec.Command(path, append([]string{script}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the %s upstream: %v", lang, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("stderr of the %s upstream:\n%s", lang, logs.String())
		}
	})
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := upstreamListening.FindStringSubmatch(sc.Text()); m != nil {
				listening <- m[1]
			}
		}
		close(listening)
	}()
	select {
	case addr, ok := <-listening:
		if !ok {
			t.Fatalf("the %s upstream exited before listening:\n%s", lang, logs.String())
		}
		return &upstreamProc{t: t, lang: lang, url: "http://" + addr, http: &http.Client{Timeout: requestTimeout}}
	case <-time.After(startTimeout):
		t.Fatalf("the %s upstream did not listen within %v:\n%s", lang, startTimeout, logs.String())
	}
	return nil
}

// counts returns the upstream's requests and effects.
func (u *upstreamProc) counts() (requests, effects int) {
	u.t.Helper()
	resp, err := u.http.Get(u.url + "/_count")
	if err != nil {
		u.t.Fatalf("GET /_count of the %s upstream: %v", u.lang, err)
	}
	defer resp.Body.Close()
	var c struct{ Requests, Effects int }
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		u.t.Fatalf("GET /_count of the %s upstream: %v", u.lang, err)
	}
	return c.Requests, c.Effects
}

// wantCounts fails the test unless the upstream counts requests and effects.
func (u *upstreamProc) wantCounts(what string, requests, effects int) {
	u.t.Helper()
	if r, e := u.counts(); r != requests || e != effects {
		u.t.Fatalf("%s: the %s upstream received %d requests and made %d effects, want %d and %d", what, u.lang, r, e, requests, effects)
	}
}

// waitRequests waits until the upstream has received n requests.
func (u *upstreamProc) waitRequests(n int) {
	u.t.Helper()
	waitFor(u.t, 20*time.Second, fmt.Sprintf("the %s upstream receives %d requests", u.lang, n), func() (bool, string) {
		r, e := u.counts()
		return r >= n, fmt.Sprintf("requests %d, effects %d", r, e)
	})
}

// release lets the requests held under name finish.
func (u *upstreamProc) release(name string) {
	u.t.Helper()
	resp, err := u.http.Post(u.url+"/_release?hold="+name, "", nil)
	if err != nil {
		u.t.Fatalf("releasing %s: %v", name, err)
	}
	resp.Body.Close()
}

// startProxy starts `idem proxy --upstream up args...` and waits for its listening line.
func startProxy(t testing.TB, up *upstreamProc, args ...string) *server {
	t.Helper()
	s := newCommand(t, "proxy", append([]string{"--upstream", up.url}, args...)...)
	s.start("127.0.0.1:0")
	return s
}

// forEachUpstreamAndStore runs test once per upstream language and store (SQLite,
// PostgreSQL, Redis: the proxy keeps only records, so Redis needs no --db), in parallel
// subtests named like "node/postgres".
func forEachUpstreamAndStore(t *testing.T, test func(t *testing.T, lang upstreamLang, store string)) {
	for _, lang := range upstreamLangs {
		for _, kind := range allStores {
			t.Run(string(lang)+"/"+string(kind), func(t *testing.T) {
				t.Parallel()
				store := ""
				if kind == storeRedis {
					store = testenv.RedisURL(t) // keys are scoped by each test's random token
				} else {
					store = newStore(t, kind)
				}
				test(t, lang, store)
			})
		}
	}
}

// proxyPost sends POST path with key and body through the proxy at base.
func proxyPost(t testing.TB, c *client, base, path, key, body string) *response {
	t.Helper()
	return c.do(t, base, request{method: "POST", path: path, key: key, contentType: contentJSON, body: []byte(body)})
}

// effectOf is the upstream's effect number in a response body.
func effectOf(t testing.TB, res *response) int {
	t.Helper()
	n, ok := res.object(t)["effect"].(float64)
	if !ok {
		t.Fatalf("no effect in %s", res)
	}
	return int(n)
}

// Concurrent duplicates through the proxy reach the upstream once: the one that claims
// the key is held at the upstream while the others are answered 409
// request_in_progress; then it gets the upstream's (chunked) response, every retry the
// same bytes replayed, and the same key with another body key_reused.
func TestProxyExecutesConcurrentDuplicatesOnce(t *testing.T) {
	t.Parallel()
	forEachUpstreamAndStore(t, func(t *testing.T, lang upstreamLang, store string) {
		up := startUpstream(t, lang)
		px := startProxy(t, up, "--store", store)
		c, key := newClient(), newKey()
		const n = 12
		const body = `{"amount": 2000, "currency": "usd"}`
		path := "/v1/charges?hold=" + key + "&chunked=1"
		got := make(chan answer, n)
		for range n {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*requestTimeout)
				defer cancel()
				res, err := c.send(ctx, px.URL(), request{method: "POST", path: path, key: key, contentType: contentJSON, body: []byte(body)})
				got <- answer{res, err}
			}()
		}
		up.waitRequests(1)
		// Every duplicate is answered while the first is held at the upstream.
		for i := range n - 1 {
			select {
			case a := <-got:
				if a.err != nil {
					t.Fatalf("duplicate %d: %v", i, a.err)
				}
				wantError(t, "a duplicate in flight", a.res, http.StatusConflict, "request_in_progress")
			case <-time.After(requestTimeout):
				t.Fatalf("only %d of %d duplicates were answered while the first was in flight", i, n-1)
			}
		}
		up.release(key)
		first := <-got
		if first.err != nil {
			t.Fatal(first.err)
		}
		want201(t, "the request that claimed the key", first.res)
		if first.res.replayed() {
			t.Fatalf("the executed request says it was replayed: %s", first.res)
		}
		derived, _ := first.res.object(t)["idempotency_key"].(string)
		if len(derived) != 64 || derived == key {
			t.Fatalf("the upstream got Idempotency-Key %q, want the derived key (64 hex digits)", derived)
		}
		retry := proxyPost(t, c, px.URL(), path, key, body)
		if retry.Status != http.StatusCreated || !retry.replayed() || string(retry.Body) != string(first.res.Body) {
			t.Fatalf("retry: want the same 201 replayed byte for byte\nfirst %s\nretry %s", first.res, retry)
		}
		wantError(t, "the key with another body", proxyPost(t, c, px.URL(), path, key, `{"amount": 3000, "currency": "usd"}`),
			http.StatusConflict, "key_reused")
		up.wantCounts("after duplicates, a retry and a changed body", 1, 1)
	})
}

// Two proxy processes on one PostgreSQL store share their keys: a duplicate sent to
// the other proxy while the first is in flight is 409, its retry there the first
// one's response, and a storm of duplicates spread over both executes once.
func TestProxyProcessesShareKeysOnOnePostgresStore(t *testing.T) {
	t.Parallel()
	store := newStore(t, storePostgres)
	up := startUpstream(t, langNode)
	a := startProxy(t, up, "--store", store)
	b := startProxy(t, up, "--store", store)
	c, key := newClient(), newKey()
	const body = `{"amount": 2000}`
	held := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*requestTimeout)
		defer cancel()
		res, err := c.send(ctx, a.URL(), request{method: "POST", path: "/v1/charges?hold=" + key, key: key, contentType: contentJSON, body: []byte(body)})
		held <- answer{res, err}
	}()
	up.waitRequests(1)
	wantError(t, "a duplicate at the other proxy", proxyPost(t, c, b.URL(), "/v1/charges?hold="+key, key, body), http.StatusConflict, "request_in_progress")
	up.release(key)
	first := <-held
	if first.err != nil {
		t.Fatal(first.err)
	}
	want201(t, "the first", first.res)
	retry := proxyPost(t, c, b.URL(), "/v1/charges?hold="+key, key, body)
	if !retry.replayed() || string(retry.Body) != string(first.res.Body) {
		t.Fatalf("the retry at the other proxy: want the first's response replayed\nfirst %s\nretry %s", first.res, retry)
	}

	storm := newKey()
	var wg sync.WaitGroup
	created := make(chan *response, 16)
	for i := range 16 {
		base := a.URL()
		if i%2 == 1 {
			base = b.URL()
		}
		wg.Go(func() {
			res, err := c.send(context.Background(), base, request{method: "POST", path: "/v1/storm", key: storm, contentType: contentJSON, body: []byte(body)})
			if err == nil && res.Status == http.StatusCreated {
				created <- res
			}
		})
	}
	wg.Wait()
	close(created)
	for res := range created {
		if effectOf(t, res) != 2 {
			t.Fatalf("a storm answer of another execution: %s", res)
		}
	}
	up.wantCounts("after a held key and a storm over two proxies", 2, 2)
}

// killedMidForward is a key whose proxy was SIGKILLed while the upstream worked on
// its request: the record stays in flight until its lease lapses, and whether the
// upstream acted is unknown to every proxy.
type killedMidForward struct {
	up              *upstreamProc
	other           *server // a second proxy on the same store, alive
	c               *client
	key, path, body string
}

// killMidForward starts an upstream of lang with upstreamArgs and two proxies on store
// with a 1 s lease and proxyFlags, sends a keyed POST through the first that the
// upstream holds (?hold=key), and SIGKILLs that proxy once the upstream works on it.
func killMidForward(t *testing.T, lang upstreamLang, store string, upstreamArgs []string, proxyFlags ...string) *killedMidForward {
	t.Helper()
	k := &killedMidForward{up: startUpstream(t, lang, upstreamArgs...), c: newClient(), key: newKey(), body: `{"amount": 2000}`}
	k.path = "/v1/charges?hold=" + k.key
	flags := append([]string{"--store", store, "--lock-timeout", "1s", "--ttl", "1h"}, proxyFlags...)
	dying := startProxy(t, k.up, flags...)
	k.other = startProxy(t, k.up, flags...)
	go func() {
		_, _ = k.c.send(context.Background(), dying.URL(), request{method: "POST", path: k.path, key: k.key, contentType: contentJSON, body: []byte(k.body)})
	}()
	k.up.waitRequests(1)
	dying.kill()
	return k
}

// retry sends the key's POST through the other proxy.
func (k *killedMidForward) retry(t testing.TB) *response {
	t.Helper()
	return proxyPost(t, k.c, k.other.URL(), k.path, k.key, k.body)
}

// retryAfterTheLease sends the key's POST through the other proxy until it is not 409
// request_in_progress (the dead proxy's lease lapsed), within 30 s, and returns that
// answer or why there is none. It may run on any goroutine.
func (k *killedMidForward) retryAfterTheLease() (*response, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*requestTimeout)
		res, err := k.c.send(ctx, k.other.URL(), request{method: "POST", path: k.path, key: k.key, contentType: contentJSON, body: []byte(k.body)})
		cancel()
		switch {
		case err != nil:
			return nil, err
		case res.errorCode() != "request_in_progress":
			return res, nil
		case time.Now().After(deadline):
			return nil, fmt.Errorf("the retry still gets 409 request_in_progress 30 s after the kill: %s", res)
		}
		time.Sleep(50 * time.Millisecond) // a poll: the lease lapses by the store's clock
	}
}

// A proxy SIGKILLed while the upstream works on its request, under the default
// --on-lapse unknown: a retry after the lease gets 500 outcome_unknown, stored, and
// the upstream is never called again, until an operator releases the key with 'idem
// keys resolve'; then the retry executes.
func TestProxyKilledMidForwardLeavesTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	forEachUpstreamAndStore(t, func(t *testing.T, lang upstreamLang, store string) {
		k := killMidForward(t, lang, store, nil)
		res, err := k.retryAfterTheLease()
		if err != nil {
			t.Fatal(err)
		}
		wantError(t, "a retry after the lease", res, http.StatusInternalServerError, "outcome_unknown")
		k.up.release(k.key) // the dead proxy's request finishes at the upstream: one effect
		wantError(t, "a later retry", k.retry(t), http.StatusInternalServerError, "outcome_unknown")
		k.up.wantCounts("after the kill and two retries", 1, 1)

		scope := sha256.Sum256([]byte("Bearer " + k.c.token))
		if !strings.HasPrefix(store, "redis") { // Redis cannot list its keys
			listed := mustRunIdem(t, "keys", "list", "--store", store, "--scope", hex.EncodeToString(scope[:]), "--state", "outcome_unknown")
			if !strings.Contains(listed.stdout, k.key) {
				t.Fatalf("idem keys list --state outcome_unknown does not list the key:\n%s", listed.stdout)
			}
		}
		mustRunIdem(t, "keys", "resolve", "--store", store, "--scope", hex.EncodeToString(scope[:]), "--key", k.key, "--release")
		want201(t, "the retry after the operator released the key", proxyPost(t, k.c, k.other.URL(), "/v1/charges", k.key, k.body))
		k.up.wantCounts("after the operator released the key", 2, 2)
	})
}

// Under --on-lapse take_over the retry after the dead proxy's lease is forwarded again,
// with the same derived key, while the upstream still works on the first request: an
// upstream that deduplicates by that key answers it the first request's response, and
// makes no second effect.
func TestProxyKilledMidForwardIsTakenOverUnderTheSameDerivedKey(t *testing.T) {
	t.Parallel()
	forEachUpstreamAndStore(t, func(t *testing.T, lang upstreamLang, store string) {
		k := killMidForward(t, lang, store, []string{"--dedup-header", "Idempotency-Key"}, "--on-lapse", "take_over")
		retried := make(chan answer, 1)
		go func() {
			res, err := k.retryAfterTheLease()
			retried <- answer{res, err}
		}()
		k.up.waitRequests(2) // the retry reached the upstream, which waits for the first
		k.up.release(k.key)
		var a answer
		select {
		case a = <-retried:
		case <-time.After(3 * requestTimeout):
			t.Fatal("the takeover's retry was not answered")
		}
		if a.err != nil {
			t.Fatal(a.err)
		}
		want201(t, "the takeover", a.res)
		if effectOf(t, a.res) != 1 || a.res.replayed() {
			t.Fatalf("the takeover: want the first request's effect from the upstream, not replayed; got %s", a.res)
		}
		if again := k.retry(t); !again.replayed() || string(again.Body) != string(a.res.Body) {
			t.Fatalf("a retry after the takeover: want its response replayed, got %s", again)
		}
		k.up.wantCounts("after the kill, the takeover and a retry", 2, 1)
	})
}

// `idem proxy --upstream URL` alone starts on an SQLite store in the working directory,
// as `go run ./cmd/idem proxy --upstream URL` does on a fresh clone.
func TestProxyStartsWithOnlyAnUpstreamOnSQLiteInTheWorkingDirectory(t *testing.T) {
	t.Parallel()
	up := startUpstream(t, langNode)
	px := newCommand(t, "proxy", "--upstream", up.url)
	px.dir = t.TempDir()
	px.start("127.0.0.1:0")
	c := newClient()
	want201(t, "a keyed POST", proxyPost(t, c, px.URL(), "/v1/charges", newKey(), `{}`))
	if _, err := os.Stat(filepath.Join(px.dir, "idem.db")); err != nil {
		t.Fatalf("no idem.db in the working directory: %v", err)
	}
	resp, err := http.Get(px.URL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d %s", resp.StatusCode, b)
	}
	px.stop(syscall.SIGTERM)
}
