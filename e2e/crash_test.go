package e2e

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "modernc.org/sqlite"
)

// Parameters of the SIGKILL loop.
const (
	killOps       = 48 // logical operations, each its own key and body
	killClients   = 4  // client goroutines sharing them
	killTimes     = 8  // SIGKILLs of the server
	killOpTimeout = 60 * time.Second
)

// TestSIGKILLLoopChargesEachOperationExactlyOnce kills the server at random moments while
// clients retry their operations (same key, same body) until they get a 201, and restarts
// it on the same address and store. Every operation ends with exactly one charge, and
// every 201 a client saw for one key has the same bytes.
func TestSIGKILLLoopChargesEachOperationExactlyOnce(t *testing.T) {
	t.Parallel()
	// Redis: redis_test.go runs this on a private Redis, with and without FLUSHALL.
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testKillLoop(t, kind, 1)
		})
	}
}

// TestSIGKILLOfOneOfThreeProcessesChargesEachOperationExactlyOnce is the kill loop with
// three processes on one store: each attempt goes to a random process, and a random one
// is killed each time, so keys of a dead process are taken over by the others.
func TestSIGKILLOfOneOfThreeProcessesChargesEachOperationExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range allStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			testKillLoop(t, kind, 3)
		})
	}
}

func testKillLoop(t *testing.T, kind storeKind, processes int) {
	servers := startServers(t, processes, append(storeFlags(t, kind), "--processor-latency", "50ms", "--lock-timeout", "1s")...)
	c := newClient()
	// One connection per request: a killed server leaves no stale pooled ones.
	c.http.Transport.(*http.Transport).DisableKeepAlives = true
	loop := killLoop{servers: servers, client: c, ops: killOps, clients: killClients, kills: killTimes}
	ops, kills, stats := loop.run(context.Background(), t)
	t.Logf("%d operations, %d processes, %d kills; retried: %v", len(ops), processes, kills, stats)
	if stats.transportErrors.Load() == 0 {
		t.Fatalf("no request met a killed server: the kills did not hit traffic")
	}

	want := firstCharges(t, ops)
	for i, o := range ops {
		if !o.replayed {
			t.Errorf("operation %d: the retry after its 201 was executed again, not replayed", i)
		}
	}
	for i, s := range servers {
		wantChargesExactly(t, c, s, want, fmt.Sprintf("after the kill loop, listing via process %d", i+1))
	}
}

// TestCompletedKeyReplaysAfterRestart restarts the server gracefully, then after a
// SIGKILL: a key completed before either replays with the same body.
func TestCompletedKeyReplaysAfterRestart(t *testing.T) {
	t.Parallel()
	for _, kind := range allStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, storeFlags(t, kind)...)
			c := newClient()
			key := newKey()
			first := c.postCharge(t, s.URL(), key, chargeJSON(2000))
			want201(t, "first POST", first)

			s.stop(syscall.SIGTERM)
			s.restart()
			wantReplayOf(t, "replay after a graceful restart", first, c.postCharge(t, s.URL(), key, chargeJSON(2000)), key)

			s.kill()
			s.restart()
			wantReplayOf(t, "replay after kill -9 and restart", first, c.postCharge(t, s.URL(), key, chargeJSON(2000)), key)
			wantChargesExactly(t, c, s, map[string]string{key: first.id(t)}, "after the restarts")
		})
	}
}

// TestGracefulShutdownFinishesInFlightRequest sends SIGTERM while a charge is in flight:
// the charge completes with 201 and the process exits 0.
func TestGracefulShutdownFinishesInFlightRequest(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			dbPath := filepath.Join(t.TempDir(), "idem.db")
			s := startServer(t, "--store", "sqlite:"+dbPath, "--processor-latency", "1s")
			c := newClient()
			key := newKey()
			got := postInBackground(c, s.URL(), key, chargeJSON(2000))
			waitInFlight(t, dbPath, key)
			s.signal(sig)
			a := <-got
			if a.err != nil {
				t.Fatalf("in-flight request during %v: %v", sig, a.err)
			}
			want201(t, fmt.Sprintf("in-flight request during %v", sig), a.res)
			if err := s.wait(stopTimeout); err != nil {
				t.Fatalf("after %v: want exit 0, got %v", sig, err)
			}
			s.restart()
			wantReplayOf(t, "the charge completed during shutdown, after a restart", a.res, c.postCharge(t, s.URL(), key, chargeJSON(2000)), key)
		})
	}
}

// waitInFlight waits until the SQLite store at dbPath holds key in flight. Reading the
// store's table is the one signal that a request holds its key which no second request
// can disturb (a duplicate POST could claim the key first).
func waitInFlight(t testing.TB, dbPath, key string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waitForState(t, key, func() (string, error) {
		var state string
		err := db.QueryRow("SELECT state FROM idem_records WHERE key = ?", key).Scan(&state)
		return state, err
	})
}

// waitInFlightPG is waitInFlight for the PostgreSQL store at url (a pool's URL: its
// pool_ parameters are the pool's, not the connection's).
func waitInFlightPG(t testing.TB, url, key string) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	waitForState(t, key, func() (string, error) {
		var state string
		err := conn.QueryRow(ctx, "SELECT state FROM idem_records WHERE key = $1", key).Scan(&state)
		return state, err
	})
}

func waitForState(t testing.TB, key string, state func() (string, error)) {
	t.Helper()
	waitFor(t, 10*time.Second, "the request to hold its key in flight", func() (bool, string) {
		s, err := state()
		if err != nil {
			return false, err.Error()
		}
		return s == "in_flight", "state " + s
	})
}

// newClientAs returns a client with its own connections for the principal of c.
func newClientAs(c *client) *client {
	n := newClient()
	n.token = c.token
	return n
}

// TestHolderKilledMidRequestIsTakenOverOnce SIGKILLs the process that holds a key while
// its charge waits on the card processor: once the lease lapses, another process on the
// same store takes the key over and charges exactly once, and the first client's retry
// is a replay of that charge.
func TestHolderKilledMidRequestIsTakenOverOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			store := newStore(t, kind)
			servers := startServers(t, 2, "--store", store, "--processor-latency", "3s", "--lock-timeout", "1s")
			c := newClient()
			key := newKey()
			got := postInBackground(c, servers[0].URL(), key, chargeJSON(2000))
			if kind == storeSQLite {
				waitInFlight(t, strings.TrimPrefix(store, "sqlite:"), key)
			} else {
				waitInFlightPG(t, store, key)
			}
			servers[0].kill()
			if a := <-got; a.err == nil {
				t.Fatalf("the killed holder answered: %s", a.res)
			}

			taken, err := retryUntilCreated(context.Background(), c, servers[1].URL(), key, chargeJSON(2000), 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if taken.replayed() {
				t.Fatalf("the takeover was answered by a replay: the killed holder completed? %s", taken)
			}
			wantReplayOf(t, "the first client's retry", taken, c.postCharge(t, servers[1].URL(), key, chargeJSON(2000)), key)
			wantChargesExactly(t, c, servers[1], map[string]string{key: taken.id(t)}, "after the takeover")
		})
	}
}
