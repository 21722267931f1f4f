package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// pgCluster is a private PostgreSQL cluster that a test may stop and start; the shared
// server is never touched.
type pgCluster struct {
	t    testing.TB
	bin  string // directory of initdb and pg_ctl
	dir  string // owns data/, the socket and the log
	port int
	uid  *user.User // the OS user to run as when we are root
}

// newPGCluster initialises and starts a private cluster on a free port, stopped and
// removed at cleanup. It skips (fails under CI=true) when initdb is absent.
func newPGCluster(t testing.TB) *pgCluster {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		testenv.Unavailable(t, "no initdb under /usr/lib/postgresql/*/bin to run a private PostgreSQL cluster")
		return nil
	}
	c := &pgCluster{t: t, bin: filepath.Dir(bins[len(bins)-1])}
	dir, err := os.MkdirTemp("", "idem-e2e-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: run it as the postgres OS user, which
		// must own the directory.
		u, err := user.Lookup("postgres")
		if err != nil {
			testenv.Unavailable(t, "running as root without a postgres OS user for a private cluster: %v", err)
			return nil
		}
		c.uid = u
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c.port = freePort(t)
	c.run("initdb", "-D", c.data(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	c.start()
	t.Cleanup(func() { c.pgctl("stop", "-m", "immediate") })
	return c
}

func (c *pgCluster) data() string { return filepath.Join(c.dir, "data") }

// URL returns the URL of the cluster's postgres database.
func (c *pgCluster) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

// start starts the cluster on its port and waits until it accepts connections.
func (c *pgCluster) start() {
	c.t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir)
	if out, err := c.pgctl("start", "-w", "-t", "60", "-l", filepath.Join(c.dir, "log"), "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		c.t.Fatalf("pg_ctl start: %v\n%s\nlog:\n%s", err, out, log)
	}
}

// stop stops the cluster (fast shutdown: connections are cut).
func (c *pgCluster) stop() {
	c.t.Helper()
	if out, err := c.pgctl("stop", "-w", "-t", "60", "-m", "fast"); err != nil {
		c.t.Fatalf("pg_ctl stop: %v\n%s", err, out)
	}
}

func (c *pgCluster) pgctl(args ...string) (string, error) {
	return c.command("pg_ctl", append([]string{"-D", c.data()}, args...)...)
}

func (c *pgCluster) run(name string, args ...string) {
	c.t.Helper()
	if out, err := c.command(name, args...); err != nil {
		c.t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

// command runs a PostgreSQL program, as the postgres OS user when we are root.
func (c *pgCluster) command(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	path := filepath.Join(c.bin, name)
	var cmd *exec.Cmd
	if c.uid != nil {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.uid.Username, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int { return testenv.FreePort(t) }

// TestPostgresOutageFailsClosedAndRecoversWithoutRestart stops the server's PostgreSQL
// under it: requests get 503 store_unavailable with Retry-After and /healthz 503, the
// process keeps running, and when PostgreSQL is back it serves again by itself.
func TestPostgresOutageFailsClosedAndRecoversWithoutRestart(t *testing.T) {
	t.Parallel()
	pg := newPGCluster(t)
	s := startServer(t, "--store", pg.URL())
	c := newClient()
	done := newKey()
	first := c.postCharge(t, s.URL(), done, chargeJSON(2000))
	want201(t, "POST before the outage", first)

	pg.stop()
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
	if res := c.postCharge(t, s.URL(), done, chargeJSON(2000)); res.Status != http.StatusServiceUnavailable {
		t.Fatalf("replay during the outage: want 503 (fail closed), got %s", res)
	}
	wantHealthz(t, c, s.URL(), http.StatusServiceUnavailable, "during the outage")
	wantRunningThroughOutage(t, s)

	pg.start()
	created := pollCreated(t, c, s.URL(), key, chargeJSON(3000), 30*time.Second, "a POST to succeed after PostgreSQL is back")
	if created.replayed() {
		t.Fatalf("the first success after the outage is a replay: nothing should have been stored during it: %s", created)
	}
	wantReplayOf(t, "replay of the key completed before the outage", first, c.postCharge(t, s.URL(), done, chargeJSON(2000)), done)
	wantHealthz(t, c, s.URL(), http.StatusOK, "after recovery")
	if n := len(c.listCharges(t, s.URL())); n != 2 {
		t.Fatalf("after the outage the principal has %d charges, want 2", n)
	}
}

// TestPostgresOutageMidRequestAnswers503AndRetryChargesOnce stops PostgreSQL while a
// charge waits on its card processor: that request must not be answered 201 (nothing
// can commit), and once PostgreSQL is back the client's retry ends with exactly one
// charge.
func TestPostgresOutageMidRequestAnswers503AndRetryChargesOnce(t *testing.T) {
	t.Parallel()
	pg := newPGCluster(t)
	// The latency has to outlast pg_ctl stop (about 0.1s): the lease (1s) runs out
	// first, once renewals fail, and cancels the handler. The retry waits it out again.
	s := startServer(t, "--store", pg.URL(), "--processor-latency", "4s", "--lock-timeout", "1s")
	c := newClient()
	key := newKey()
	got := postInBackground(c, s.URL(), key, chargeJSON(2000))
	waitInFlightPG(t, pg.URL(), key)
	stopped := time.Now()
	pg.stop()
	t.Logf("pg_ctl stop took %v", time.Since(stopped).Round(time.Millisecond))
	a := <-got
	t.Logf("the in-flight request was answered %v after the stop began", time.Since(stopped).Round(time.Millisecond))
	if a.err != nil {
		t.Fatalf("the in-flight request during the outage: %v", a.err)
	}
	// The middleware's store_unavailable, or the handler's own 503 when the lease ran
	// out under it: either is "nothing happened, retry"; a 201 would be a lie.
	if a.res.Status != http.StatusServiceUnavailable {
		t.Fatalf("the in-flight request during the outage: want 503, got %s", a.res)
	}
	t.Logf("the in-flight request was answered %d %s (Retry-After %q)", a.res.Status, a.res.errorCode(), a.res.Header.Get("Retry-After"))
	wantRunningThroughOutage(t, s)

	pg.start()
	started := time.Now()
	res, err := retryUntilCreated(context.Background(), c, s.URL(), key, chargeJSON(2000), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the retry got its 201 %v after PostgreSQL was back", time.Since(started).Round(time.Millisecond))
	wantChargesExactly(t, c, s, map[string]string{key: res.id(t)}, "after the outage")
}
