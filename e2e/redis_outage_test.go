package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// redisServer is a private redis-server that a test may stop and start; the shared
// server is never touched. It persists nothing.
type redisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// newRedisServer starts a private redis-server on a free port, killed at cleanup. It
// skips (fails under CI=true) when redis-server is absent.
func newRedisServer(t testing.TB) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Unavailable(t, "no redis-server on PATH to run a private Redis")
		return nil
	}
	r := &redisServer{t: t, bin: bin, dir: t.TempDir(), port: freePort(t)}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *redisServer) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

// start runs redis-server and waits until it accepts connections.
func (r *redisServer) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("starting redis-server: %v", err)
	}
	done := make(chan struct{})
	r.done = done
	go func() { r.cmd.Wait(); close(done) }()
	waitFor(r.t, 10*time.Second, "the private redis-server to accept connections", func() (bool, string) {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", r.port), time.Second)
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	})
}

// stop kills redis-server and waits until it is gone.
func (r *redisServer) stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// TestRedisOutageFailsClosedAndRecoversWithoutRestart is the outage test for a Redis
// store (the charges stay in PostgreSQL): 503 store_unavailable with Retry-After and
// /healthz 503 while Redis is down, and service again once it is back.
func TestRedisOutageFailsClosedAndRecoversWithoutRestart(t *testing.T) {
	t.Parallel()
	rs := newRedisServer(t)
	s := startServer(t, "--store", rs.URL(), "--db", postgresStore(t))
	c := newClient()
	want201(t, "POST before the outage", c.postCharge(t, s.URL(), newKey(), chargeJSON(2000)))

	rs.stop()
	key := newKey()
	for i := range 3 {
		start := time.Now()
		res := c.postCharge(t, s.URL(), key, chargeJSON(3000))
		t.Logf("POST #%d during the outage answered %d in %v", i+1, res.Status, time.Since(start).Round(time.Millisecond))
		wantError(t, fmt.Sprintf("POST #%d during the outage", i+1), res, http.StatusServiceUnavailable, "store_unavailable")
		if res.Header.Get("Retry-After") == "" {
			t.Fatalf("503 without Retry-After: %s", res)
		}
	}
	if res := c.do(t, s.URL(), request{method: "GET", path: "/healthz"}); res.Status != http.StatusServiceUnavailable {
		t.Fatalf("/healthz during the outage: want 503, got %s", res)
	}
	if s.exited() {
		t.Fatalf("the server exited during the outage: %v", s.exitError())
	}

	rs.start()
	waitFor(t, 30*time.Second, "a POST to succeed after Redis is back", func() (bool, string) {
		res, err := c.send(context.Background(), s.URL(), request{method: "POST", path: "/v1/charges", key: key, contentType: contentJSON, body: chargeJSON(3000)})
		if err != nil {
			return false, err.Error()
		}
		return res.Status == http.StatusCreated, res.String()
	})
	if res := c.do(t, s.URL(), request{method: "GET", path: "/healthz"}); res.Status != http.StatusOK {
		t.Fatalf("/healthz after recovery: want 200, got %s", res)
	}
	if n := len(c.listCharges(t, s.URL())); n != 2 {
		t.Fatalf("after the outage the principal has %d charges, want 2", n)
	}
}
