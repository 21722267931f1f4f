package sqlite_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/sqlite"
	"github.com/idem-go/idem/store/storetest"
)

// The tests in this file re-execute the test binary: each child runs the same test
// function, which sees childRoleEnv and plays its part, talking to the parent over
// stdin (the start signal) and stdout (lines prefixed childPrefix).
const (
	childRoleEnv = "IDEM_SQLITE_TEST_CHILD"
	childPathEnv = "IDEM_SQLITE_TEST_PATH"
	childPrefix  = "CHILD "
)

// child is one re-executed test process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startChildren starts n children running the test named name in role, with the
// database path, and waits until every one of them reports ready.
func startChildren(t *testing.T, name, role, path string, n int) []*child {
	t.Helper()
	cs := make([]*child, n)
	for i := range cs {
		cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v=false")
		cmd.Env = append(os.Environ(), childRoleEnv+"="+role, childPathEnv+"="+path)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		c := &child{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
		c.out.Buffer(nil, 1<<20)
		if line, ok := c.next(); !ok || line != "ready" {
			t.Fatalf("child %d: first line %q, want ready", i, line)
		}
		cs[i] = c
	}
	return cs
}

// next returns the child's next protocol line.
func (c *child) next() (string, bool) {
	for c.out.Scan() {
		if line, ok := strings.CutPrefix(c.out.Text(), childPrefix); ok {
			return line, true
		}
	}
	return "", false
}

// release starts every child at once and returns each one's protocol lines after
// ready, once it exited successfully.
func release(t *testing.T, cs []*child) [][]string {
	t.Helper()
	for _, c := range cs {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	lines := make([][]string, len(cs))
	for i, c := range cs {
		for line, ok := c.next(); ok; line, ok = c.next() {
			lines[i] = append(lines[i], line)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v (lines %q)", i, err, lines[i])
		}
	}
	return lines
}

// childMain is the start of a child's part: it reports ready and waits for the start
// signal.
func childMain() {
	fmt.Println(childPrefix + "ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}

func childSay(format string, args ...any) { fmt.Printf(childPrefix+format+"\n", args...) }

// Hammering: children × goroutines each claim every key of hammerKeys in a random
// order, completing the ones they acquire with their token as the body.
const (
	hammerChildren   = 8
	hammerGoroutines = 8
	hammerKeys       = 40
)

func TestProcessesHammeringOneFileGetExactlyOneWinnerPerKeyAndNoBusyErrors(t *testing.T) {
	if os.Getenv(childRoleEnv) == "hammer" {
		hammerChild(t, os.Getenv(childPathEnv))
		return
	}
	t.Parallel()
	s, path := openStore(t, sqlite.Config{})
	cs := startChildren(t, t.Name(), "hammer", path, hammerChildren)
	winners := map[string]string{} // key → winning token
	var retries int
	for i, lines := range release(t, cs) {
		for _, line := range lines {
			f := strings.Fields(line)
			switch {
			case len(f) == 3 && f[0] == "acquired":
				if w, dup := winners[f[1]]; dup {
					t.Errorf("key %s acquired by %s and %s", f[1], w, f[2])
				}
				winners[f[1]] = f[2]
			case len(f) == 2 && f[0] == "retries":
				var n int
				fmt.Sscan(f[1], &n)
				retries += n
			default:
				t.Errorf("child %d: %s", i, line)
			}
		}
	}
	if len(winners) != hammerKeys {
		t.Fatalf("%d keys acquired, want every one of %d", len(winners), hammerKeys)
	}
	for key, token := range winners {
		rec, err := s.RecordGet(context.Background(), &idemstore.GetParams{Scope: "hammer", Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idemstore.StateCompleted || string(rec.Response.Body) != token {
			t.Errorf("key %s: %s record with body %q, want completed by %s", key, rec.State, rec.Response.Body, token)
		}
	}
	t.Logf("%d processes × %d goroutines × %d keys: %d busy retries, no errors",
		hammerChildren, hammerGoroutines, hammerKeys, retries)
}

// hammerChild is one hammering process. A 1 ms busy timeout makes SQLite give up
// waiting almost at once, so the store's own retry loop does the waiting.
func hammerChild(t *testing.T, path string) {
	var retries atomic.Int64
	logger := slog.New(countingHandler{&retries})
	s, err := sqlite.Open(context.Background(), path, sqlite.Config{BusyTimeout: time.Millisecond, Logger: logger})
	if err != nil {
		childSay("error open: %v", err)
		return
	}
	defer s.Close()
	childMain()
	pid := os.Getpid()
	var wg sync.WaitGroup
	for g := range hammerGoroutines {
		wg.Go(func() {
			for _, k := range rand.Perm(hammerKeys) {
				key, token := fmt.Sprintf("key-%02d", k), fmt.Sprintf("tok-%d-%d-%d", pid, g, k)
				if err := hammerOne(s, key, token); err != nil {
					childSay("error %s: %v", key, err)
				}
			}
		})
	}
	wg.Wait()
	childSay("retries %d", retries.Load())
}

func hammerOne(s *sqlite.Store, key, token string) error {
	ctx := context.Background()
	p := claimParams("hammer", key, token, time.Time{})
	// No lease may lapse however long a loaded machine stalls a holder between its
	// claim and its completion: this test is about exclusive claims, not takeovers.
	p.Lease = time.Hour
	res, err := s.RecordClaim(ctx, p)
	if err != nil || res.Outcome != idemstore.ClaimAcquired {
		return err
	}
	childSay("acquired %s %s", key, token)
	return s.RecordComplete(ctx, &idemstore.CompleteParams{
		Scope: "hammer", Key: key, Token: token, TTL: time.Hour,
		Response: &idemstore.Response{Status: 201, Body: []byte(token)},
	})
}

// countingHandler counts the store's "retrying" log records.
type countingHandler struct{ n *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "retrying") {
		h.n.Add(1)
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// multiProcess describes the store to the suite's multi-process runs: a fresh file in
// the parent's temporary directory, which every child opens.
func multiProcess() storetest.MultiProcess {
	return storetest.MultiProcess{
		NewDSN: func(t testing.TB) string { return filepath.Join(t.TempDir(), "idem.db") },
		Open: func(t testing.TB, dsn string) idemstore.Store {
			s, err := sqlite.Open(context.Background(), dsn, sqlite.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Migrate: func(dsn string) error {
			s, err := sqlite.Open(context.Background(), dsn, sqlite.Config{})
			if err != nil {
				return err
			}
			defer s.Close()
			return s.Migrate(context.Background())
		},
		CheckSchema: func(t testing.TB, dsn string) {
			s, err := sqlite.Open(context.Background(), dsn, sqlite.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var n, distinct int
			err = s.DB().QueryRow(`SELECT count(*), count(DISTINCT version) FROM idem_migrations`).Scan(&n, &distinct)
			if want := sqlite.MigrationCount(t); err != nil || n != want || distinct != want {
				t.Fatalf("idem_migrations holds %d rows, %d versions (%v), want each of the %d migrations once", n, distinct, err, want)
			}
		},
		Processes: 6,
	}
}

func TestClaimIsExclusiveAcrossProcesses(t *testing.T) {
	p := multiProcess()
	p.Processes = storetest.DefaultProcesses
	storetest.RunMultiProcess(t, p)
}

func TestProcessesMigratingOneFreshFileAtOnceAllSucceed(t *testing.T) {
	storetest.RunMigrateConcurrently(t, multiProcess())
}

func TestCompletersInManyProcessesResumeEachRecordOnce(t *testing.T) {
	storetest.RunCompleterMultiProcess(t, multiProcess())
}
