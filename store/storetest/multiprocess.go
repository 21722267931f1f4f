package storetest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// Defaults of [MultiProcess].
const (
	// DefaultProcesses is how many child processes run at once.
	DefaultProcesses = 4
	// DefaultKeys is how many keys every child claims in RunMultiProcess.
	DefaultKeys = 200
	// DefaultClaimsPerKey is how many goroutines of each child claim each key at once.
	DefaultClaimsPerKey = 2
	// DefaultTimeout bounds a multi-process run, children included.
	DefaultTimeout = 3 * time.Minute
)

// MultiProcess describes a store to [RunMultiProcess] and [RunMigrateConcurrently]. The
// test that calls them runs again in every child process, so the functions below must
// not depend on anything but their arguments and what the test set up before the call.
type MultiProcess struct {
	// NewDSN creates a fresh, empty database private to the test (its own schema, file
	// or key prefix), not yet migrated, and returns the DSN the store opens it with. It
	// runs in the parent process only; children get the DSN through the environment.
	// It may register clean-up with t.Cleanup. Required.
	NewDSN func(t testing.TB) string

	// Open opens the store at dsn, migrated already, and closes it at t.Cleanup. It runs
	// in the parent and in every child. Required by RunMultiProcess; optional for
	// RunMigrateConcurrently, which then also proves the migrated schema serves a claim.
	Open func(t testing.TB, dsn string) idemstore.Store

	// Migrate migrates the database at dsn. RunMigrateConcurrently runs it in every
	// child at the same instant (required there); RunMultiProcess runs it once in the
	// parent before the children start, when set.
	Migrate func(dsn string) error

	// CheckSchema, when set, runs in the parent after the concurrent migrations and
	// checks that the schema is present exactly once, for instance that the migrations
	// table holds one row per version. Optional.
	CheckSchema func(t testing.TB, dsn string)

	// Processes is how many child processes run at once. Defaults to DefaultProcesses.
	Processes int
	// Keys is how many keys every child claims. Defaults to DefaultKeys.
	Keys int
	// ClaimsPerKey is how many goroutines of every child claim each key at once.
	// Defaults to DefaultClaimsPerKey.
	ClaimsPerKey int
	// Timeout bounds the whole run. Defaults to DefaultTimeout.
	Timeout time.Duration
}

func (p *MultiProcess) setDefaults() {
	if p.Processes <= 0 {
		p.Processes = DefaultProcesses
	}
	if p.Keys <= 0 {
		p.Keys = DefaultKeys
	}
	if p.ClaimsPerKey <= 0 {
		p.ClaimsPerKey = DefaultClaimsPerKey
	}
	if p.Timeout <= 0 {
		p.Timeout = DefaultTimeout
	}
}

// Environment shared by the parent with its children.
const (
	envRole   = "IDEM_STORETEST_ROLE" // roleClaim or roleMigrate
	envTest   = "IDEM_STORETEST_TEST" // the test the child runs as, t.Name()
	envDSN    = "IDEM_STORETEST_DSN"
	envScope  = "IDEM_STORETEST_SCOPE"
	envKeys   = "IDEM_STORETEST_KEYS"   // key prefix
	envNKeys  = "IDEM_STORETEST_NKEYS"  // number of keys
	envClaims = "IDEM_STORETEST_CLAIMS" // claims per key
	envChild  = "IDEM_STORETEST_CHILD"  // the child's index, from 0

	roleClaim    = "claim"
	roleMigrate  = "migrate"
	roleComplete = "complete"
)

// Lines of the protocol a child writes to its stdout, among the testing package's own.
const (
	lineReady    = "storetest-ready"
	lineAcquired = "storetest-acquired " // followed by "<key index> <token>"
	lineMigrated = "storetest-migrated"
	lineResumed  = "storetest-resumed " // followed by "<key index>"
)

// IsChild reports whether this process is a child started by [RunMultiProcess] or
// [RunMigrateConcurrently]. Tests rarely need it: the Run functions act as the child by
// themselves. A TestMain may use it to skip set-up that only the parent needs.
func IsChild() bool { return os.Getenv(envRole) != "" }

// RunMultiProcess proves that a claim is exclusive across processes (SPEC §5.1, §14).
// In the parent it creates and migrates a fresh database, then starts
// MultiProcess.Processes copies of the test binary, each running only the calling test,
// which calls RunMultiProcess again and acts as a child: it opens the store, waits at a
// barrier until every child is ready, then claims each of the MultiProcess.Keys keys
// from MultiProcess.ClaimsPerKey goroutines at once and reports the keys it acquired on
// stdout. The parent asserts that every key was acquired exactly once across all
// processes, and that the stored record holds the winner's token.
//
// Stores without Capabilities.MultiProcess are skipped with a log line.
func RunMultiProcess(t *testing.T, p MultiProcess) {
	t.Helper()
	p.setDefaults()
	switch os.Getenv(envRole) {
	case roleClaim:
		childForTest(t)
		claimChild(t, p)
		return
	case roleMigrate, roleComplete:
		t.Skip("storetest: child process of another multi-process run; nothing to claim")
	}
	if p.NewDSN == nil || p.Open == nil {
		t.Fatal("storetest: RunMultiProcess needs MultiProcess.NewDSN and MultiProcess.Open")
	}
	dsn := p.NewDSN(t)
	if p.Migrate != nil {
		if err := p.Migrate(dsn); err != nil {
			t.Fatalf("Migrate(%q): %v", dsn, err)
		}
	}
	s := p.Open(t, dsn)
	if !s.Capabilities().MultiProcess {
		t.Skip("store lacks Capabilities.MultiProcess: skipping multi-process claims")
	}

	scope, prefix := "mp-scope-"+rand.Text(), "mp-key-"+rand.Text()
	outs := runChildren(t, p, roleClaim,
		envDSN+"="+dsn, envScope+"="+scope, envKeys+"="+prefix,
		envNKeys+"="+strconv.Itoa(p.Keys), envClaims+"="+strconv.Itoa(p.ClaimsPerKey))

	winners := make([][]string, p.Keys) // tokens that acquired each key, any process
	for child, out := range outs {
		for _, line := range out.lines(lineAcquired) {
			var i int
			var token string
			if _, err := fmt.Sscanf(line, "%d %s", &i, &token); err != nil || i < 0 || i >= p.Keys {
				t.Fatalf("child %d: bad line %q", child, lineAcquired+line)
			}
			winners[i] = append(winners[i], fmt.Sprintf("%s (child %d)", token, child))
		}
	}
	for i, w := range winners {
		if len(w) != 1 {
			t.Errorf("key %d acquired %d times across %d processes, want exactly once: %v", i, len(w), p.Processes, w)
			continue
		}
		rec, err := s.RecordGet(t.Context(), &idemstore.GetParams{Scope: scope, Key: mpKey(prefix, i)})
		if err != nil {
			t.Errorf("key %d: RecordGet after the race: %v", i, err)
			continue
		}
		if token, _, _ := strings.Cut(w[0], " "); rec.Token != token || rec.State != idemstore.StateInFlight {
			t.Errorf("key %d: record %v held by %q, want in flight under the winner's %q", i, rec.State, rec.Token, token)
		}
	}
	if !t.Failed() {
		t.Logf("%d processes × %d keys × %d claims per key: every key acquired exactly once", p.Processes, p.Keys, p.ClaimsPerKey)
	}
}

// RunMigrateConcurrently proves that migrations are safe when several processes start
// at once (SPEC §10). In the parent it creates a fresh, unmigrated database, then starts
// MultiProcess.Processes copies of the test binary, each running only the calling test,
// which calls RunMigrateConcurrently again and acts as a child: it waits at a barrier
// until every child is ready, then runs MultiProcess.Migrate. The parent asserts that
// every child's migration succeeded, that migrating once more is a no-op that succeeds,
// runs MultiProcess.CheckSchema when set, and, when MultiProcess.Open is set, that the
// migrated store serves a claim, a completion and a replay.
func RunMigrateConcurrently(t *testing.T, p MultiProcess) {
	t.Helper()
	p.setDefaults()
	switch os.Getenv(envRole) {
	case roleMigrate:
		childForTest(t)
		migrateChild(t, p)
		return
	case roleClaim, roleComplete:
		t.Skip("storetest: child process of another multi-process run; nothing to migrate")
	}
	if p.NewDSN == nil || p.Migrate == nil {
		t.Fatal("storetest: RunMigrateConcurrently needs MultiProcess.NewDSN and MultiProcess.Migrate")
	}
	dsn := p.NewDSN(t)
	outs := runChildren(t, p, roleMigrate, envDSN+"="+dsn)
	for child, out := range outs {
		if len(out.lines(lineMigrated)) != 1 {
			t.Fatalf("child %d did not report its migration:\n%s", child, out.all)
		}
	}
	if err := p.Migrate(dsn); err != nil {
		t.Fatalf("Migrate again after %d concurrent migrations: %v", p.Processes, err)
	}
	if p.CheckSchema != nil {
		p.CheckSchema(t, dsn)
	}
	if p.Open != nil {
		roundTrip(t, p.Open(t, dsn))
	}
	t.Logf("%d processes migrated one fresh database at once: all succeeded", p.Processes)
}

// roundTrip claims, completes and replays one key in s.
func roundTrip(t *testing.T, s idemstore.Store) {
	t.Helper()
	b := &bundle{t: t, s: s, ctx: t.Context(), t0: time.Now().UTC().Truncate(time.Millisecond),
		scope: "scope-" + rand.Text(), key: "key-" + rand.Text(), fp: newFingerprint()}
	p := b.acquire(b.t0)
	b.complete(p.Token, sampleResponse(), b.at(ms(1)))
	res := b.claimWant(b.claimParams(b.at(ms(2))), idemstore.ClaimCompleted)
	if !res.Record.Response.Equal(sampleResponse()) {
		t.Fatalf("replay after migration: %s", describeResponse(res.Record.Response))
	}
}

// childForTest skips the child's test unless it is the one the parent started it for.
func childForTest(t *testing.T) {
	t.Helper()
	if want := os.Getenv(envTest); want != t.Name() {
		t.Skipf("storetest: child process for %s, not %s", want, t.Name())
	}
}

// waitAtBarrier announces that the child is ready and blocks until the parent releases
// every child at once by writing to (or closing) their stdin.
func waitAtBarrier(t *testing.T) {
	t.Helper()
	fmt.Println(lineReady)
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil && err != io.EOF {
		t.Fatalf("storetest child: reading the barrier: %v", err)
	}
}

func claimChild(t *testing.T, p MultiProcess) {
	dsn, scope, prefix := os.Getenv(envDSN), os.Getenv(envScope), os.Getenv(envKeys)
	nKeys, err1 := strconv.Atoi(os.Getenv(envNKeys))
	claims, err2 := strconv.Atoi(os.Getenv(envClaims))
	if err1 != nil || err2 != nil {
		t.Fatalf("storetest child: bad environment: %v, %v", err1, err2)
	}
	s := p.Open(t, dsn)
	fp := idemstore.Fingerprint{Version: idemstore.FingerprintVersion, Sum: [32]byte{'m', 'p'}}
	waitAtBarrier(t)

	var (
		mu       sync.Mutex
		acquired []string
		wg       sync.WaitGroup
		sem      = make(chan struct{}, 32) // bounds goroutines, keeps keys in step
	)
	for i := range nKeys {
		for range claims {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				token := "tok-" + rand.Text()
				res, err := s.RecordClaim(t.Context(), &idemstore.ClaimParams{
					Scope: scope, Key: mpKey(prefix, i), Fingerprint: fp, Token: token,
					RecordID: "rec-" + rand.Text(), Lease: time.Hour, TTL: time.Hour,
				})
				switch {
				case err != nil:
					t.Errorf("claim of key %d: %v", i, err)
				case res.Outcome == idemstore.ClaimAcquired:
					mu.Lock()
					acquired = append(acquired, fmt.Sprintf("%s%d %s", lineAcquired, i, token))
					mu.Unlock()
				case res.Outcome != idemstore.ClaimInFlight:
					t.Errorf("claim of key %d = %v, want acquired or in_flight", i, res.Outcome)
				}
			})
		}
	}
	wg.Wait()
	fmt.Println(strings.Join(acquired, "\n"))
}

func migrateChild(t *testing.T, p MultiProcess) {
	dsn := os.Getenv(envDSN)
	waitAtBarrier(t)
	if err := p.Migrate(dsn); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	fmt.Println(lineMigrated)
}

func mpKey(prefix string, i int) string { return fmt.Sprintf("%s-%d", prefix, i) }

// childOutput is what one child wrote to stdout and stderr.
type childOutput struct {
	all   string // stdout then stderr, for failure messages
	lines func(prefix string) []string
}

// runChildren starts p.Processes children of role, releases them together once all are
// ready, waits for them and returns their output. A child that fails fails the test
// with its output.
func runChildren(t *testing.T, p MultiProcess, role string, env ...string) []childOutput {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), p.Timeout)
	defer cancel()

	type child struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout bytes.Buffer
		stderr bytes.Buffer
		ready  chan struct{}
		done   chan struct{}
	}
	children := make([]*child, p.Processes)
	for i := range children {
		c := &child{ready: make(chan struct{}), done: make(chan struct{})}
		c.cmd = exec.CommandContext(ctx, os.Args[0], "-test.run="+runPattern(t.Name()), "-test.count=1")
		c.cmd.Env = append(os.Environ(), append([]string{envRole + "=" + role, envTest + "=" + t.Name(),
			envChild + "=" + strconv.Itoa(i)}, env...)...)
		c.cmd.Stderr = &c.stderr
		stdin, err := c.cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := c.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		c.stdin = stdin
		if err := c.cmd.Start(); err != nil {
			t.Fatalf("starting child %d: %v", i, err)
		}
		go func() {
			defer close(c.done)
			sc := bufio.NewScanner(stdout)
			sc.Buffer(nil, 1<<20)
			signalled := false
			for sc.Scan() {
				line := sc.Text()
				c.stdout.WriteString(line + "\n")
				if line == lineReady && !signalled {
					signalled = true
					close(c.ready)
				}
			}
		}()
		children[i] = c
	}

	// The barrier: release every child at the same instant, once all are ready.
	for i, c := range children {
		select {
		case <-c.ready:
		case <-c.done:
			_ = c.cmd.Wait()
			t.Fatalf("child %d exited before its barrier:\n%s%s", i, c.stdout.String(), c.stderr.String())
		case <-ctx.Done():
			t.Fatalf("child %d not ready within %v:\n%s%s", i, p.Timeout, c.stdout.String(), c.stderr.String())
		}
	}
	for _, c := range children {
		_ = c.stdin.Close()
	}

	outs := make([]childOutput, len(children))
	for i, c := range children {
		<-c.done
		err := c.cmd.Wait()
		all := c.stdout.String() + c.stderr.String()
		if err != nil {
			t.Fatalf("child %d (%s): %v\n%s", i, role, err, all)
		}
		stdout := c.stdout.String()
		outs[i] = childOutput{all: all, lines: func(prefix string) []string {
			var ls []string
			for line := range strings.Lines(stdout) {
				if rest, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), prefix); ok {
					ls = append(ls, rest)
				}
			}
			return ls
		}}
	}
	return outs
}

// runPattern is the -test.run pattern that selects exactly the test named name
// (t.Name(), subtests included).
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}
