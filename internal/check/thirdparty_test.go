package check_test

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/check"
	"github.com/idem-go/idem/internal/testenv"
)

// The third-party libraries of testdata/node, pinned in its package.json and
// package-lock.json: .ci/run installs them with npm ci.
const nodeDir = "testdata/node"

// needNode skips t, or fails it under CI=true, unless node and the packages of
// testdata/node are installed.
func needNode(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Unavailable(t, "node is not on PATH, needed for the third-party libraries of %s: %v", nodeDir, err)
	}
	for _, pkg := range []string{"express", "express-idempotency", "express-idempotency-redis-adapter", "@nestjs/core", "@node-idempotency/nestjs", "@aws-lambda-powertools/idempotency", "@redis/client"} {
		if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", pkg, "package.json")); err != nil {
			testenv.Unavailable(t, "the npm package %s is not installed: run (cd internal/check/%s && npm ci)", pkg, nodeDir)
		}
	}
}

// expressServer starts testdata/node/server.js with args until t ends and returns its
// charges endpoint's URL.
func expressServer(t *testing.T, args ...string) string {
	t.Helper()
	needNode(t)
	return startServer(t, "node", append([]string{nodeDir + "/server.js", "--port", "0"}, args...)...)
}

// nestServer starts testdata/node/nest.js as expressServer does server.js.
func nestServer(t *testing.T, args ...string) string {
	t.Helper()
	needNode(t)
	return startServer(t, "node", append([]string{nodeDir + "/nest.js", "--port", "0"}, args...)...)
}

// redisArgs are the arguments of server.js for its Redis adapter on the test Redis.
func redisArgs(t *testing.T) []string {
	return []string{"--store", "redis", "--redis", testenv.RedisURL(t)}
}

// wantSays fails t unless the check named name has status s and its summary says
// each of says.
func wantSays(t *testing.T, rep *check.Report, name string, s check.Status, says ...string) {
	t.Helper()
	c := result(t, rep, name)
	if c.Status != s {
		t.Errorf("%s: %s (%s), want %s", name, c.Status, c.Summary, s)
	}
	for _, w := range says {
		if !strings.Contains(c.Summary, w) {
			t.Errorf("%s: %q does not say %q", name, c.Summary, w)
		}
	}
}

// The defects of express-idempotency 1.0.6 (dist/services/idempotencyService.js), in
// memory, mounted as its README says (app.post('*', idempotency())), that a black box
// shows, each found by its check in every run:
//   - a replay carries only Content-Type (buildIdempotencyResponse's headerWhitelist):
//     the 201's Location is lost (replay fails);
//   - a key is looked up by itself (findByIdempotencyKey(idempotencyKey)): another
//     principal's request with it gets the first principal's charge (per-principal
//     fails);
//   - a duplicate in flight gets 409 through next(err), Express's HTML error page,
//     without Retry-After (concurrent-duplicates warns: the in-memory adapter's
//     find-then-create runs in one turn of the event loop, so one charge is made);
//   - a changed body is 417 Expectation Failed, an HTML page (changed-body warns,
//     naming 417 and the page's text);
//   - a request without a key, or with an empty one, runs (bad-keys warns: keys are
//     optional).
func TestExpressIdempotencyInMemory(t *testing.T) {
	t.Parallel()
	rep := run(t, config(expressServer(t)))
	want(t, rep, map[string]check.Status{
		"replay": check.StatusFail, "per-principal": check.StatusFail,
		"concurrent-duplicates": check.StatusWarn, "spread-duplicates": check.StatusWarn, "changed-body": check.StatusWarn, "bad-keys": check.StatusWarn,
	})
	wantSays(t, rep, "replay", check.StatusFail, `the retry got Location "" where the first answer had "/v1/charges/ch_`)
	wantSays(t, rep, "per-principal", check.StatusFail, "the other principal got the first principal's response")
	wantSays(t, rep, "concurrent-duplicates", check.StatusWarn, "in-flight 409s had no Retry-After", "409 Error: A previous request is still in progress for this key.")
	wantSays(t, rep, "changed-body", check.StatusWarn, "refused, with 417 Error: Misuse of the idempotency key. Please check your request., where profile seed answers 409")
	wantSays(t, rep, "bad-keys", check.StatusWarn, "missing 201 (keys are optional)")
	if rep.ExitStatus != 1 {
		t.Errorf("exit status %d, want 1", rep.ExitStatus)
	}
}

// raceRounds are the rounds of the runs that must find the Redis adapter's race.
// Measured on a loaded machine of two cores, 75% to 95% of bursts run duplicates (the
// server sometimes handles the first request alone before the others' last bytes
// arrive), so a run of the default 3 rounds misses it about once in 300; 8 rounds miss
// it less than once in a million.
const raceRounds = 8

// express-idempotency-redis-adapter 1.0.8 (src/index.ts), mounted as its README says
// (app.use(idempotency({ dataAdapter }))), adds three defects a black box shows:
//   - create is a plain SET after the middleware's GET, no SET NX: duplicates sent at
//     once all find nothing and all run (concurrent-duplicates fails, ten runs in a
//     row);
//   - app.use puts GETs under the middleware too: a GET with a key is stored and
//     replayed, so after a write it answers the stale list (safe-methods fails);
//   - the in-flight record is written with the adapter's TTL (a day) and only a
//     response replaces it: a server killed mid-request leaves the key in flight, and
//     every retry gets 409 (restart fails; TestNodeLibrariesOnRedisLeaveAKeyStuck).
func TestExpressIdempotencyOnRedis(t *testing.T) {
	t.Parallel()
	url := expressServer(t, redisArgs(t)...)
	cfg := config(url)
	cfg.Rounds = raceRounds
	rep := run(t, cfg)
	want(t, rep, map[string]check.Status{
		"replay": check.StatusFail, "per-principal": check.StatusFail, "concurrent-duplicates": check.StatusFail,
		"safe-methods": check.StatusFail, "changed-body": check.StatusWarn, "bad-keys": check.StatusWarn,
		// Its race shows in a spread round only when duplicates land before the first
		// request's in-flight SET: in some rounds, not judged here.
		"spread-duplicates": result(t, rep, "spread-duplicates").Status,
	})
	wantSays(t, rep, "safe-methods", check.StatusFail, "keyed GETs are answered from a cache")
	wantSays(t, rep, "concurrent-duplicates", check.StatusFail, "the duplicates ran more than once")
	// The race, nine more times in a row.
	for i := range 9 {
		cfg := config(url)
		cfg.Rounds = raceRounds
		cfg.Checks = []*check.Check{check.ConcurrencyCheck}
		rep := run(t, cfg)
		if c := result(t, rep, "concurrent-duplicates"); c.Status != check.StatusFail {
			t.Errorf("run %d of 10: concurrent-duplicates %s (%s), want fail", i+2, c.Status, c.Summary)
		}
	}
}

// Two processes of the in-memory express-idempotency, as two replicas behind no
// balancer: each keeps its own keys, so a retry on the other instance runs again
// (replay fails) and each instance runs its share of a burst (concurrent-duplicates
// fails, naming the instances).
func TestExpressIdempotencyOnTwoInstances(t *testing.T) {
	t.Parallel()
	cfg := config(expressServer(t))
	cfg.Instances = []string{expressServer(t)}
	rep := run(t, cfg)
	wantSays(t, rep, "replay", check.StatusFail, "the retry on instance 2 got another resource")
	wantSays(t, rep, "concurrent-duplicates", check.StatusFail, "3 of 3 rounds ran duplicates", "made 2 resources", "answers: instance 1: ", "; instance 2: ")
	if c := result(t, rep, "concurrent-duplicates"); strings.Count(c.Summary, "instance 1: ") != 1 || strings.Count(c.Summary, "instance 2: ") != 1 {
		t.Errorf("concurrent-duplicates: %q does not tally each instance once", c.Summary)
	}
	if rep.Hint != "" {
		t.Errorf("hint %q: the first instance replays, so the key is not ignored", rep.Hint)
	}
	for _, x := range result(t, rep, "concurrent-duplicates").Evidence {
		if x.Instance != 1 && x.Instance != 2 {
			t.Fatalf("%s: instance %d, want 1 or 2", x.Label, x.Instance)
		}
	}
	// The reports say which instance answered.
	var text, page strings.Builder
	if err := errors.Join(rep.WriteText(&text), rep.WriteHTML(&page)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "(instance 2)\n") || !strings.Contains(page.String(), "(instance 2, ") || !strings.Contains(page.String(), "instances: "+cfg.URL+", "+cfg.Instances[0]) {
		t.Errorf("the reports do not name the instances:\n%s", text.String())
	}
}

// A server killed in the middle of a request and started again: on Redis both
// libraries leave the key in flight, express-idempotency's adapter for its TTL of a
// day and @node-idempotency's for cacheTTLMS, a day too (every retry 409): restart
// fails, and having asked on for three times --timeout more, says the key stays
// stuck. In memory the restart forgets the key and its retry runs, which passes.
func TestNodeLibrariesOnRedisLeaveAKeyStuck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		script string
		args   func(*testing.T) []string
		status check.Status
		says   string
	}{
		{"express-idempotency/redis", "server.js", redisArgs, check.StatusFail, "the key is still in flight"},
		{"express-idempotency/memory", "server.js", func(*testing.T) []string { return nil }, check.StatusPass, "after --between its retry got 201"},
		{"node-idempotency/redis", "nest.js", redisArgs, check.StatusFail, "the key is still in flight"},
		{"node-idempotency/memory", "nest.js", func(*testing.T) []string { return nil }, check.StatusPass, "after --between its retry got 201"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			needNode(t)
			// The charge takes 2 s: the kill lands while it runs, and a retry that
			// runs it again ends within the timeout.
			url, between := superviseServer(t, "node", append([]string{nodeDir + "/" + c.script, "--work", "2000"}, c.args(t)...)...)
			cfg := config(url)
			cfg.Between = between
			cfg.Timeout = 5 * time.Second
			cfg.Checks = []*check.Check{check.RestartCheck}
			rep := run(t, cfg)
			wantSays(t, rep, "restart", c.status, c.says)
			if c.status == check.StatusFail && (!rep.Failed() || !slicesEqual(result(t, rep, "restart").Causes, "stuck")) {
				t.Errorf("the report did not fail with the cause stuck: %v", result(t, rep, "restart").Causes)
			}
		})
	}
}

// @node-idempotency/nestjs 1.0.4 (dist/interceptors/node-idempotency.iterceptor.js)
// with @node-idempotency/core 1.0.7, mounted as its README says (@Idempotent() on
// the controller), claims keys atomically (setIfNotExists) under method, URL and key,
// so concurrent-duplicates and other-request pass. What a black box shows:
//   - a replay carries only the headers of shared's headers2Cache: the 201's
//     Location is lost (replay fails);
//   - the key is not scoped per principal (per-principal fails);
//   - an error response is stored like a success (catchError calls onResponse): a
//     400 binds the key to the rejected body, and the valid body then gets 422
//     (errors-not-stored fails);
//   - @Idempotent() on the controller covers its GET: a GET with a used key is a
//     replay (safe-methods fails);
//   - a changed body is 422 (changed-body warns in the seed profile, passes in ietf);
//   - keys are optional (bad-keys warns).
func TestNodeIdempotencyNestjs(t *testing.T) {
	t.Parallel()
	url := nestServer(t)
	rep := run(t, config(url))
	want(t, rep, map[string]check.Status{
		"replay": check.StatusFail, "per-principal": check.StatusFail, "errors-not-stored": check.StatusFail,
		"safe-methods": check.StatusFail, "changed-body": check.StatusWarn, "bad-keys": check.StatusWarn,
	})
	wantSays(t, rep, "replay", check.StatusFail, `the retry got Location "" where the first answer had "/v1/charges/ch_`)
	wantSays(t, rep, "per-principal", check.StatusFail, "keys are not scoped per principal")
	wantSays(t, rep, "errors-not-stored", check.StatusFail, "--body-invalid got 400 parameter_invalid, then --body got 422")
	wantSays(t, rep, "safe-methods", check.StatusFail, "GET with the same key again was answered as a replay")
	wantSays(t, rep, "changed-body", check.StatusWarn, "refused, with 422", "--profile ietf")

	cfg := config(url)
	cfg.Profile = check.ProfileIETF
	cfg.Checks = []*check.Check{check.ChangedBodyCheck}
	wantSays(t, run(t, cfg), "changed-body", check.StatusPass, "the first body still gets its first answer")
}

// superviseServer runs program with args and --port until t ends, starting it again
// on the same port whenever it dies, and returns its charges endpoint's URL and a
// --between command that waits until the program prints "handling KEY" for the
// command's key (its request is in the handler), kills it (SIGKILL) and returns once
// the new process listens.
func superviseServer(t *testing.T, program string, args ...string) (url, between string) {
	t.Helper()
	path, err := exec.LookPath(program)
	if err != nil {
		testenv.Unavailable(t, "%s is not on PATH: %v", program, err)
	}
	dir := t.TempDir()
	pidFile, upFIFO, startedFIFO := filepath.Join(dir, "pid"), filepath.Join(dir, "up"), filepath.Join(dir, "started")
	for _, f := range []string{upFIFO, startedFIFO} {
		if err := syscall.Mkfifo(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// say writes line to fifo once a reader opens it (the --between command, or the
	// cleanup's).
	say := func(fifo, line string) {
		if f, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
	// The keys whose requests entered the handler go to startedFIFO through one
	// writer that keeps it open, in order: writers of their own could close it
	// between two lines, and a reader that saw the end would lose the next line.
	started, stop := make(chan string, 64), make(chan struct{})
	go func() {
		for {
			f, err := os.OpenFile(startedFIFO, os.O_WRONLY, 0)
			if err != nil {
				return
			}
			for open := true; open; {
				select {
				case <-stop:
					f.Close()
					return
				case key := <-started:
					if _, err := fmt.Fprintln(f, key); err != nil { // the reader went
						f.Close()
						open = false
					}
				}
			}
		}
	}()
	var (
		mu       sync.Mutex
		cur      *exec.Cmd
		stopping bool
	)
	// start runs one process and returns the address it listens on and a channel
	// closed when it exits.
	start := func(port string) (string, chan struct{}) {
		cmd := exec.Command(path, append(append([]string{}, args...), "--port", port)...)
		// An os.Pipe, not StdoutPipe: Wait must not close what the scanner reads.
		stdout, w, err := os.Pipe()
		if err != nil {
			t.Error(err)
			return "", nil
		}
		cmd.Stdout = w
		err = cmd.Start()
		w.Close()
		if err != nil {
			stdout.Close()
			t.Error(err)
			return "", nil
		}
		exited := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		mu.Lock()
		cur = cmd
		mu.Unlock()
		if err := os.WriteFile(pidFile, []byte(fmt.Sprint(cmd.Process.Pid)), 0o600); err != nil {
			t.Error(err)
		}
		sc := bufio.NewScanner(stdout)
		if !sc.Scan() {
			t.Errorf("%s %v said nothing", program, args)
			return "", exited
		}
		go func() {
			defer stdout.Close()
			for sc.Scan() {
				if key, ok := strings.CutPrefix(sc.Text(), "handling "); ok {
					select {
					case started <- key: // the key's request is in the handler
					default:
					}
				}
			}
		}()
		addr, ok := strings.CutPrefix(sc.Text(), "listening on ")
		if !ok {
			t.Errorf("%s %v printed %q", program, args, sc.Text())
		}
		return addr, exited
	}
	addr, exited := start("0")
	if addr == "" {
		t.FailNow()
	}
	_, port, _ := strings.Cut(addr, ":")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			<-exited
			mu.Lock()
			stop := stopping
			mu.Unlock()
			if stop {
				return
			}
			if _, exited = start(port); exited == nil {
				return
			}
			say(upFIFO, "up") // the new process listens
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		stopping = true
		c := cur
		mu.Unlock()
		_ = c.Process.Kill()
		close(stop)
		// Unblock the writers waiting for no command.
		for _, fifo := range []string{upFIFO, startedFIFO} {
			if f, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
				defer f.Close()
			}
		}
		<-done
	})
	// The command waits until the request of its key (IDEM_CHECK_KEY) is in the
	// handler, so that the key is claimed (the run's first request, the fixture, went
	// through the handler before it), kills the process, and waits until the new one
	// listens.
	between = fmt.Sprintf(`while read -r k && [ "$k" != "$IDEM_CHECK_KEY" ]; do :; done < %s && kill -KILL "$(cat %s)" && read -r _ < %s`, startedFIFO, pidFile, upFIFO)
	return "http://" + addr + "/v1/charges", between
}

// fiberServer builds testdata/fiber (its own module: Fiber v3.1.0's idempotency
// middleware) with the go command and serves it until t ends; it returns its charges
// endpoint's URL.
func fiberServer(t *testing.T) string {
	t.Helper()
	exe := buildModule(t, "testdata/fiber")
	return startServer(t, exe, "-addr", "127.0.0.1:0")
}

// Fiber v3.1.0's idempotency middleware (middleware/idempotency/idempotency.go),
// mounted as its documentation says (app.Use(idempotency.New())), reads
// X-Idempotency-Key: checked with the default Idempotency-Key, it looks as if it
// ignored keys, and the checker stops after the replay check with a hint instead of
// creating dozens of charges. With --key-header X-Idempotency-Key, its defects, each
// found by its check:
//   - the stored response is looked up by the key alone (maybeWriteCachedResponse(c,
//     key)): a changed body gets the first answer (changed-body fails), so do DELETE,
//     another path and another query (other-request fails), and another principal
//     (per-principal fails);
//   - a handler's 400 returned with a nil error is stored like any response: the key
//     then replays the 400 to a valid body (errors-not-stored fails);
//   - a key of another length than 36 is KeyHeaderValidate's error, which Fiber
//     answers 500 (bad-keys fails), and a request without a key runs.
//
// Its lock makes one charge of a burst and replays it to the others: concurrent-
// duplicates passes, and replay and safe-methods too.
func TestFiberIdempotencyMiddleware(t *testing.T) {
	t.Parallel()
	url := fiberServer(t)

	rep := run(t, config(url))
	wantSays(t, rep, "replay", check.StatusFail, "the request ran twice")
	if !strings.Contains(rep.Hint, "is --key-header Idempotency-Key the header it reads?") || rep.Counts[check.StatusSkip] != len(check.Checks())-1 || rep.Created != 2 {
		t.Errorf("with Idempotency-Key: hint %q, counts %v, created %d; want the hint, every other check skipped, 2 created", rep.Hint, rep.Counts, rep.Created)
	}

	cfg := config(url)
	cfg.KeyHeader = "X-Idempotency-Key"
	rep = run(t, cfg)
	want(t, rep, map[string]check.Status{
		"changed-body": check.StatusFail, "other-request": check.StatusFail, "per-principal": check.StatusFail,
		"errors-not-stored": check.StatusFail, "bad-keys": check.StatusFail,
	})
	wantSays(t, rep, "changed-body", check.StatusFail, "the changed body got the first answer")
	wantSays(t, rep, "other-request", check.StatusFail, "another method (DELETE) got the first answer (201, ch_")
	wantSays(t, rep, "errors-not-stored", check.StatusFail, "the key replays its rejection (400 parameter_invalid) to a valid body")
	wantSays(t, rep, "bad-keys", check.StatusFail, "256 characters 500 invalid idempotency key")
	wantSays(t, rep, "per-principal", check.StatusFail, "keys are not scoped per principal")
}

// verdicts are what a run must find: each check's status, and the causes of each
// failure.
type verdicts struct {
	statuses map[string]check.Status // the checks that do not pass
	causes   map[string][]string     // of each failure
}

// wantVerdicts fails t unless rep found v exactly.
func wantVerdicts(t *testing.T, rep *check.Report, v verdicts) {
	t.Helper()
	want(t, rep, v.statuses)
	for _, c := range rep.Checks {
		if c.Status == check.StatusFail && !slicesEqual(c.Causes, v.causes[c.Name]...) {
			t.Errorf("%s failed of %v (%s), want %v", c.Name, c.Causes, c.Summary, v.causes[c.Name])
		}
	}
}

// freshPrincipals returns config(url) with two principals no run used before: a
// library that keeps what a principal's keyless requests did (for an hour, in Redis)
// must be judged on what this run did.
func freshPrincipals(url string) check.Config {
	cfg := config(url)
	cfg.Header = http.Header{"Authorization": {"Bearer sk_test_" + rand.Text()}}
	cfg.Other = http.Header{"Authorization": {"Bearer sk_test_" + rand.Text()}}
	return cfg
}

// powertoolsServers starts n processes of testdata/node/powertools.js with args on
// the test Redis, as one deployment of one function (its name, the records' key
// prefix, fresh for each call), and returns their charges endpoints' URLs.
func powertoolsServers(t *testing.T, n int, args ...string) []string {
	t.Helper()
	needNode(t)
	fn := "charges_" + rand.Text()[:12]
	var urls []string
	for range n {
		urls = append(urls, startServer(t, "node", append([]string{nodeDir + "/powertools.js", "--port", "0", "--redis", testenv.RedisURL(t), "--function", fn}, args...)...))
	}
	return urls
}

// Powertools for AWS Lambda (TypeScript) 2.35.0's idempotency utility
// (@aws-lambda-powertools/idempotency, CachePersistenceLayer on @redis/client), in
// a function behind an emulated API Gateway (testdata/node/powertools.js), two
// processes on one Redis as two concurrent Lambda environments; three runs of each
// configuration find the same defects with the same causes, and nothing else:
//   - every configuration stores a 4xx like a success: the --body-invalid's 400 is
//     replayed to the valid body (errors-not-stored fails);
//   - the key is hashed from what eventKeyJmesPath selects and nothing else, so a
//     changed body (without payload validation) and another query get the first
//     answer (changed-body, other-request fail); with the header alone, so does
//     another principal (per-principal fails);
//   - a key that selects null skips the utility, but anything else is hashed: with
//     the header alone the empty key "" is one key for every principal and body;
//     scoped ([authorization, key]) a missing key is [token, null], one key for
//     each principal's keyless requests, and the empty one too (keyless fails,
//     naming the key form);
//   - with payloadValidationJmesPath, the completed record is written without the
//     payload's hash (CachePersistenceLayer._updateRecord), so every retry of a
//     completed key fails validation: 422 (replay fails), and the checks that need
//     a replay say so instead of blaming the refusal or the principals (skip);
//   - a duplicate in flight is IdempotencyAlreadyInProgressError, answered 409
//     without Retry-After (concurrent-duplicates warns); keys are optional
//     (bad-keys warns).
//
// The claim is a SET NX: duplicates across the two processes make one charge.
func TestPowertoolsIdempotencyOnRedisAcrossTwoProcesses(t *testing.T) {
	t.Parallel()
	warns := func(more map[string]check.Status) map[string]check.Status {
		m := map[string]check.Status{"concurrent-duplicates": check.StatusWarn, "spread-duplicates": check.StatusWarn, "bad-keys": check.StatusWarn}
		for k, v := range more {
			m[k] = v
		}
		return m
	}
	for _, c := range []struct {
		config string
		v      verdicts
	}{
		{"header", verdicts{
			warns(map[string]check.Status{"changed-body": check.StatusFail, "other-request": check.StatusFail, "errors-not-stored": check.StatusFail, "keyless": check.StatusFail, "per-principal": check.StatusFail}),
			map[string][]string{
				"changed-body": {"changed-body-replayed"}, "other-request": {"query-replayed"}, "errors-not-stored": {"rejection-replayed"},
				"keyless": {"empty-key-shared-across-requests", "empty-key-shared-across-bodies", "empty-key-shared-across-principals"}, "per-principal": {"shared-across-principals"},
			},
		}},
		{"scoped", verdicts{
			warns(map[string]check.Status{"changed-body": check.StatusFail, "other-request": check.StatusFail, "errors-not-stored": check.StatusFail, "keyless": check.StatusFail}),
			map[string][]string{
				"changed-body": {"changed-body-replayed"}, "other-request": {"query-replayed"}, "errors-not-stored": {"rejection-replayed"},
				"keyless": {"missing-key-shared-across-requests", "missing-key-shared-across-bodies", "empty-key-shared-across-requests", "empty-key-shared-across-bodies"},
			},
		}},
		{"validated", verdicts{
			warns(map[string]check.Status{"replay": check.StatusFail, "errors-not-stored": check.StatusFail, "keyless": check.StatusFail,
				"changed-body": check.StatusSkip, "other-request": check.StatusSkip, "per-principal": check.StatusSkip}),
			map[string][]string{
				"replay": {"status-differs"}, "errors-not-stored": {"key-bound-to-rejection"},
				"keyless": {"missing-key-shared-across-requests", "missing-key-shared-across-bodies", "empty-key-shared-across-requests", "empty-key-shared-across-bodies"},
			},
		}},
	} {
		t.Run(c.config, func(t *testing.T) {
			t.Parallel()
			urls := powertoolsServers(t, 2, "--config", c.config)
			for i := range 3 {
				cfg := freshPrincipals(urls[0])
				cfg.Instances = urls[1:]
				rep := run(t, cfg)
				wantVerdicts(t, rep, c.v)
				if i == 0 && c.config == "validated" {
					for _, name := range []string{"changed-body", "other-request", "per-principal"} {
						wantSays(t, rep, name, check.StatusSkip, `the endpoint replays no completed key (a retry of the first request got 422 {"message":"Payload does not match stored record for this event key"}; see replay)`)
					}
				}
				if t.Failed() {
					t.Fatalf("run %d of 3", i+1)
				}
			}
		})
	}
}

// Powertools' in-flight record lasts as long as the Lambda's remaining time (here 8
// s from the first request): a function killed mid-charge leaves its key in flight
// until then, and the next retry takes it over and charges. With --timeout below that, restart fails for the
// right cause, the lease, and says which --timeout to give; with --timeout above
// it, restart passes.
func TestPowertoolsLeaseLongerThanTimeoutIsNamed(t *testing.T) {
	t.Parallel()
	needNode(t)
	url, between := superviseServer(t, "node", nodeDir+"/powertools.js", "--config", "scoped", "--redis", testenv.RedisURL(t),
		"--function", "charges_"+rand.Text()[:12], "--work", "1000", "--lambda-timeout", "8000")
	cfg := config(url)
	cfg.Between = between
	cfg.Timeout = 2 * time.Second
	cfg.Checks = []*check.Check{check.RestartCheck}
	rep := run(t, cfg)
	wantSays(t, rep, "restart", check.StatusFail, "still in flight after --timeout (2 s); the server's lease looks longer: the key got a final answer, 201", "give --timeout ")
	if c := result(t, rep, "restart"); !slicesEqual(c.Causes, "lease-longer-than-timeout") {
		t.Errorf("restart failed of %v", c.Causes)
	}
	cfg.Timeout = 10 * time.Second
	wantSays(t, run(t, cfg), "restart", check.StatusPass, "after --between its retry got 201")
}

// fiber2Servers builds testdata/fiber2 (its own module: Fiber v2.52.12's idempotency
// middleware on gofiber/storage/redis v3.4.3) and starts n processes of it on the
// test Redis, as replicas of one API; it returns their URLs.
func fiber2Servers(t *testing.T, n int) []string {
	t.Helper()
	exe := buildModule(t, "testdata/fiber2")
	var urls []string
	for range n {
		// A charge takes a second: a burst's requests reach both processes within it,
		// however loaded the machine.
		urls = append(urls, startServer(t, exe, "-addr", "127.0.0.1:0", "-redis", testenv.RedisURL(t), "-work", "1s"))
	}
	return urls
}

// Fiber v2.52.12's idempotency middleware (middleware/idempotency) with its records
// in Redis (Config.Storage: gofiber/storage/redis v3.4.3), two processes on one
// Redis, checked with --key-header X-Idempotency-Key: a run finds these defects with
// these causes, and nothing else, and two more runs of concurrent-duplicates find
// its race again:
//   - its lock is a mutex of each process (Config.Lock defaults to
//     NewMemoryLock): duplicates sent at once to both run once on each, two charges
//     a burst (concurrent-duplicates fails, every round of every run);
//   - the stored response is looked up by the key alone: a changed body, another
//     method, path or query and another principal get the first answer
//     (changed-body, other-request, per-principal fail);
//   - a 400 returned by the handler is stored like any response (errors-not-stored
//     fails);
//   - a key that is not 36 characters long is KeyHeaderValidate's error, answered
//     500 (bad-keys fails); a missing or empty key skips the middleware (keyless
//     passes: each runs as itself).
func TestFiberV2IdempotencyOnRedisAcrossTwoProcesses(t *testing.T) {
	t.Parallel()
	urls := fiber2Servers(t, 2)
	v := verdicts{
		map[string]check.Status{
			"concurrent-duplicates": check.StatusFail, "spread-duplicates": check.StatusFail, "changed-body": check.StatusFail, "other-request": check.StatusFail,
			"errors-not-stored": check.StatusFail, "bad-keys": check.StatusFail, "per-principal": check.StatusFail,
		},
		map[string][]string{
			"concurrent-duplicates": {"duplicates-ran"}, "spread-duplicates": {"duplicates-ran"}, "changed-body": {"changed-body-replayed"},
			"other-request": {"method-replayed", "path-replayed", "query-replayed"}, "errors-not-stored": {"rejection-replayed"},
			"bad-keys": {"256-characters-server-error", "list-server-error"}, "per-principal": {"shared-across-principals"},
		},
	}
	cfg := freshPrincipals(urls[0])
	cfg.Instances = urls[1:]
	cfg.KeyHeader = "X-Idempotency-Key"
	rep := run(t, cfg)
	wantVerdicts(t, rep, v)
	wantSays(t, rep, "concurrent-duplicates", check.StatusFail, "3 of 3 rounds ran duplicates")
	// The race, twice more (the other defects are the middleware's logic, the same
	// in every run; each charge takes a second, so runs are dear).
	for i := range 2 {
		cfg.Checks = []*check.Check{check.ConcurrencyCheck}
		rep := run(t, cfg)
		wantSays(t, rep, "concurrent-duplicates", check.StatusFail, "3 of 3 rounds ran duplicates")
		if c := result(t, rep, "concurrent-duplicates"); !slicesEqual(c.Causes, "duplicates-ran") {
			t.Errorf("run %d of 3: concurrent-duplicates failed of %v", i+2, c.Causes)
		}
	}
}
