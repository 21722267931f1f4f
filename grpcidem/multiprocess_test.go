package grpcidem_test

import (
	"bufio"
	"context"
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
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/grpcidem/internal/testpb"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/postgres"
)

// The tests in this file run gRPC servers in child processes: each child re-executes
// the test binary, runs the same test function, sees childEnv and serves the payments
// service on a loopback port with the interceptor, on the store the parent names. It
// reports its address on stdout and serves until its stdin closes (or it kills
// itself, when told to crash).
const (
	childEnv      = "IDEM_GRPCIDEM_CHILD"       // the store: "sqlite:PATH" or "postgres:URL"
	childLeaseEnv = "IDEM_GRPCIDEM_CHILD_LEASE" // the guard's Lease
	childCrashEnv = "IDEM_GRPCIDEM_CHILD_CRASH" // "1": SIGKILL itself on behaviour "crash"
	childPrefix   = "GRPCIDEM-CHILD "
)

// A retry after a crash would charge the card again (a call not deduplicated by the
// processor); the charge's insert and the record commit together, so the charges
// table counts executions whose outcome a client can see.
const behaviourCrash = "crash"

// childRetryAfter is the RetryInfo delay the children's guards send with ABORTED.
const childRetryAfter = 50 * time.Millisecond

// serveChild is the part of a child process: serve until stdin closes.
func serveChild(t *testing.T, storeURL string) {
	ctx := context.Background()
	lease, err := time.ParseDuration(os.Getenv(childLeaseEnv))
	if err != nil {
		t.Fatalf("%s: %v", childLeaseEnv, err)
	}
	crash := os.Getenv(childCrashEnv) == "1"
	var (
		store  idemstore.Store
		create func(ctx context.Context, req *testpb.ChargeRequest) (*testpb.Charge, error)
	)
	switch kind, dsn, _ := strings.Cut(storeURL, ":"); kind {
	case "sqlite":
		s := openSQLite(t, dsn)
		store = s
		create = func(ctx context.Context, req *testpb.ChargeRequest) (*testpb.Charge, error) {
			return createChargeSQLite(ctx, s, req)
		}
	case "postgres":
		s, err := postgres.Open(ctx, dsn, postgres.Config{MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		store = s
		create = func(ctx context.Context, req *testpb.ChargeRequest) (*testpb.Charge, error) {
			return createChargePostgres(ctx, s, req)
		}
	default:
		t.Fatalf("%s=%q: unknown store", childEnv, storeURL)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	guard := idem.NewGuard(idem.GuardConfig{Store: store, Lease: lease, RetryAfter: childRetryAfter, Logger: logger})
	svc := &payments{behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
		if req.Behaviour == behaviourCrash && crash {
			// Die holding the claim, before anything commits.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		// The card processor's latency: duplicates overlap across the processes.
		time.Sleep(20 * time.Millisecond)
		return create(ctx, req)
	}}
	srv := grpc.NewServer(grpc.UnaryInterceptor(grpcidem.UnaryServerInterceptor(grpcidem.ServerConfig{
		Guard: guard, Scope: scopeOf, Logger: logger,
		Methods: map[string]grpcidem.MethodOptions{testpb.Payments_CreateCharge_FullMethodName: {Requirement: idem.KeyRequired}},
	})))
	testpb.RegisterPaymentsServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	fmt.Printf("%saddr %s pid %d\n", childPrefix, lis.Addr(), os.Getpid())
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.GracefulStop()
}

// child is one server process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	addr   string
	pid    int
	stderr *testkit.Buffer
	// exited is closed when the process has exited, with err.
	exited chan struct{}
	err    error
}

// startServer starts a server process on storeURL running the test named name, and
// stops it when the test ends (showing its stderr when the test failed).
func startServer(t *testing.T, name, storeURL string, lease time.Duration, crash bool) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v=false")
	cmd.Env = append(os.Environ(), childEnv+"="+storeURL, childLeaseEnv+"="+lease.String())
	if crash {
		cmd.Env = append(cmd.Env, childCrashEnv+"=1")
	}
	c := &child{cmd: cmd, stderr: new(testkit.Buffer), exited: make(chan struct{})}
	cmd.Stderr = c.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.stdin = stdin
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if line, ok := strings.CutPrefix(lines.Text(), childPrefix); ok {
			if _, err := fmt.Sscanf(line, "addr %s pid %d", &c.addr, &c.pid); err != nil {
				t.Fatalf("child line %q: %v", line, err)
			}
			break
		}
	}
	go func() {
		_, _ = io.Copy(io.Discard, stdout)
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if c.addr == "" {
		<-c.exited
		t.Fatalf("server process exited before serving (%v): %s", c.err, c.stderr.String())
	}
	t.Cleanup(func() {
		_ = c.stdin.Close()
		select {
		case <-c.exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("server process %d stderr:\n%s", c.pid, c.stderr.String())
		}
	})
	return c
}

// sharedStore is one store that server processes share: its URL for the children,
// and a count of the charges its database holds, by id.
type sharedStore struct {
	url     string
	charges func(t *testing.T) map[string]int
}

// stores returns the stores of the multi-process tests: a SQLite file and a
// PostgreSQL schema (skipped when PostgreSQL is absent, failed under CI=true).
func stores() map[string]func(t *testing.T) sharedStore {
	return map[string]func(t *testing.T) sharedStore{
		"sqlite": func(t *testing.T) sharedStore {
			path := filepath.Join(t.TempDir(), "idem.db")
			s := openSQLite(t, path) // migrated, with the charges table
			return sharedStore{url: "sqlite:" + path, charges: func(t *testing.T) map[string]int {
				rows, err := s.DB().Query(`SELECT id FROM grpc_charges`)
				if err != nil {
					t.Fatal(err)
				}
				defer rows.Close()
				ids := map[string]int{}
				for rows.Next() {
					var id string
					if err := rows.Scan(&id); err != nil {
						t.Fatal(err)
					}
					ids[id]++
				}
				if err := rows.Err(); err != nil {
					t.Fatal(err)
				}
				return ids
			}}
		},
		"postgres": func(t *testing.T) sharedStore {
			dbURL, schema := pgtest.Schema(t)
			dsn := pgtest.SearchPathURL(t, dbURL, schema)
			s, err := postgres.Open(context.Background(), dsn, postgres.Config{MaxConns: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			if err := s.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			pgtest.Exec(t, dsn, chargesTable)
			return sharedStore{url: "postgres:" + dsn, charges: func(t *testing.T) map[string]int {
				rows, err := s.Pool().Query(context.Background(), `SELECT id FROM grpc_charges`)
				if err != nil {
					t.Fatal(err)
				}
				ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err != nil {
					t.Fatal(err)
				}
				n := map[string]int{}
				for _, id := range ids {
					n[id]++
				}
				return n
			}}
		},
	}
}

// retryingClient is a client of addr through the client interceptor, patient enough
// to wait out a lease.
func retryingClient(t *testing.T, addr string) testpb.PaymentsClient {
	cfg := grpcidem.ClientConfig{
		MaxAttempts: 1000,
		Budget:      client.NewBudget(1, 1000, 1000),
		Backoff:     func(int, *http.Response) time.Duration { return 10 * time.Millisecond },
	}
	return testpb.NewPaymentsClient(dialT(t, addr, grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor(cfg))))
}

// Concurrent duplicates of each key, sent at once to two server processes sharing a
// store, execute once: every caller gets the one execution's charge, the database
// holds one charge per key, and later retries to either process are replays of it.
func TestTwoServerProcessesExecuteConcurrentDuplicatesOnce(t *testing.T) {
	if url := os.Getenv(childEnv); url != "" {
		serveChild(t, url)
		return
	}
	t.Parallel()
	const keys, duplicatesPerServer = 12, 3
	for name, open := range stores() {
		t.Run(name, func(t *testing.T) {
			shared := open(t)
			servers := []*child{
				startServer(t, "TestTwoServerProcessesExecuteConcurrentDuplicatesOnce", shared.url, 10*time.Second, false),
				startServer(t, "TestTwoServerProcessesExecuteConcurrentDuplicatesOnce", shared.url, 10*time.Second, false),
			}
			clients := []testpb.PaymentsClient{retryingClient(t, servers[0].addr), retryingClient(t, servers[1].addr)}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()

			type answer struct {
				key  int
				resp *testpb.Charge
				err  error
			}
			answers := make(chan answer, keys*duplicatesPerServer*len(clients))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for k := range keys {
				for range duplicatesPerServer {
					for _, c := range clients {
						wg.Go(func() {
							<-start
							resp, err := c.CreateCharge(as(ctx, "alice", fmt.Sprintf("mp-key-%04d", k)), chargeRequest())
							answers <- answer{k, resp, err}
						})
					}
				}
			}
			close(start)
			wg.Wait()
			close(answers)

			byKey := map[int]*testpb.Charge{}
			executedBy := map[int64]int{}
			for a := range answers {
				if a.err != nil {
					t.Fatalf("key %d: %v", a.key, a.err)
				}
				first, ok := byKey[a.key]
				switch {
				case !ok:
					byKey[a.key] = a.resp
					executedBy[a.resp.ServedBy]++
				case !proto.Equal(first, a.resp):
					t.Errorf("key %d: one caller got %v, another %v; want one execution's charge", a.key, first, a.resp)
				}
			}
			charges := shared.charges(t)
			if len(charges) != keys {
				t.Errorf("%d charges in the database for %d keys, want one each", len(charges), keys)
			}
			for k, c := range byKey {
				if charges[c.Id] != 1 {
					t.Errorf("key %d: the callers' charge %s is in the database %d times, want once", k, c.Id, charges[c.Id])
				}
			}
			// Retries later, to either process, are replays.
			for i, c := range clients {
				var header metadata.MD
				resp, err := c.CreateCharge(as(ctx, "alice", "mp-key-0000"), chargeRequest(), grpc.Header(&header))
				if err != nil || !proto.Equal(resp, byKey[0]) || len(header.Get(grpcidem.ReplayedKey)) != 1 {
					t.Errorf("server %d: retry got %v, %v (header %v); want the replay of %v", i, resp, err, header, byKey[0])
				}
			}
			t.Logf("%d keys × %d duplicates over 2 processes: executions by process %v", keys, duplicatesPerServer*len(clients), executedBy)
		})
	}
}

// A server process that dies holding a key leaves it in flight: the other process
// answers ABORTED while the lease lives, then takes the key over and executes the
// call once; retries are replays of that execution.
func TestALapsedLeaseIsTakenOverByTheOtherServerProcess(t *testing.T) {
	if url := os.Getenv(childEnv); url != "" {
		serveChild(t, url)
		return
	}
	t.Parallel()
	const lease = 3 * time.Second
	for name, open := range stores() {
		t.Run(name, func(t *testing.T) {
			shared := open(t)
			doomed := startServer(t, "TestALapsedLeaseIsTakenOverByTheOtherServerProcess", shared.url, lease, true)
			survivor := startServer(t, "TestALapsedLeaseIsTakenOverByTheOtherServerProcess", shared.url, lease, false)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			req := chargeRequest()
			req.Behaviour = behaviourCrash
			const key = "crash-key-0001"

			claimed := time.Now()
			_, err := testpb.NewPaymentsClient(dialT(t, doomed.addr)).CreateCharge(as(ctx, "alice", key), req)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("the call to the process that crashes: %v, want UNAVAILABLE (connection lost)", err)
			}
			if <-doomed.exited; doomed.err == nil || !strings.Contains(doomed.err.Error(), "killed") {
				t.Fatalf("the crashing process exited with %v, want killed", doomed.err)
			}

			// While the dead holder's lease lives, the key is in progress.
			plain := testpb.NewPaymentsClient(dialT(t, survivor.addr))
			_, err = plain.CreateCharge(as(ctx, "alice", key), req)
			switch {
			case status.Code(err) == codes.Aborted && grpcidem.ErrorCode(err) == idem.CodeRequestInProgress:
			case err == nil && time.Since(claimed) < lease:
				t.Fatalf("the key was taken over %v after its claim, before its %v lease could lapse", time.Since(claimed), lease)
			case err != nil:
				t.Fatalf("the survivor during the lease: %v, want ABORTED request_in_progress", err)
			default:
				t.Logf("this machine was slow: the lease lapsed before the survivor was asked (%v)", time.Since(claimed))
			}

			// The client retries until the lease lapses and the survivor takes over.
			var attempts int
			taken, err := retryingClient(t, survivor.addr).CreateCharge(as(ctx, "alice", key), req, grpcidem.Attempts(&attempts))
			if err != nil {
				t.Fatalf("after the lease: %v", err)
			}
			if taken.ServedBy != int64(survivor.pid) {
				t.Errorf("the charge was made by process %d, want the survivor %d", taken.ServedBy, survivor.pid)
			}
			if took := time.Since(claimed); took < lease-time.Second {
				t.Errorf("taken over %v after the claim; the lease is %v", took, lease)
			}
			var header metadata.MD
			again, err := plain.CreateCharge(as(ctx, "alice", key), req, grpc.Header(&header))
			if err != nil || !proto.Equal(again, taken) || len(header.Get(grpcidem.ReplayedKey)) != 1 {
				t.Errorf("retry: %v, %v (header %v); want the replay of %v", again, err, header, taken)
			}
			if charges := shared.charges(t); len(charges) != 1 || charges[taken.Id] != 1 {
				t.Errorf("charges %v, want only %s", charges, taken.Id)
			}
			t.Logf("taken over after %d attempts, %v after the dead process's claim", attempts, time.Since(claimed).Round(time.Millisecond))
		})
	}
}
