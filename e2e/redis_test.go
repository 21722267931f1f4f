package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store/redis/redistest"
)

// The tests of this file run `idem payments` on a private Redis (or Redis Cluster)
// started by the test, never on the shared server, with the charges in an SQLite file or
// a PostgreSQL database of the test's own. Redis has no SPEC §7 transaction: the record
// and the charge live in different systems, and exactly-once rests on the payments
// API's unique (scope, idempotency_key) when Redis forgets.

// fastFail makes the servers' go-redis give up at once on a dead Redis (no command
// retries, 1 s dials), so that requests during an outage answer 503 quickly.
const fastFail = "max_retries=-1&dial_timeout=1s"

// TestConcurrentDuplicatesOnPrivateRedisChargeOnce is the three-process duplicate test
// on one Redis: 20 keys × 25 concurrent duplicates give exactly 20 charges, and every
// other answer is a replay of the winner's bytes or 409 request_in_progress.
func TestConcurrentDuplicatesOnPrivateRedisChargeOnce(t *testing.T) {
	t.Parallel()
	rs := redistest.StartServer(t)
	servers := startServers(t, 3, "--store", rs.URL(), "--db", sqliteStore(t), "--processor-latency", "50ms")
	testConcurrentDuplicates(t, servers, 20, 25)
}

// TestSIGKILLLoopOnRedisChargesEachOperationExactlyOnce kills the server at random
// moments while clients retry their operations, on a private Redis; in the flushall
// case Redis also loses every record (FLUSHALL) halfway through the kills. Each
// operation ends with exactly one charge and the same bytes in every 201.
func TestSIGKILLLoopOnRedisChargesEachOperationExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, flush := range []bool{false, true} {
		name := "kills"
		if flush {
			name = "kills+flushall"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testRedisKillLoop(t, flush)
		})
	}
}

// Parameters of the Redis kill loop: a smaller version of crash_test.go's, to keep this
// file's runtime bounded.
const (
	redisKillOps     = 40
	redisKillClients = 4
	redisKillTimes   = 6
)

func testRedisKillLoop(t *testing.T, flush bool) {
	rs := redistest.StartServer(t)
	s := startServer(t, "--store", rs.URL(), "--db", sqliteStore(t), "--processor-latency", "50ms", "--lock-timeout", "1s")
	c := newClient()
	c.http.Transport.(*http.Transport).DisableKeepAlives = true // a killed server leaves no pooled connections

	ctx, cancel := context.WithTimeout(context.Background(), 2*killOpTimeout)
	defer cancel()
	rdb := goredis.NewClient(&goredis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	loop := killLoop{servers: []*server{s}, client: c, ops: redisKillOps, clients: redisKillClients, kills: redisKillTimes}
	if flush {
		loop.beforeKill = func(ctx context.Context, kills int) {
			if kills != redisKillTimes/2 {
				return
			}
			n, _ := rdb.DBSize(ctx).Result()
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				t.Errorf("FLUSHALL: %v", err)
			}
			t.Logf("FLUSHALL after kill %d dropped %d records", kills, n)
		}
	}
	ops, kills, stats := loop.run(ctx, t)
	t.Logf("%d operations, %d kills, flushall %v; retried: %v", len(ops), kills, flush, stats)
	if stats.transportErrors.Load() == 0 {
		t.Fatal("no request met a killed server: the kills did not hit traffic")
	}

	want := firstCharges(t, ops)
	executedAgain := 0
	for _, o := range ops {
		if !o.replayed {
			executedAgain++
		}
	}
	// Without a flush every retry after a 201 finds its record. With one, a retry whose
	// record was flushed executes again, and the database answers it with the same
	// charge: identical bytes, checked above.
	if !flush && executedAgain > 0 {
		t.Errorf("%d retries after a 201 were executed again, not replayed, although Redis kept every record", executedAgain)
	}
	if flush {
		t.Logf("%d retries after a 201 were executed again (their record was flushed) and answered by the database", executedAgain)
		// Lose every record once more, now that all is quiet: each operation's next
		// retry executes again, and must still find its one charge.
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatalf("FLUSHALL: %v", err)
		}
		for i, o := range ops {
			res := c.postCharge(t, s.URL(), o.key, o.body)
			if res.Status != http.StatusCreated || res.replayed() || !bytes.Equal(res.Body, o.seen[0]) {
				t.Errorf("operation %d after FLUSHALL: want a fresh 201 with the first bytes\n%s\ngot %s", i, o.seen[0], res)
			}
		}
	}
	wantChargesExactly(t, c, s, want, "after the kill loop")
}

// TestRedisStoppedUnderRunningServerAnswers503ThenRecovers kills the private Redis under
// a running server: POSTs (replays included) answer 503 store_unavailable with
// Retry-After and /healthz 503, the process keeps running, and once Redis is back
// (empty: it persists nothing) the server serves again by itself. A key completed
// before the outage then executes again and gets its first charge back from the
// database, not a second one.
func TestRedisStoppedUnderRunningServerAnswers503ThenRecovers(t *testing.T) {
	t.Parallel()
	rs := redistest.StartServer(t)
	s := startServer(t, "--store", rs.URL()+"?"+fastFail, "--db", sqliteStore(t))
	c := newClient()
	done := newKey()
	first := c.postCharge(t, s.URL(), done, chargeJSON(2000))
	want201(t, "POST before the outage", first)

	rs.Kill()
	key := newKey()
	for i := range 3 {
		start := time.Now()
		res := c.postCharge(t, s.URL(), key, chargeJSON(3000))
		wantError(t, fmt.Sprintf("POST #%d during the outage", i+1), res, http.StatusServiceUnavailable, "store_unavailable")
		if res.Header.Get("Retry-After") == "" {
			t.Fatalf("503 without Retry-After: %s", res)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("POST #%d during the outage took %v to answer", i+1, d)
		}
	}
	res := c.postCharge(t, s.URL(), done, chargeJSON(2000))
	wantError(t, "replay during the outage (fail closed)", res, http.StatusServiceUnavailable, "store_unavailable")
	wantHealthz(t, c, s.URL(), http.StatusServiceUnavailable, "during the outage")
	wantRunningThroughOutage(t, s)

	rs.Restart()
	created := pollCreated(t, c, s.URL(), key, chargeJSON(3000), 20*time.Second, "a POST to succeed after Redis is back")
	if created.replayed() {
		t.Fatalf("the first success after the outage is a replay: %s", created)
	}
	wantHealthz(t, c, s.URL(), http.StatusOK, "after recovery")
	// The restarted Redis lost the record of done: the database answers instead.
	again := c.postCharge(t, s.URL(), done, chargeJSON(2000))
	if again.Status != http.StatusCreated || again.replayed() || !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("the key completed before the outage: want a fresh 201 with the first bytes\n%s\ngot %s", first.Body, again)
	}
	wantChargesExactly(t, c, s, map[string]string{done: first.id(t), key: created.id(t)}, "after the outage")
}

// TestRedisClusterConcurrentDuplicatesChargeOnce is the three-process duplicate test on
// a private Redis Cluster of three masters with a replica each.
func TestRedisClusterConcurrentDuplicatesChargeOnce(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	servers := startServers(t, 3, "--store", cl.URL(), "--db", postgresStore(t), "--processor-latency", "50ms")
	testConcurrentDuplicates(t, servers, 20, 25)
}

// Bounds of the failover test.
const (
	// failoverMoreOps is how many operations the load must complete after service
	// resumed.
	failoverMoreOps = 12
	// failoverResume bounds how long after the kill a new operation must succeed on
	// every process: cluster-node-timeout, the election, and the clients' slot refresh.
	failoverResume = 20 * time.Second
)

// TestRedisClusterMasterKilledUnderLoadFailsOverAndServiceResumes kills one master of
// a private Redis Cluster while three processes serve retrying clients: its replica is
// promoted, new operations succeed again on every process within failoverResume, and
// every operation answered 201 has exactly one charge, the one it was answered.
func TestRedisClusterMasterKilledUnderLoadFailsOverAndServiceResumes(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	servers := startServers(t, 3, "--store", cl.URL()+"&dial_timeout=1s", "--db", postgresStore(t),
		"--processor-latency", "20ms", "--lock-timeout", "1s")
	c := newClient()
	anyURL := func() string { return servers[rand.IntN(len(servers))].URL() }

	var (
		mu        sync.Mutex
		succeeded = map[string]string{} // key → charge id answered
		failed    []string              // keys never answered 201
		stats     retryStats
		completed atomic.Int64
	)
	stop := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*killOpTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := newKey()
				res, err := retryCounting(ctx, c, anyURL, key, chargeJSON(1000+g*10000+i), failoverResume, &stats)
				mu.Lock()
				if err != nil {
					failed = append(failed, key)
				} else {
					succeeded[key] = res.id(t)
				}
				mu.Unlock()
				completed.Add(1)
			}
		}()
	}
	waitFor(t, 20*time.Second, "the load to complete operations before the kill", func() (bool, string) {
		n := completed.Load()
		return n >= 20, fmt.Sprintf("%d operations", n)
	})

	victim, err := cl.MasterOf(ctx, "idem:{"+randHex(32)+"}")
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	victim.Kill()
	waitCtx, waitCancel := context.WithTimeout(ctx, failoverResume)
	defer waitCancel()
	if err := cl.WaitOK(waitCtx); err != nil {
		t.Fatal(err)
	}
	t.Logf("a replica took over the killed master %s after %v", victim.Addr(), time.Since(killed).Round(time.Millisecond))

	// A new operation on every process, started after the failover, succeeds.
	for i, s := range servers {
		key := newKey()
		res, err := retryUntilCreated(ctx, c, s.URL(), key, chargeJSON(7), failoverResume-time.Since(killed))
		if err != nil {
			t.Fatalf("process %d after the failover: %v", i+1, err)
		}
		mu.Lock()
		succeeded[key] = res.id(t)
		mu.Unlock()
	}
	t.Logf("service resumed on every process %v after the kill", time.Since(killed).Round(time.Millisecond))
	// The clients' own operations, retried through the failover, go on completing.
	resumed := completed.Load()
	waitFor(t, failoverResume, "the load to go on after the failover", func() (bool, string) {
		n := completed.Load() - resumed
		return n >= failoverMoreOps, fmt.Sprintf("%d more operations", n)
	})
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d operations answered 201, %d not; retried: %v", len(succeeded), len(failed), &stats)
	if len(failed) > 0 {
		t.Errorf("%d operations got no 201 within %v of retries", len(failed), failoverResume)
	}
	// Exactly once for every operation answered 201; an operation never answered may
	// have charged at most once.
	list := c.listCharges(t, servers[0].URL())
	charges := map[string][]string{}
	for _, ch := range list {
		key, _ := ch["idempotency_key"].(string)
		charges[key] = append(charges[key], ch["id"].(string))
	}
	for key, id := range succeeded {
		if got := charges[key]; len(got) != 1 || got[0] != id {
			t.Errorf("key %s answered %s has charges %v", key, id, got)
		}
	}
	for _, key := range failed {
		if got := charges[key]; len(got) > 1 {
			t.Errorf("key %s (never answered 201) has charges %v", key, got)
		}
	}
}
