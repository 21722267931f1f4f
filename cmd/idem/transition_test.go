package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

// Sealing switched on and off on a running store (issue 46 items 2 and 3, SPEC §20):
// idem proxy and idem payments restarted with and without --encryption-key on one
// store, the sealing begun with idem keys seal between a request and its retry,
// counting what the upstream executes.

// server runs `idem args…` until stop and returns its base URL and its start line
// (the lines before it, WARNs, are kept in warns). It fails the test unless it starts.
type server struct {
	base, start string
	warns       []string
	stop        func()
}

var addrOf = regexp.MustCompile(`listening" addr=(127\.0\.0\.1:\d+)`)

func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	s, code, stderr := tryServer(t, args...)
	if s == nil {
		t.Fatalf("idem %s did not start: exit %d: %s", args[0], code, stderr)
	}
	return s
}

// tryServer runs `idem args…`: a server, or its exit status and what it logged when it
// did not start.
func tryServer(t *testing.T, args ...string) (s *server, code int, logged string) {
	t.Helper()
	ctx, cancel := context.WithCancel(testenv.Context(t))
	pr, pw := io.Pipe()
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, append(args, "--addr", "127.0.0.1:0"), io.Discard, pw); pw.Close() }()
	lines := bufio.NewScanner(pr)
	var before []string
	for lines.Scan() {
		if m := addrOf.FindStringSubmatch(lines.Text()); m != nil {
			rest := restOfLines(lines)
			s = &server{base: "http://" + m[1], start: lines.Text(), warns: before}
			stopped := false
			s.stop = func() {
				if !stopped {
					stopped = true
					cancel()
					<-exit
					<-rest
				}
			}
			t.Cleanup(s.stop)
			return s, 0, ""
		}
		before = append(before, lines.Text())
	}
	cancel()
	return nil, <-exit, strings.Join(before, "\n")
}

func TestProxyRestartedWithAKeyAndSealedNeverForwardsARetryAgain(t *testing.T) {
	t.Parallel()
	up, calls := countingUpstream(t)
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	key := keyURL(7)
	proxy := func(extra ...string) *server {
		return startServer(t, append([]string{"proxy", "--upstream", up.URL, "--store", store}, extra...)...)
	}
	replays := func(base, k, first string) {
		t.Helper()
		status, body, replayed := postThrough(t, base, k)
		if status != http.StatusCreated || body != first || !replayed {
			t.Fatalf("the retry of %s: %d %q (replayed %v); want %q replayed", k, status, body, replayed, first)
		}
	}

	p := proxy()
	_, first, _ := postThrough(t, p.base, "key-before-the-key")
	p.stop()

	// With the key, sealing not begun: ready, the record made before replays.
	p = proxy("--encryption-key", key)
	if !strings.Contains(p.start, "sealing=ready") || !strings.Contains(strings.Join(p.warns, "\n"), "ready mode") {
		t.Errorf("start line %q, before it %q; want sealing=ready and a WARN", p.start, p.warns)
	}
	replays(p.base, "key-before-the-key", first)
	_, ready, _ := postThrough(t, p.base, "key-ready")

	// Sealing begun while it runs, and again after a restart: every record made before
	// replays, a new one is sealed.
	if code, out, errOut := runCmd(t, "keys", "seal", "begin", "--store", store, "--encryption-key", key, "--handoff", "1ms"); code != 0 || !strings.Contains(out, "begun at") {
		t.Fatalf("idem keys seal begin: exit %d: %s%s", code, out, errOut)
	}
	replays(p.base, "key-before-the-key", first)
	p.stop()
	p = proxy("--encryption-key", key)
	if !strings.Contains(p.start, "sealing=sealed") {
		t.Errorf("start line %q; want sealing=sealed", p.start)
	}
	replays(p.base, "key-before-the-key", first)
	replays(p.base, "key-ready", ready)
	_, sealed, _ := postThrough(t, p.base, "key-sealed")
	replays(p.base, "key-sealed", sealed)
	p.stop()

	// Without the key: it refuses to start, naming the key it needs (defect 3: it
	// served in clear, and forwarded the sealed record's retry again).
	if s, code, logged := tryServer(t, "proxy", "--upstream", up.URL, "--store", store); s != nil || code == 0 || !strings.Contains(logged, "base64key:") {
		t.Fatalf("idem proxy without the key on a sealed store: started %v, exit %d, logged %q; want it refused, naming the key", s != nil, code, logged)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("the upstream ran %d requests, want 3 (one per key)", n)
	}
}

func TestPaymentsRestartedWithAKeyAndSealedNeverChargesARetryAgain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := "sqlite:" + filepath.Join(dir, "idem.db")
	flags := []string{"payments", "--store", store, "--db", "sqlite:" + filepath.Join(dir, "app.db")}
	key := keyURL(8)
	charge := func(base, k string) string {
		t.Helper()
		status, body := cardCharge(t, base, k)
		if status != http.StatusCreated {
			t.Fatalf("charge %s: %d %s", k, status, body)
		}
		return body
	}

	p := startServer(t, flags...)
	first := charge(p.base, "key-before-the-key")
	p.stop()
	p = startServer(t, append(flags, "--encryption-key", key)...)
	if got := charge(p.base, "key-before-the-key"); got != first {
		t.Fatalf("ready: the retry got %s, want the first charge %s", got, first)
	}
	p.stop()
	if code, out, errOut := runCmd(t, "keys", "seal", "begin", "--store", store, "--encryption-key", key, "--handoff", "1ms"); code != 0 {
		t.Fatalf("idem keys seal begin: exit %d: %s%s", code, out, errOut)
	}
	p = startServer(t, append(flags, "--encryption-key", key)...)
	if got := charge(p.base, "key-before-the-key"); got != first {
		t.Fatalf("sealed: the retry of a charge made before got %s, want the first charge %s (charged again)", got, first)
	}
	sealed := charge(p.base, "key-sealed")
	if got := charge(p.base, "key-sealed"); got != sealed {
		t.Fatalf("sealed: the retry got %s, want %s", got, sealed)
	}
	p.stop()
	// One record per request, under one scope: before, the retries made a second one
	// under the keyed scope, and a duplicate in flight ran beside the first.
	if code, out, errOut := runCmd(t, "keys", "list", "--store", store); code != 0 || strings.Count(out, "key-before-the-key") != 1 {
		t.Fatalf("idem keys list: exit %d, %d records of key-before-the-key, want 1:\n%s%s", code, strings.Count(out, "key-before-the-key"), out, errOut)
	}
	if s, code, logged := tryServer(t, flags...); s != nil || code == 0 || !strings.Contains(logged, "base64key:") {
		t.Fatalf("idem payments without the key on a sealed store: started %v, exit %d, logged %q; want it refused, naming the key", s != nil, code, logged)
	}
	// Told that sealing is being turned off, it starts; the sealed charge fails closed.
	p = startServer(t, append(flags, "--sealing-off")...)
	if !strings.Contains(p.start, "sealing=turning-off") {
		t.Errorf("start line %q; want sealing=turning-off", p.start)
	}
	if got := charge(p.base, "key-before-the-key"); got != first {
		t.Fatalf("--sealing-off: the retry of a charge made in clear got %s, want %s", got, first)
	}
}
