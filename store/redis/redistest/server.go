// Package redistest starts private redis-server processes for tests: a single server
// that a test may stop, kill and restart on the same port ([StartServer]), a Redis
// Cluster of three masters with one replica each ([StartCluster]), and a master with
// one replica watched by three Sentinels ([StartSentinel]). Servers listen on free
// loopback ports, keep nothing on disk (save "", appendonly no) and are killed at the
// test's cleanup.
//
// Where redis-server or redis-cli is absent, the helpers skip the test with a message,
// or fail it under CI=true ([testenv.Unavailable]).
package redistest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/testenv"
)

// readyTimeout bounds how long a server may take to accept connections.
const readyTimeout = 10 * time.Second

// Server is one private redis-server process.
type Server struct {
	t    testing.TB
	port int
	dir  string
	args []string
	// sentinel, when set, is the configuration file of a Sentinel: the server runs
	// `redis-server <file> --sentinel` instead of as a data server.
	sentinel string
	// password is the requirepass of args, if any.
	password string
	// tls, when set, makes the server listen over TLS only.
	tls *TLS

	mu   sync.Mutex
	cmd  *exec.Cmd
	pipe *io.PipeWriter
	out  *logTail
}

// StartServer starts a redis-server on a free loopback port with persistence off, plus
// args (such as "--rename-command", "CONFIG", ""), and waits until it accepts
// connections. It is killed at t's cleanup.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	RequireBinaries(t)
	return startServer(t, &Server{t: t, dir: t.TempDir(), args: args})
}

// startServer starts s, which has its test, directory and arguments set, on a free
// port.
func startServer(t testing.TB, s *Server) *Server {
	t.Helper()
	for i, a := range s.args {
		if a == "--requirepass" && i+1 < len(s.args) {
			s.password = s.args[i+1]
		}
	}
	t.Cleanup(s.Kill)
	var err error
	// Another process may take the free port before redis-server binds it: try again
	// on a new one.
	for range 3 {
		s.port = FreePort(t)
		if err = s.start(); err == nil {
			return s
		}
	}
	t.Fatal(err)
	return nil
}

// RequireBinaries skips t (fails it under CI=true) unless redis-server and redis-cli
// are on PATH.
func RequireBinaries(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Unavailable(t, "%s is not on PATH, so the test cannot start a private Redis", bin)
		}
	}
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Client returns a new client of the server (with its requirepass), which the caller
// closes. It does not retry, and dials for at most a second.
func (s *Server) Client() *goredis.Client {
	o := &goredis.Options{Addr: s.Addr(), Password: s.password, MaxRetries: -1, DialTimeout: time.Second}
	if s.tls != nil {
		o.TLSConfig = s.tls.ClientConfig()
	}
	return goredis.NewClient(o)
}

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// URL returns the server's redis:// URL (rediss:// over TLS, which needs
// skip_verify=true or a client that trusts the test's authority).
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr() + "/0"
	}
	return "redis://" + s.Addr() + "/0"
}

// Kill stops the server with SIGKILL, as a crash would, and waits for it to exit. It
// does nothing when the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	_ = s.pipe.Close()
	s.cmd, s.pipe = nil, nil
}

// Restart starts the server again on the same port (and directory) after Kill, and
// waits until it accepts connections.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("redistest: server on %s is already running", s.Addr())
	}
	args := []string{
		"--port", strconv.Itoa(s.port),
	}
	if s.tls != nil {
		args = append([]string{"--port", "0", "--tls-port", strconv.Itoa(s.port)}, s.tls.args()...)
	}
	args = append(args,
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "",
	)
	// redis-server logs this line once it listens: a signal, not a guess. A Sentinel
	// logs its master's name once it monitors it, after it listens.
	ready := "Ready to accept connections"
	if s.sentinel != "" {
		args = append([]string{s.sentinel, "--sentinel"}, args...)
		ready = "+monitor master"
	} else {
		args = append(args, "--save", "", "--appendonly", "no")
	}
	cmd := exec.Command("redis-server", append(args, s.args...)...)
	cmd.SysProcAttr = procAttr()
	// An io.Pipe rather than StdoutPipe: Wait then waits for the copy to finish.
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: starting redis-server: %w", err)
	}
	s.cmd, s.pipe = cmd, pw
	s.out = newLogTail(pr)
	if err := s.out.wait(ready, readyTimeout); err != nil {
		s.stopLocked()
		return fmt.Errorf("redistest: redis-server on port %d: %w; its log:\n%s", s.port, err, s.out.String())
	}
	return nil
}

// waitLog waits until the running server has logged a line containing substr, since
// it started (or in the next timeout).
func (s *Server) waitLog(substr string, timeout time.Duration) error {
	s.mu.Lock()
	out := s.out
	s.mu.Unlock()
	return out.wait(substr, timeout)
}

// FreePort returns a loopback port that is free, and whose cluster bus port
// (port + 10000) is free too.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: finding a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port
	}
	t.Fatal("redistest: no free port pair found")
	return 0
}

// logTail keeps a process's output and lets a caller wait for a line.
type logTail struct {
	mu    sync.Mutex
	buf   strings.Builder
	lines chan string
}

func newLogTail(r io.Reader) *logTail {
	l := &logTail{lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			l.mu.Lock()
			l.buf.WriteString(line + "\n")
			l.mu.Unlock()
			select {
			case l.lines <- line:
			default: // nobody waits; the buffer keeps the line
			}
		}
		close(l.lines)
	}()
	return l
}

func (l *logTail) wait(substr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// A line logged before anyone waited is in the buffer, and may have been dropped
	// from the channel.
	if strings.Contains(l.String(), substr) {
		return nil
	}
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				return fmt.Errorf("exited before logging %q", substr)
			}
			if strings.Contains(line, substr) {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("did not log %q within %v", substr, timeout)
		}
	}
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
