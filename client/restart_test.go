package client

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/sqlite"
)

// The restart tests run an idem server in a child process, this test binary run again
// with restartChildEnv set to "ADDR PATH": it serves POST /v1/things on ADDR, its
// records and things in the SQLite file PATH, until it is killed.
const restartChildEnv = "IDEM_CLIENT_TEST_SERVER"

// restartLease is the child's lease: a request in flight when the child is killed
// holds its key that long after the restart, and its retries wait (409
// request_in_progress) until it lapses.
const restartLease = 2 * time.Second

// slowHeader makes the child's handler take that long (a duration) before it answers.
const slowHeader = "X-Slow"

func TestMain(m *testing.M) {
	if v := os.Getenv(restartChildEnv); v != "" {
		addr, path, _ := strings.Cut(v, " ")
		if err := serveThings(addr, path); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// serveThings is the child: an idem server whose handler inserts one row per
// execution into things and answers 201 with it, after a pause that keeps requests in
// flight when the child is killed.
func serveThings(addr, path string) error {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, path, sqlite.Config{})
	if err != nil {
		return err
	}
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS things (key TEXT NOT NULL, pid INTEGER NOT NULL)`); err != nil {
		return err
	}
	mw := idem.New(idem.Config{Store: st, Lease: restartLease, Logger: slog.New(slog.DiscardHandler),
		Scope: func(*http.Request) (string, error) { return "tenant", nil }})
	pid := os.Getpid()
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pause := 20 * time.Millisecond
		if d, err := time.ParseDuration(r.Header.Get(slowHeader)); err == nil {
			pause = d
			fmt.Println("slow") // the parent may kill it now
		}
		time.Sleep(pause) // the work: the child may be killed meanwhile
		key := r.Header.Get(HeaderKey)
		err := st.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO things (key, pid) VALUES (?, ?)`, key, pid); err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, map[string]any{"key": key, "pid": pid})
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening") // the parent waits for this line
	return http.Serve(ln, h)
}

// thingsServer is the child process, started and killed by the test.
type thingsServer struct {
	t          *testing.T
	addr, path string
	cmd        *exec.Cmd
	// slow receives a value when a slow request reaches the handler.
	slow chan struct{}
}

func newThingsServer(t *testing.T) *thingsServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // the child listens there, at every start
	s := &thingsServer{t: t, addr: addr, path: filepath.Join(t.TempDir(), "things.db"), slow: make(chan struct{}, 16)}
	t.Cleanup(s.kill)
	return s
}

func (s *thingsServer) url() string { return "http://" + s.addr + "/v1/things" }

// start starts the child and returns once it listens.
func (s *thingsServer) start() {
	s.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), restartChildEnv+"="+s.addr+" "+s.path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd = cmd
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "listening" {
		s.t.Fatalf("the server did not start: %q, %v", lines.Text(), lines.Err())
	}
	go func() {
		for lines.Scan() {
			if lines.Text() == "slow" {
				s.slow <- struct{}{}
			}
		}
	}()
}

// kill SIGKILLs the child, if it runs, and waits for it to exit.
func (s *thingsServer) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// executions returns how many times each key's handler committed its row.
func (s *thingsServer) executions() map[string]int {
	s.t.Helper()
	db, err := sql.Open("sqlite", "file:"+s.path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		s.t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT key, count(*) FROM things GROUP BY key`)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	n := map[string]int{}
	for rows.Next() {
		var key string
		var c int
		if err := rows.Scan(&key, &c); err != nil {
			s.t.Fatal(err)
		}
		n[key] = c
	}
	if err := rows.Err(); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// post sends one POST /v1/things through c and returns the key the Transport sent
// and the status, or the error.
func postThing(c *http.Client, url string, header http.Header) (key string, status int, err error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount": 100}`))
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Request.Header.Get(HeaderKey), resp.StatusCode, nil
}

// The default client rides out server restarts: 32 workers post without pause while
// the server (a real process, an idem server on SQLite) is SIGKILLed twice and stays
// down 3 s each time. Every request completes with 201, with the Transport's default
// limits (MaxAttempts, Budget, MaxWait, Backoff): the requests in flight at a kill
// retry once for free (a request still waiting out the first restart's backoff, up to
// 5 s, may be in flight at the second kill too, and retries free again), the refused
// connections while the server is down and the 409 request_in_progress until the dead
// holder's lease lapses are waits, not failures.
// Every key executed exactly once, and the client logged no warning (the budget never
// refused a retry).
func TestDefaultClientRidesOutServerRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: kills and restarts a server for about 12 s")
	}
	t.Parallel()
	srv := newThingsServer(t)
	srv.start()
	var warnings testkit.Buffer
	c := NewClient(&Transport{Logger: slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))})

	const workers = 32
	var (
		stop              atomic.Bool
		wg                sync.WaitGroup
		mu                sync.Mutex
		keys              = map[string]bool{}
		failures, answers atomic.Int64
		firstFailure      atomic.Value
	)
	for range workers {
		wg.Go(func() {
			for !stop.Load() {
				key, status, err := postThing(c, srv.url(), nil)
				switch {
				case err != nil:
					failures.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
				case status != http.StatusCreated:
					failures.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("answered %d, want 201", status))
				default:
					answers.Add(1)
					mu.Lock()
					keys[key] = true
					mu.Unlock()
				}
			}
		})
	}
	// Between kills, wait for answers rather than for time: the server is serving.
	served := func(n int64) {
		for deadline := time.Now().Add(30 * time.Second); answers.Load() < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d answers, want %d: the server is not serving", answers.Load(), n)
			}
		}
	}
	served(100)
	for kill := 1; kill <= 2; kill++ {
		before := answers.Load()
		srv.kill()
		t.Logf("kill %d after %d answers", kill, before)
		time.Sleep(3 * time.Second) // the restart's downtime
		srv.start()
		served(before + 100)
	}
	stop.Store(true)
	wg.Wait()
	srv.kill()

	execs := srv.executions()
	for key := range keys {
		if execs[key] != 1 {
			t.Errorf("key %s executed %d times, want once", key, execs[key])
		}
	}
	if len(execs) != len(keys) {
		t.Errorf("%d keys executed, %d answered 201: an execution nobody got the answer of", len(execs), len(keys))
	}
	if failures.Load() != 0 || warnings.String() != "" {
		t.Fatalf("%d requests failed with the default client, the first: %v; the client's warnings:\n%s",
			failures.Load(), firstFailure.Load(), warnings.String())
	}
	t.Logf("%d requests, all 201, each key executed once, through 2 kills", len(keys))
}

// Against a server that is killed and stays down, the default client gives up within
// its documented bound, Transport.MaxWait (60 s) plus one connection attempt (refused
// at once here), counted from the request's first attempt, and the error names
// Transport.MaxWait: both a request in flight at the kill and one sent after it.
func TestDefaultClientGivesUpOnADeadServerWithinMaxWait(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: waits out the default MaxWait (60 s)")
	}
	t.Parallel()
	srv := newThingsServer(t)
	srv.start()
	c := NewClient(&Transport{Logger: slog.New(slog.DiscardHandler)})
	if _, status, err := postThing(c, srv.url(), nil); err != nil || status != http.StatusCreated {
		t.Fatalf("the server before the kill: %d, %v", status, err)
	}
	// The slack covers a loaded machine; a client without the bound would go on for
	// ever (no attempt counts), one that gave up at once would fail the lower bound.
	const slack = 5 * time.Second
	type result struct {
		took time.Duration
		err  error
	}
	results := make(chan result, 2)
	inFlight := make(chan struct{})
	for _, slow := range []bool{true, false} {
		go func() {
			header := http.Header{}
			if slow {
				header.Set(slowHeader, "1m")
				close(inFlight)
			} else {
				<-inFlight
			}
			start := time.Now()
			_, status, err := postThing(c, srv.url(), header)
			if err == nil {
				err = fmt.Errorf("answered %d", status)
			}
			results <- result{time.Since(start), err}
		}()
	}
	<-srv.slow // the slow request reached the handler
	srv.kill()
	for range 2 {
		r := <-results
		var re *RetryError
		if !errors.As(r.err, &re) || re.Limit != LimitMaxWait || !strings.Contains(r.err.Error(), "Transport.MaxWait (1m0s)") {
			t.Errorf("error %v, want a RetryError naming Transport.MaxWait", r.err)
		}
		if r.took < DefaultMaxWait-slack || r.took > DefaultMaxWait+slack {
			t.Errorf("gave up after %v, want within %v of MaxWait (%v)", r.took, slack, DefaultMaxWait)
		}
		t.Logf("after %v: %v", r.took.Round(time.Millisecond), r.err)
	}
}
