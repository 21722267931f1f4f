package check_test

import (
	"bufio"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/check"
	"github.com/idem-go/idem/internal/testenv"
)

// startTimeout bounds the start of a test server in another language (a pyenv shim
// alone takes a second or two on a loaded machine).
const startTimeout = time.Minute

// startServer runs a test server of testdata (program and its arguments, which must
// include --port 0) until t ends, and returns its charges endpoint's URL. The server
// prints "listening on HOST:PORT" once it accepts connections. A missing program
// skips t, or fails it under CI=true.
func startServer(t *testing.T, program string, args ...string) string {
	t.Helper()
	path, err := exec.LookPath(program)
	if err != nil {
		testenv.Unavailable(t, "%s is not on PATH, needed for the test servers of testdata/: %v", program, err)
	}
	cmd := exec.Command(path, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		for sc.Scan() { // "handling KEY" lines: drained, or the server would block
		}
	}()
	select {
	case l, ok := <-line:
		addr, found := strings.CutPrefix(l, "listening on ")
		if !ok || !found {
			<-exited
			t.Fatalf("%s %v printed %q, not its address; stderr:\n%s", program, args, l, stderr.String())
		}
		return "http://" + addr + "/v1/charges"
	case <-time.After(startTimeout):
		t.Fatalf("%s %v did not say where it listens within %v", program, args, startTimeout)
	}
	return ""
}

// A charges API whose Idempotency-Key support is written by hand in Python, as teams
// do: without a defect it passes every check; with one of the usual defects it fails
// exactly the check that defect breaks, with the evidence, and passes the others.
func TestHandWrittenServersFailExactlyTheCheckOfTheirDefect(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		bug    string
		check  string       // the check it breaks ("": none)
		status check.Status // that check's status
		says   string       // in that check's summary
		more   func(*testing.T, *check.Report)
		also   map[string]check.Status // other checks the defect shows in
	}{
		{bug: "none"},
		{"race", "concurrent-duplicates", check.StatusFail, "the duplicates ran more than once", raceEvidence,
			map[string]check.Status{"spread-duplicates": check.StatusFail}},
		{"replay-differs", "replay", check.StatusFail, "with another body: from byte", nil,
			map[string]check.Status{"patch": check.StatusFail}}, // a PATCH's replay differs too
		{"changed-body-replayed", "changed-body", check.StatusFail, "the changed body got the first answer", nil, nil},
		{"stores-errors", "errors-not-stored", check.StatusFail, "got 409 key_reused with the same key: the key stays bound to the rejected body", nil, nil},
		{"global-keys", "per-principal", check.StatusFail, "the other principal got the first principal's response", nil, nil},
		// An empty key taken as it is is one key, which every such request shares.
		{"accepts-bad-keys", "bad-keys", check.StatusFail, "empty 201, 256 characters 201, a list 201, two fields 201: accepted, but keys are required (a request without one got 400 key_required)", causes("empty-accepted", "256-characters-accepted", "list-accepted", "two-fields-accepted"),
			map[string]check.Status{"keyless": check.StatusFail}},
		{"keys-on-get", "safe-methods", check.StatusFail, "GET with a fresh key got 200, without a key 400 key_required", nil, nil},
		{"optional-keys", "bad-keys", check.StatusWarn, "missing 201 (keys are optional)", nil, nil},
		{"no-retry-after", "concurrent-duplicates", check.StatusWarn, "in-flight 409s had no Retry-After (§5.2)", nil,
			map[string]check.Status{"spread-duplicates": check.StatusWarn}},
		{"key-not-bound", "other-request", check.StatusFail, "another path (/v1/charges/idem-check) got the first answer (201, ch_", nil, nil},
		{"caches-get", "safe-methods", check.StatusFail, "keyed GETs are answered from a cache", nil, nil},
		// A missing key taken as one key per principal: the second keyless charge
		// with another body is refused as a reuse. Keys look optional to bad-keys.
		{"keyless-shared", "keyless", check.StatusFail, "two requests without a key with different bodies: the first ran (201, ch_", causes("missing-key-shared-across-requests", "missing-key-shared-across-bodies"),
			map[string]check.Status{"bad-keys": check.StatusWarn}},
		// The empty key as one key for everyone, whatever the body or principal.
		{"empty-key-shared", "keyless", check.StatusFail, "two requests with an empty key from different principals got one resource (ch_", causes("empty-key-shared-across-requests", "empty-key-shared-across-bodies", "empty-key-shared-across-principals"),
			map[string]check.Status{"bad-keys": check.StatusWarn}},
	} {
		t.Run(c.bug, func(t *testing.T) {
			t.Parallel()
			// The race needs duplicates to arrive within the work of the first: half a
			// second is ample even on a loaded machine.
			work := "0.2"
			if c.bug == "race" {
				work = "0.5"
			}
			url := startServer(t, "python3", "testdata/server.py", "--port", "0", "--bug", c.bug, "--work", work)
			rep := run(t, config(url))
			except := map[string]check.Status{"patch": check.StatusPass} // server.py serves PATCH
			if c.check != "" {
				except[c.check] = c.status
			}
			for name, s := range c.also {
				except[name] = s
			}
			want(t, rep, except)
			if c.check == "" {
				return
			}
			r := result(t, rep, c.check)
			if !strings.Contains(r.Summary, c.says) {
				t.Errorf("%s: %q, want it to say %q", c.check, r.Summary, c.says)
			}
			if rep.Failed() != (c.status == check.StatusFail) {
				t.Errorf("report failed: %v, with %s %s", rep.Failed(), c.check, c.status)
			}
			if c.more != nil {
				c.more(t, rep)
			}
		})
	}
}

// causes returns a check of the causes of the failure of the table's check.
func causes(want ...string) func(*testing.T, *check.Report) {
	return func(t *testing.T, rep *check.Report) {
		t.Helper()
		for _, c := range rep.Checks {
			if c.Status == check.StatusFail && slices.Equal(c.Causes, want) {
				return
			}
		}
		var got []string
		for _, c := range rep.Checks {
			if c.Status == check.StatusFail {
				got = append(got, fmt.Sprintf("%s %v", c.Name, c.Causes))
			}
		}
		t.Errorf("no failure with the causes %v; the failures: %v", want, got)
	}
}

// raceEvidence checks that the evidence of a race shows every duplicate and what it
// made, and that the report counts the resources the duplicates made.
func raceEvidence(t *testing.T, rep *check.Report) {
	r := result(t, rep, "concurrent-duplicates")
	bodies := map[string]bool{} // a replay's body is its resource's
	for _, x := range r.Evidence {
		if x.Response != nil && x.Response.Status == 201 {
			bodies[x.Response.BodySHA256] = true
		}
	}
	// The evidence is the failed rounds' exchanges, the distinct resources they made
	// counted once each.
	var failed, rounds int
	if _, err := fmt.Sscanf(r.Summary, "%d of %d rounds ran duplicates", &failed, &rounds); err != nil || rounds != check.DefaultRounds {
		t.Errorf("concurrent-duplicates: %q does not say how many rounds ran duplicates", r.Summary)
	}
	exchanges := failed * (check.DefaultConcurrency + 1)
	if r.Created < 2 || len(r.Evidence) != exchanges || len(bodies) > r.Created || len(bodies) < 2 {
		t.Errorf("concurrent-duplicates: created %d, %d exchanges, %d distinct 201 bodies; want 2 or more created, %d exchanges (%d failed rounds), at most one body per resource",
			r.Created, len(r.Evidence), len(bodies), exchanges, failed)
	}
	if !strings.Contains(r.Summary, fmt.Sprintf("%d requests at once made ", check.DefaultConcurrency)) || !strings.Contains(r.Summary, fmt.Sprintf("of %d rounds ran duplicates", check.DefaultRounds)) {
		t.Errorf("concurrent-duplicates: %q does not count the requests of a burst and the rounds", r.Summary)
	}
	// The first request, --body-invalid's retry, the other principal's, safe-methods'
	// write, and distinct-keys' one alone and Concurrency at once; spread-duplicates
	// made what it made.
	others := 4 + 1 + check.DefaultConcurrency + result(t, rep, "spread-duplicates").Created
	if rep.Created != others+r.Created {
		t.Errorf("the report says %d created, want %d: %d by the other checks and %d by the duplicates", rep.Created, others+r.Created, others, r.Created)
	}
}
