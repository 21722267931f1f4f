package pgtest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	osexec "os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// ExecModes are pgx's QueryExecModes as a URL names them (default_query_exec_mode),
// pgx's default first: the modes a store's tests run in, as pgx's own tests do
// (pgxtest.AllQueryExecModes).
var ExecModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// PoolerModes are the modes that work behind a transaction pooler that keeps no
// prepared statements (PgBouncer before 1.21, or with max_prepared_statements = 0):
// each round trip stands alone. cache_statement prepares named statements on the
// server connection; describe_exec binds, in its second round trip, the unnamed
// statement that its first prepared, which the pooler may have given another client
// in between.
var PoolerModes = []string{"cache_describe", "exec", "simple_protocol"}

// WithExecMode returns dbURL with pgx's default_query_exec_mode set to mode.
func WithExecMode(t testing.TB, dbURL, mode string) string {
	t.Helper()
	return WithParam(t, dbURL, "default_query_exec_mode", mode)
}

// Bouncer starts a private PgBouncer (Debian's pgbouncer package) in transaction
// pooling mode in front of the PostgreSQL server of dbURL, with at most poolSize
// server connections per database, and returns dbURL with its host and port replaced
// by the bouncer's. It listens on an ephemeral loopback port and lets every client in
// (auth_type trust, the URL's user in a temporary auth file); it is stopped, and its
// files removed, when the test ends. Without a pgbouncer binary the test skips (fails
// under CI=true; .ci/run installs it).
//
// Like every PgBouncer before 1.21, Debian 12's 1.18 keeps no prepared statement of a
// client from one transaction to the next; PgBouncer refuses startup parameters it
// does not know (search_path, synchronous_commit and the like in a URL).
func Bouncer(t testing.TB, dbURL string, poolSize int) string {
	t.Helper()
	bin, err := osexec.LookPath("pgbouncer")
	if err != nil {
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"} {
			if _, statErr := os.Stat(p); statErr == nil {
				bin, err = p, nil
				break
			}
		}
	}
	if err != nil {
		testenv.Unavailable(t, "no pgbouncer binary to put a transaction pooler in front of PostgreSQL (apt-get install pgbouncer; .ci/run does)")
		return ""
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("pgtest: parsing %q: %v", dbURL, err)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "5432"
	}
	userName := u.User.Username()
	if userName == "" {
		userName = "postgres"
	}
	dir, err := os.MkdirTemp("", "idem-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// PgBouncer refuses to run as root: run it as the postgres OS user (its process's
	// credentials), which must read its files.
	var runAs *user.User
	if os.Geteuid() == 0 {
		if runAs, err = user.Lookup("postgres"); err != nil {
			testenv.Unavailable(t, "running as root without a postgres OS user to run pgbouncer as: %v", err)
			return ""
		}
	}
	authFile := filepath.Join(dir, "users.txt")
	writeFile(t, authFile, fmt.Sprintf("%q \"\"\n", userName))
	for attempt := 0; ; attempt++ {
		listen := testenv.FreePort(t)
		ini := filepath.Join(dir, "pgbouncer.ini")
		writeFile(t, ini, fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = %d
max_client_conn = 1000
server_lifetime = 3600
log_connections = 0
log_disconnections = 0
`, host, port, listen, authFile, poolSize))
		if runAs != nil {
			uid, _ := strconv.Atoi(runAs.Uid)
			gid, _ := strconv.Atoi(runAs.Gid)
			for _, p := range []string{dir, ini, authFile} {
				if err := os.Chown(p, uid, gid); err != nil {
					t.Fatal(err)
				}
			}
		}
		err := startBouncer(t, bin, ini, runAs)
		if err == nil {
			u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
			return u.String()
		}
		if attempt == 2 || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("pgtest: starting pgbouncer: %v", err)
		}
	}
}

// startBouncer runs pgbouncer in the foreground with ini and returns once its log
// says it listens; it is stopped when the test ends.
func startBouncer(t testing.TB, bin, ini string, runAs *user.User) error {
	t.Helper()
	cmd := osexec.Command(bin, ini)
	// Killed with the test binary, should it die without its cleanups (a test's
	// timeout): a bouncer left behind holds server connections.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if runAs != nil {
		uid, _ := strconv.Atoi(runAs.Uid)
		gid, _ := strconv.Atoi(runAs.Gid)
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	up := make(chan struct{})
	var log strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if log.Len() < 1<<16 {
				log.WriteString(line + "\n")
			}
			if strings.Contains(line, "process up") {
				close(up)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stderr) // keep it from blocking on a full pipe
		close(exited)
	}()
	stop := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		_ = cmd.Wait()
	}
	select {
	case <-up:
		t.Cleanup(stop)
		return nil
	case <-exited:
		stop()
		return fmt.Errorf("pgbouncer exited before it listened:\n%s", log.String())
	case <-time.After(30 * time.Second):
		stop()
		<-exited
		return fmt.Errorf("pgbouncer did not say it listens within 30s:\n%s", log.String())
	}
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
