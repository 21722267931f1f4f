package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// startTimeout bounds how long a server may take to log its listening line
	// (it migrates its schema first).
	startTimeout = 30 * time.Second
	// stopTimeout bounds how long a server may take to exit after a signal.
	stopTimeout = 20 * time.Second
	// commandTimeout bounds a short-lived subcommand (migrate, purge, a refused start).
	commandTimeout = 30 * time.Second
	// slowCommand is how long a stop or a subcommand may take before the test logs it.
	slowCommand = 2 * time.Second
)

// listeningRe finds the address in the server's start line, in slog text form:
// level=INFO msg="idem payments listening" addr=127.0.0.1:41234 store=... (or
// "idem processor listening", "idem proxy listening").
// The first addr= after the message is the listening address: a Redis Cluster store URL
// logged later on the line has addr= parameters of its own.
var listeningRe = regexp.MustCompile(`msg="?idem (?:payments|processor|proxy) listening"?.*?\baddr="?([^"\s]+)"?`)

// logBuffer is the combined stdout and stderr of a process, safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// server is one running `idem payments` (or `idem processor`, `idem proxy`) process. It can be killed
// and restarted on the same address with the same arguments; its output (of every
// incarnation) is logged when the test fails.
type server struct {
	t       testing.TB
	name    string
	command string   // payments, processor or proxy
	args    []string // without --addr
	addr    string   // host:port once listening
	dir     string   // the working directory; "" for the test's
	bin     string   // the idem binary; "" for this build's (buildIdem)
	env     []string // more environment variables ("NAME=value")

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current incarnation exited
	exitErr error
	runs    int
	logs    []*logBuffer
}

// startServer starts `idem payments --addr 127.0.0.1:0 args...`, waits for its listening
// line and returns it. The process is killed at cleanup if still running, and its output
// is logged if the test failed.
func startServer(t testing.TB, args ...string) *server {
	t.Helper()
	s := newServer(t, args...)
	s.start("127.0.0.1:0")
	return s
}

// startProcessor starts `idem processor --addr 127.0.0.1:0 args...` like startServer.
func startProcessor(t testing.TB, args ...string) *server {
	t.Helper()
	s := newCommand(t, "processor", args...)
	s.start("127.0.0.1:0")
	return s
}

// newServer prepares an `idem payments` server with args (not yet started) and its
// cleanup.
func newServer(t testing.TB, args ...string) *server { return newCommand(t, "payments", args...) }

// newCommand prepares a server running `idem command args...`.
func newCommand(t testing.TB, command string, args ...string) *server {
	s := &server{t: t, name: fmt.Sprintf("idem %s %s", command, strings.Join(args, " ")), command: command, args: args}
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			s.mu.Lock()
			logs := s.logs
			s.mu.Unlock()
			for i, l := range logs {
				t.Logf("output of %s (run %d):\n%s", s.name, i+1, l.String())
			}
		}
	})
	return s
}

// start runs one incarnation listening on addr and waits for its listening line,
// failing the test when it does not come.
func (s *server) start(addr string) {
	s.t.Helper()
	if err := s.launch(addr); err != nil {
		s.t.Fatal(err)
	}
}

// launch runs one incarnation listening on addr and waits for its listening line. It
// may run on any goroutine.
func (s *server) launch(addr string) error {
	bin := s.bin
	if bin == "" {
		var err error
		if bin, err = buildIdem(); err != nil {
			return err
		}
	}
	cmd := exec.Command(bin, append([]string{s.command, "--addr", addr}, s.args...)...)
	cmd.Dir = s.dir
	if len(s.env) > 0 {
		cmd.Env = append(os.Environ(), s.env...)
	}
	logs := &logBuffer{}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %v", s.name, err)
	}
	done := make(chan struct{})
	listening := make(chan string, 1)
	go func() {
		// Copy stderr line by line, reporting the listening address once.
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			logs.Write([]byte(line + "\n"))
			if m := listeningRe.FindStringSubmatch(line); m != nil {
				select {
				case listening <- m[1]:
				default:
				}
			}
		}
		io.Copy(logs, stderr)
		err := cmd.Wait()
		s.mu.Lock()
		s.exitErr = err
		s.mu.Unlock()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done, s.exitErr = cmd, done, nil
	s.runs++
	s.logs = append(s.logs, logs)
	s.mu.Unlock()

	select {
	case a := <-listening:
		s.mu.Lock()
		s.addr = a
		s.mu.Unlock()
		return nil
	case <-done:
		return fmt.Errorf("%s exited before listening (%v); output:\n%s", s.name, s.exitError(), logs.String())
	case <-time.After(startTimeout):
		s.kill()
		return fmt.Errorf("%s did not log its listening line within %v; output:\n%s", s.name, startTimeout, logs.String())
	}
}

// URL returns the base URL of the server.
func (s *server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "http://" + s.addr
}

func (s *server) exitError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitErr
}

// signal sends sig to the current incarnation.
func (s *server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// wait waits up to d for the current incarnation to exit and returns its exit error
// (nil for exit 0), or an error saying it is still running.
func (s *server) wait(d time.Duration) error {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return s.exitError()
	case <-time.After(d):
		return fmt.Errorf("%s still running %v after the signal", s.name, d)
	}
}

// output returns what the current incarnation has logged so far.
func (s *server) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.logs[len(s.logs)-1].String()
}

// pid returns the process id of the current incarnation.
func (s *server) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd.Process.Pid
}

// exited reports whether the current incarnation has exited.
func (s *server) exited() bool {
	s.mu.Lock()
	done := s.done
	s.mu.Unlock()
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// stop sends sig and fails the test unless the process exits 0 within stopTimeout.
func (s *server) stop(sig syscall.Signal) {
	s.t.Helper()
	start := time.Now()
	s.signal(sig)
	if err := s.wait(stopTimeout); err != nil {
		s.t.Fatalf("%s after %v: want exit 0, got %v", s.name, sig, err)
	}
	if d := time.Since(start); d > slowCommand {
		s.t.Logf("slow: %s took %v to exit after %v", s.name, d, sig)
	}
}

// kill SIGKILLs the current incarnation and waits for it to be gone.
func (s *server) kill() {
	s.signal(syscall.SIGKILL)
	_ = s.wait(stopTimeout)
}

// restart starts a new incarnation on the same address (after the old one exited).
func (s *server) restart() {
	s.t.Helper()
	if err := s.relaunch(); err != nil {
		s.t.Fatal(err)
	}
}

// relaunch starts a new incarnation on the same address; it may run on any goroutine.
func (s *server) relaunch() error {
	if !s.exited() {
		return fmt.Errorf("%s: restart while still running", s.name)
	}
	s.mu.Lock()
	addr := s.addr
	s.mu.Unlock()
	return s.launch(addr)
}

// runResult is the outcome of a short-lived subcommand.
type runResult struct {
	exitCode int
	stdout   string
	stderr   string
}

// runIdem runs `idem args...` to completion within commandTimeout.
func runIdem(t testing.TB, args ...string) runResult {
	t.Helper()
	// The binary first: its one build (minutes on a cold cache) must not count
	// against the command's own bound.
	bin := idemBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if d := time.Since(start); d > slowCommand {
		t.Logf("slow: idem %s took %v", strings.Join(args, " "), d)
	}
	res := runResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		res.exitCode = ee.ExitCode()
	case ctx.Err() != nil:
		t.Fatalf("idem %s did not finish within %v; stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), commandTimeout, res.stdout, res.stderr)
	default:
		t.Fatalf("idem %s: %v; stderr:\n%s", strings.Join(args, " "), err, res.stderr)
	}
	return res
}

// mustRunIdem runs `idem args...` and fails the test unless it exits 0.
func mustRunIdem(t testing.TB, args ...string) runResult {
	t.Helper()
	res := runIdem(t, args...)
	if res.exitCode != 0 {
		t.Fatalf("idem %s: exit %d; stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), res.exitCode, res.stdout, res.stderr)
	}
	return res
}

// wantRunningThroughOutage fails the test if the current incarnation of s has exited.
func wantRunningThroughOutage(t testing.TB, s *server) {
	t.Helper()
	if s.exited() {
		t.Fatalf("the server exited during the outage: %v", s.exitError())
	}
}
