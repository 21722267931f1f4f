package mysqltest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// galeraProvider is Debian's galera-4 library.
const galeraProvider = "/usr/lib/galera/libgalera_smm.so"

// GaleraNode is one MariaDB server of a Galera cluster that a test started.
type GaleraNode struct {
	// Name is "n1", "n2", …; DSN reaches the node as root (database test).
	Name string
	DSN  string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Kill kills the node's server with SIGKILL, as a crash of its host would stop it,
// and waits for it to exit.
func (n *GaleraNode) Kill() {
	if n.cmd.Process != nil {
		_ = n.cmd.Process.Kill()
	}
	<-n.done
}

// StartGalera starts a MariaDB Galera cluster of size nodes on this machine, each on
// its own loopback ports and data directory, and returns them once every node is
// synced; the first bootstraps the cluster and the others join it by state transfer
// (rsync). They are killed, and their files removed, when t ends. Without mariadbd,
// mariadb-install-db, galera-4 (galeraProvider) or rsync the test skips (fails under
// CI=true; .ci/run installs them). Started as root, the servers run as the mysql user,
// whose rsync daemon must be able to write the joiners' data directories.
func StartGalera(t testing.TB, size int, within time.Duration) []*GaleraNode {
	t.Helper()
	for _, bin := range []string{"mariadbd", "mariadb-install-db", "rsync", "wsrep_sst_rsync"} {
		if _, err := lookPath(bin); err != nil {
			testenv.Unavailable(t, "no %s to start a Galera cluster (apt-get install mariadb-server galera-4 rsync; .ci/run does)", bin)
			return nil
		}
	}
	if _, err := os.Stat(galeraProvider); err != nil {
		testenv.Unavailable(t, "no Galera provider at %s (apt-get install galera-4; .ci/run does)", galeraProvider)
		return nil
	}
	runAs := ""
	if os.Geteuid() == 0 {
		runAs = "mysql"
	} else if u, err := user.Current(); err == nil {
		runAs = u.Username
	}
	base, err := os.MkdirTemp("", "idem-galera-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(within)
	nodes := make([]*GaleraNode, size)
	gports := make([]int, size)
	var cluster []string
	for i := range nodes {
		gports[i] = testenv.FreePort(t)
		cluster = append(cluster, "127.0.0.1:"+strconv.Itoa(gports[i]))
	}
	t.Cleanup(func() {
		for _, n := range nodes {
			if n != nil {
				n.Kill()
			}
		}
		if t.Failed() {
			for _, n := range nodes {
				if n != nil {
					logTail(t, n)
				}
			}
		}
		_ = os.RemoveAll(base)
	})
	first := filepath.Join(base, "n1")
	install := exec.Command(mustLook("mariadb-install-db"), "--no-defaults", "--datadir="+first, "--user="+runAs,
		"--auth-root-authentication-method=normal", "--skip-test-db", "--innodb_log_file_size=8M", "--innodb_buffer_pool_size=32M")
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	for i := range nodes {
		dir := filepath.Join(base, fmt.Sprintf("n%d", i+1))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		chown(t, runAs, base)
		address := "gcomm://" + strings.Join(cluster, ",")
		if i == 0 {
			address = "gcomm://"
		}
		nodes[i] = startNode(t, fmt.Sprintf("n%d", i+1), dir, runAs, address, gports[i], i == 0)
		if i == 0 {
			// The others join a cluster that exists.
			waitSynced(t, nodes[i], deadline)
		}
	}
	for _, n := range nodes[1:] {
		waitSynced(t, n, deadline)
	}
	return nodes
}

// startNode starts one node's server in dir.
func startNode(t testing.TB, name, dir, runAs, address string, gport int, bootstrap bool) *GaleraNode {
	t.Helper()
	port := testenv.FreePort(t)
	ist, sst := testenv.FreePort(t), testenv.FreePort(t)
	args := []string{
		"--no-defaults", "--user=" + runAs, "--datadir=" + dir, "--socket=" + dir + ".sock", "--pid-file=" + dir + ".pid",
		"--log-error=" + dir + ".err", "--port=" + strconv.Itoa(port), "--bind-address=127.0.0.1",
		"--innodb_log_file_size=8M", "--innodb_buffer_pool_size=32M", "--skip-log-bin",
		"--binlog_format=ROW", "--default_storage_engine=InnoDB", "--innodb_autoinc_lock_mode=2",
		"--wsrep_on=ON", "--wsrep_provider=" + galeraProvider, "--wsrep_cluster_name=idemtest",
		"--wsrep_cluster_address=" + address, "--wsrep_node_name=" + name,
		"--wsrep_node_address=127.0.0.1:" + strconv.Itoa(gport),
		// A dead node is declared gone within about 2 s (the defaults take 15), so that
		// a test that kills one sees the others serve again soon.
		fmt.Sprintf("--wsrep_provider_options=base_port=%d;ist.recv_addr=127.0.0.1:%d;gcache.size=16M;"+
			"evs.keepalive_period=PT0.2S;evs.inactive_check_period=PT0.5S;evs.suspect_timeout=PT1S;"+
			"evs.inactive_timeout=PT2S;evs.install_timeout=PT2S", gport, ist),
		"--wsrep_sst_method=rsync", "--wsrep_sst_receive_address=127.0.0.1:" + strconv.Itoa(sst),
	}
	if bootstrap {
		args = append(args, "--wsrep-new-cluster")
	}
	cmd := exec.Command(mustLook("mariadbd"), args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	n := &GaleraNode{Name: name, DSN: fmt.Sprintf("root@tcp(127.0.0.1:%d)/test", port), dir: dir, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(n.done) }()
	return n
}

// waitSynced waits until n answers and says it is ready (synced with the cluster),
// creating its database test once it does (DDL replicates: once is enough, and again
// is harmless).
func waitSynced(t testing.TB, n *GaleraNode, deadline time.Time) {
	t.Helper()
	dsn := strings.TrimSuffix(n.DSN, "test")
	for {
		db, err := sql.Open("mysql", dsn)
		if err == nil {
			var name, ready string
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err = db.QueryRowContext(ctx, `SHOW STATUS LIKE 'wsrep_ready'`).Scan(&name, &ready)
			if err == nil && ready == "ON" {
				_, err = db.ExecContext(ctx, `CREATE DATABASE IF NOT EXISTS test`)
				cancel()
				_ = db.Close()
				if err != nil {
					t.Fatalf("%s: %v", n.Name, err)
				}
				return
			}
			cancel()
			_ = db.Close()
		}
		select {
		case <-n.done:
			t.Fatalf("Galera node %s exited while starting", n.Name)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("Galera node %s not synced in time (last: %v)", n.Name, err)
		}
	}
}

func lookPath(bin string) (string, error) {
	if p, err := exec.LookPath(bin); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
		if p := filepath.Join(dir, bin); fileExists(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found", bin)
}

func mustLook(bin string) string {
	p, _ := lookPath(bin)
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// chown gives the tree at dir to runAs (the servers' user), when the test runs as root.
func chown(t testing.TB, runAs, dir string) {
	t.Helper()
	if os.Geteuid() != 0 {
		return
	}
	if out, err := exec.Command("chown", "-R", runAs+":"+runAs, dir).CombinedOutput(); err != nil {
		t.Fatalf("chown %s: %v\n%s", dir, err, out)
	}
}

// logTail logs the end of n's error log.
func logTail(t testing.TB, n *GaleraNode) {
	b, err := os.ReadFile(n.dir + ".err")
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	t.Logf("%s's log, last lines:\n%s", n.Name, strings.Join(lines[max(0, len(lines)-15):], "\n"))
}
