package check_test

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/check"
)

// target is a hand-written server of testdata that behaves as an idempotency library
// does, with the verdicts every run against it must get.
type target struct {
	name string
	// args are server.py's arguments (but --port).
	args []string
	// timeout is the checker's --timeout (default when 0): short where a key stays in
	// flight, so that a run is not dear.
	timeout time.Duration
	v       verdicts
	// racy are checks that meet the target's defect in some runs only, by the
	// server's timing, each with the cause it then fails of: such a run's verdict is
	// true too (the defect is the server's race, which the check named by v finds in
	// every run).
	racy map[string]string
}

// serverArgs are server.py's arguments for bugs, with a charge of 0.2 s.
func serverArgs(bugs string, more ...string) []string {
	return append([]string{"testdata/server.py", "--work", "0.2", "--bug", bugs}, more...)
}

// libraryTargets are the behaviours of issue 48 (two Python libraries run by hand,
// which cannot be installed here), each reproduced by server.py, and the targets of
// the probes that issue asked for, with the verdicts each must get. Every target
// serves PATCH; --body-invalid gets 400, so after-5xx skips unless said otherwise.
var libraryTargets = []target{
	// 1. A completed key's retry gets 409 with the first body and Location
	// (django-idempotency-key): a replay, warned of; the checks that need one run,
	// and the query left out of the key is found.
	{name: "replay-409", args: serverArgs("replay-409,query-not-bound"), v: verdicts{
		map[string]check.Status{"replay": check.StatusWarn, "other-request": check.StatusFail, "patch": check.StatusWarn},
		map[string][]string{"other-request": {"query-replayed"}},
	}},
	// 2. Keys not scoped per principal, replayed with 409: the other principal's
	// charge in a 409's body is a leak.
	{name: "leak-409", args: serverArgs("replay-409,global-keys"), v: verdicts{
		map[string]check.Status{"replay": check.StatusWarn, "per-principal": check.StatusFail, "patch": check.StatusWarn},
		map[string][]string{"per-principal": {"shared-across-principals"}},
	}},
	// 3. The empty key is a real key, the principal and the body hashed into it, kept
	// for ever: two identical requests with it are one; in every run alike.
	{name: "empty-key-kept", args: serverArgs("empty-key-kept,replay-409"), v: verdicts{
		map[string]check.Status{"replay": check.StatusWarn, "bad-keys": check.StatusWarn, "keyless": check.StatusFail, "patch": check.StatusWarn},
		map[string][]string{"keyless": {"empty-key-shared-across-requests"}},
	}},
	// 6. A 500 from an exception, and the connection closed after it without a word
	// (uvicorn): the next request goes on a new connection, and the causes hold.
	{name: "close-after-500", args: serverArgs("close-after-500"), v: verdicts{
		map[string]check.Status{"bad-keys": check.StatusFail},
		map[string][]string{"bad-keys": {"256-characters-server-error"}},
	}},
	// One lock for every key (django's Redis lock): other keys are turned away.
	{name: "global-lock", args: serverArgs("global-lock"), v: verdicts{
		map[string]check.Status{"concurrent-duplicates": check.StatusFail, "spread-duplicates": check.StatusFail, "distinct-keys": check.StatusFail},
		map[string][]string{"concurrent-duplicates": {"unexpected-answer"}, "spread-duplicates": {"unexpected-answer"}, "distinct-keys": {"distinct-keys-refused"}},
	}},
	// One lock for every key that requests wait for: they run one at a time.
	{name: "queue", args: serverArgs("queue"), v: verdicts{
		map[string]check.Status{"distinct-keys": check.StatusWarn}, nil,
	}},
	// PATCH ignores the key: its retry changes the charge again.
	{name: "patch-unkeyed", args: serverArgs("patch-unkeyed"), v: verdicts{
		map[string]check.Status{"patch": check.StatusFail},
		map[string][]string{"patch": {"patch-ran-twice"}},
	}},
	// A body that raises after the claim: 500, and the key stays in flight.
	{name: "crash-holds-key", args: serverArgs("crash-holds-key"), timeout: 2 * time.Second, v: verdicts{
		map[string]check.Status{"errors-not-stored": check.StatusFail, "after-5xx": check.StatusFail},
		map[string][]string{"errors-not-stored": {"key-bound-to-rejection"}, "after-5xx": {"held-after-5xx"}},
	}},
	// The same 500, the key released: its retry gets a final answer.
	{name: "crash-frees-key", args: serverArgs("crash-frees-key"), v: verdicts{
		map[string]check.Status{"after-5xx": check.StatusPass}, nil,
	}},
	// A record written in two steps (asgi-idempotency-header's Redis backend, its gap
	// widened to 50 ms): a duplicate between them gets 500. A burst's duplicate that a
	// loaded machine's server handles a charge late meets the gap too (3 of 20 runs of
	// the verdict table, under load: concurrent-duplicates fails of the same cause).
	{name: "two-writes", args: serverArgs("two-writes"), v: verdicts{
		map[string]check.Status{"spread-duplicates": check.StatusFail},
		map[string][]string{"spread-duplicates": {"unexpected-answer"}},
	}, racy: map[string]string{"concurrent-duplicates": "unexpected-answer"}},
}

// withPatch returns v where the patch check passes unless v says otherwise:
// server.py serves PATCH.
func (v verdicts) withPatch() verdicts {
	statuses := map[string]check.Status{"patch": check.StatusPass}
	for k, s := range v.statuses {
		statuses[k] = s
	}
	return verdicts{statuses, v.causes}
}

// targetRuns is how many runs each target gets against one server:
// IDEM_TEST_CHECK_RUNS, 2 by default (the second shows that a run does not depend on
// the one before it).
func targetRuns(t *testing.T) int {
	n := 2
	if v := os.Getenv("IDEM_TEST_CHECK_RUNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("IDEM_TEST_CHECK_RUNS=%q: want a number of runs", v)
		}
	}
	return n
}

// Each behaviour of issue 48 and each new probe's target gets its verdicts, the same
// in every run against one server: the second run's report, with the first's as its
// baseline, has no new failure and fixes nothing (a run does not depend on the runs
// before it), but in a target's racy checks.
func TestLibraryBehavioursGetTheirTrueVerdicts(t *testing.T) {
	t.Parallel()
	runs := targetRuns(t)
	for _, tg := range libraryTargets {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			url := startServer(t, "python3", append(tg.args, "--port", "0")...)
			var first *check.Report
			for i := range runs {
				cfg := config(url)
				cfg.Timeout = tg.timeout
				rep := run(t, cfg)
				v := tg.v.withPatch()
				for name, cause := range tg.racy {
					if c := result(t, rep, name); c.Status == check.StatusFail && slicesEqual(c.Causes, cause) {
						v.statuses[name] = check.StatusFail
						v.causes = maps.Clone(v.causes)
						v.causes[name] = []string{cause}
					}
				}
				wantVerdicts(t, rep, v)
				if first == nil {
					first = rep
				} else {
					if err := rep.ApplyBaseline(baselineOf(t, first)); err != nil {
						t.Fatal(err)
					}
					racy := func(name string) bool { _, ok := tg.racy[name]; return ok }
					if slices.ContainsFunc(rep.Baseline.New, func(n string) bool { return !racy(n) }) || slices.ContainsFunc(rep.Baseline.Fixed, func(n string) bool { return !racy(n) }) {
						t.Errorf("run %d with run 1 as its baseline: exit status %d, %s", i+1, rep.ExitStatus, rep.Baseline.Summary())
					}
				}
				if t.Failed() {
					t.Fatalf("run %d of %d", i+1, runs)
				}
			}
		})
	}
}

// A server that keeps the records of requests without a real key for ever (the empty
// key one key for each principal, or for everyone; a missing key one key for each
// principal) answers a later run's keyless requests from the first run's records: the
// second run against it gets the first run's verdicts and causes all the same. (The
// verdict table found the first run of each apart from the nineteen after it:
// bad-keys' empty-accepted and keyless's principals cause, which a principal's own
// record met again made, and keyless's empty-key-replayed.)
func TestASecondRunGetsTheFirstRunsVerdicts(t *testing.T) {
	t.Parallel()
	for _, bug := range []string{"accepts-bad-keys", "keyless-shared", "empty-key-shared"} {
		t.Run(bug, func(t *testing.T) {
			t.Parallel()
			url := startServer(t, "python3", "testdata/server.py", "--port", "0", "--bug", bug, "--work", "0.1")
			first, second := run(t, config(url)), run(t, config(url))
			for i, c := range first.Checks {
				d := second.Checks[i]
				if c.Status != d.Status || !slices.Equal(c.Causes, d.Causes) {
					t.Errorf("%s: %s %v in the first run (%s); %s %v in the second (%s)", c.Name, c.Status, c.Causes, c.Summary, d.Status, d.Causes, d.Summary)
				}
			}
		})
	}
}

// Every check run alone (--only) gets the verdict and causes it gets in a full run.
func TestEachCheckAloneGetsItsVerdictOfAFullRun(t *testing.T) {
	t.Parallel()
	for _, bugs := range []string{"replay-409,query-not-bound", "empty-key-kept,replay-409", "none"} {
		t.Run(bugs, func(t *testing.T) {
			t.Parallel()
			url := startServer(t, "python3", append(serverArgs(bugs), "--port", "0")...)
			full := run(t, config(url))
			for _, c := range check.Checks() {
				cfg := config(url)
				cfg.Checks = []*check.Check{c}
				alone := result(t, run(t, cfg), c.Name)
				want := result(t, full, c.Name)
				if alone.Status != want.Status || !slices.Equal(alone.Causes, want.Causes) {
					t.Errorf("%s alone: %s %v (%s); in a full run: %s %v (%s)", c.Name, alone.Status, alone.Causes, alone.Summary, want.Status, want.Causes, want.Summary)
				}
			}
		})
	}
}

// A completed key whose stored answer is 409 with the first body, met by the retry
// after a restart, is a final answer, not a key stuck in flight.
func TestARestartMeetingAStored409IsNotStuck(t *testing.T) {
	t.Parallel()
	// The record is stored (and outlives the process) before the answer, which waits
	// 1 s: the command kills the server in between.
	url, between := superviseServer(t, "python3", "testdata/server.py", "--work", "0.2", "--bug", "replay-409",
		"--state", filepath.Join(t.TempDir(), "records.json"), "--announce", "stored", "--late", "1")
	cfg := config(url)
	cfg.Between = between
	cfg.Timeout = 3 * time.Second
	cfg.Checks = []*check.Check{check.RestartCheck}
	rep := run(t, cfg)
	wantSays(t, rep, "restart", check.StatusPass, "after --between its retry got a final answer, 409 naming ch_", "a stored answer, not a lease still held")
}

// The restart check knows whether completed keys replay before its command restarts
// the server: run alone, it gets the verdict it gets after the replay check. (An
// in-memory server killed after answering forgets the key, and the retry runs again.)
func TestRestartAloneGetsTheVerdictOfAFullRun(t *testing.T) {
	t.Parallel()
	url, between := superviseServer(t, "python3", "testdata/server.py", "--work", "0.2", "--announce", "answered")
	for _, checks := range [][]*check.Check{{check.RestartCheck}, {check.ReplayCheck, check.RestartCheck}} {
		cfg := config(url)
		cfg.Between = between
		cfg.Checks = checks
		rep := run(t, cfg)
		wantSays(t, rep, "restart", check.StatusFail, "yet its retry after --between ran again")
		if c := result(t, rep, "restart"); !slicesEqual(c.Causes, "ran-twice") {
			t.Errorf("%d checks: restart failed of %v", len(checks), c.Causes)
		}
	}
}

// Each run draws its bodies' first number afresh, of as many digits, and the second
// body differs from the first; FixedBodies sends them as given.
func TestEachRunSendsBodiesNoEarlierRunSent(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 50 {
		b := string(check.FreshBody([]byte(`{"amount": 2000, "currency": "usd", "n": 5}`)))
		var amount int
		if _, err := fmt.Sscanf(b, `{"amount": %d, "currency": "usd", "n": 5}`, &amount); err != nil || amount < 1000 || amount > 9999 {
			t.Fatalf("FreshBody: %s", b)
		}
		seen[b] = true
	}
	if len(seen) < 40 {
		t.Errorf("50 fresh bodies, %d distinct", len(seen))
	}
	for in, re := range map[string]string{"0.25": "0.", "7": "", "-42": "-", "1e5": "e5", "amount=10&x=1": "amount="} {
		out := string(check.FreshBody([]byte(in)))
		if len(out) != len(in) || !strings.HasPrefix(out, re) && !strings.HasSuffix(out, re) {
			t.Errorf("FreshBody(%q) = %q", in, out)
		}
	}
	if got := string(check.FreshBody([]byte(`{"a":"b"}`))); got != `{"a":"b"}` {
		t.Errorf("FreshBody without a number: %q", got)
	}

	url := idemServer{}.start(t)
	for _, fixed := range []bool{false, true} {
		cfg := config(url)
		cfg.FixedBodies = fixed
		cfg.IncludeBodies = true
		cfg.Checks = []*check.Check{check.ReplayCheck, check.ChangedBodyCheck}
		rep := run(t, cfg)
		var sent []string
		for _, c := range rep.Checks {
			for _, x := range c.Evidence {
				sent = append(sent, x.Request.Body)
			}
		}
		if fixed != slices.Contains(sent, body) || fixed != slices.Contains(sent, `{"amount":99,"currency":"usd"}`) {
			t.Errorf("FixedBodies %v: sent %q", fixed, sent)
		}
	}
}

// A request written on a kept-alive connection that the server closed after its
// answer, without saying so (here once the next request arrives, unread: a reset), is
// sent again on a new connection, and its exchange says why; the verdict is the one
// the answer decides, in every run.
func TestARequestOnAConnectionClosedAfterItsAnswerIsSentAgain(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				const answer = `{"id":"ch_1","object":"charge"}`
				fmt.Fprintf(conn, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
				_, _ = br.Peek(1) // the next request: left unread, the close resets it
			}()
		}
	}()
	for range 3 {
		cfg := config("http://" + ln.Addr().String() + "/v1/charges")
		cfg.Checks = []*check.Check{check.ReplayCheck}
		rep := run(t, cfg)
		wantSays(t, rep, "replay", check.StatusPass, "201 again")
		c := result(t, rep, "replay")
		retry := c.Evidence[len(c.Evidence)-1]
		if !strings.HasPrefix(retry.Resent, "the first send, on a connection kept from an earlier answer, got no answer (") || retry.Response == nil {
			t.Errorf("the retry: %s, resent %q; want an answer on a new connection", retry.Outcome(), retry.Resent)
		}
	}
}

// tableTarget is a target of the verdict table: how to start it and configure a run.
type tableTarget struct {
	name  string
	start func(t *testing.T) check.Config
}

// pyTarget is a table target of server.py with bugs.
func pyTarget(bugs string, timeout time.Duration) tableTarget {
	return tableTarget{bugs, func(t *testing.T) check.Config {
		cfg := config(startServer(t, "python3", append(serverArgs(bugs), "--port", "0")...))
		cfg.Timeout = timeout
		return cfg
	}}
}

// The verdict of every check against every target of testdata, run
// IDEM_TEST_CHECK_RUNS times each (2 by default) against one server, printed as a
// Markdown table with the number of runs that got each verdict: set
// IDEM_TEST_CHECK_TABLE=1 to make it (it is slow: it is not one of CI's tests).
//
//	IDEM_TEST_CHECK_TABLE=1 IDEM_TEST_CHECK_RUNS=20 go test -run TestVerdictTable -parallel 2 -v ./internal/check
func TestVerdictTable(t *testing.T) {
	if os.Getenv("IDEM_TEST_CHECK_TABLE") == "" {
		t.Skip("IDEM_TEST_CHECK_TABLE is not set: the table is made by hand")
	}
	runs := targetRuns(t)
	var targets []tableTarget
	seen := map[string]bool{}
	for _, tg := range libraryTargets {
		bugs := tg.args[len(tg.args)-1]
		seen[bugs] = true
		targets = append(targets, pyTarget(bugs, tg.timeout))
	}
	for _, bug := range []string{"none", "race", "replay-differs", "changed-body-replayed", "stores-errors", "global-keys", "accepts-bad-keys",
		"keys-on-get", "optional-keys", "no-retry-after", "key-not-bound", "caches-get", "keyless-shared", "empty-key-shared", "no-replay"} {
		if !seen[bug] {
			targets = append(targets, pyTarget(bug, 0))
		}
	}
	targets = append(targets,
		tableTarget{"express-idempotency (memory)", func(t *testing.T) check.Config { return config(expressServer(t)) }},
		tableTarget{"express-idempotency (Redis)", func(t *testing.T) check.Config { return freshPrincipals(expressServer(t, redisArgs(t)...)) }},
		tableTarget{"express-idempotency (memory, two processes)", func(t *testing.T) check.Config {
			cfg := config(expressServer(t))
			cfg.Instances = []string{expressServer(t)}
			return cfg
		}},
		tableTarget{"@node-idempotency/nestjs (memory)", func(t *testing.T) check.Config { return config(nestServer(t)) }},
		tableTarget{"Fiber v3 (X-Idempotency-Key)", func(t *testing.T) check.Config {
			cfg := config(fiberServer(t))
			cfg.KeyHeader = "X-Idempotency-Key"
			return cfg
		}},
		tableTarget{"Fiber v2 on Redis, two processes", func(t *testing.T) check.Config {
			urls := fiber2Servers(t, 2)
			cfg := freshPrincipals(urls[0])
			cfg.Instances, cfg.KeyHeader = urls[1:], "X-Idempotency-Key"
			return cfg
		}},
	)
	for _, c := range []string{"header", "scoped", "validated"} {
		targets = append(targets, tableTarget{"Powertools (" + c + ", two processes)", func(t *testing.T) check.Config {
			urls := powertoolsServers(t, 2, "--config", c)
			cfg := freshPrincipals(urls[0])
			cfg.Instances = urls[1:]
			return cfg
		}})
	}
	rows := make([]string, len(targets))
	t.Run("targets", func(t *testing.T) {
		for i, tg := range targets {
			t.Run(tg.name, func(t *testing.T) {
				t.Parallel()
				base := tg.start(t)
				counts := map[string]map[string]int{} // check -> verdict (with causes) -> runs
				for range runs {
					cfg := base
					if strings.HasPrefix(tg.name, "Powertools") || strings.Contains(tg.name, "Redis") {
						fresh := freshPrincipals(cfg.URL)
						cfg.Header, cfg.Other = fresh.Header, fresh.Other
					}
					rep := run(t, cfg)
					for _, c := range rep.Checks {
						v := strings.ToUpper(string(c.Status))
						if len(c.Causes) > 0 {
							v += " " + strings.Join(c.Causes, ",")
						}
						if counts[c.Name] == nil {
							counts[c.Name] = map[string]int{}
						}
						counts[c.Name][v]++
					}
				}
				cells := []string{tg.name}
				for _, c := range check.Checks() {
					var vs []string
					for v, n := range counts[c.Name] {
						vs = append(vs, fmt.Sprintf("%s (%d/%d)", v, n, runs))
					}
					slices.Sort(vs)
					cell := strings.Join(vs, "; ")
					if len(vs) == 1 {
						cell = strings.TrimSuffix(vs[0], fmt.Sprintf(" (%d/%d)", runs, runs))
					}
					cells = append(cells, strings.ReplaceAll(cell, "|", "/"))
				}
				rows[i] = "| " + strings.Join(cells, " | ") + " |"
			})
		}
	})
	header := "| target | " + strings.Join(check.Names(), " | ") + " |\n|" + strings.Repeat("---|", len(check.Checks())+1)
	t.Logf("verdicts of %d runs per target (a cell names the runs of each verdict only where they differ):\n%s\n%s", runs, header, strings.Join(slices.DeleteFunc(rows, func(r string) bool { return r == "" }), "\n"))
}
