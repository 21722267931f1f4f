package redis_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/backstop"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/store/redis/redistest"
)

// TestSentinelFailover kills (SIGKILL) the master of a Sentinel deployment under load
// and measures what docs/redis.md ("Sentinel") reports. Three APIs share the
// deployment, each on its own records, each loaded by retrying clients:
//
//   - plain: the defaults: claims that do not wait, no backstop;
//   - backstop: the same claims, the charge written through package backstop in an
//     SQLite database;
//   - wait: the Redis side's settings, no backstop: claims (and completions) that
//     wait for one replica (wait_replicas=1), and go-redis retries that outlast the
//     failover (rideThrough).
//
// It asserts what holds whatever the timing: service resumes within failoverResumeBound
// of the kill; every answer meanwhile is a 201, a 409 or a 503, each 409 and 503 with
// Retry-After, none later than requestBound; with the backstop no key is charged twice;
// claims that wait for a replica are never lost (every execution of a key runs under
// one record). It counts what the plain API lost. The deployment has two replicas,
// so that claims that wait for one still find one after the failover.
//
// In "kill" the master dies while replication keeps up, as it does on a quiet network.
// In "kill while replication lags" the replicas' links stall (a fault proxy holds the
// master's stream) while requests complete, and the master dies before they catch up:
// what a failover loses then is deterministic, and the plain API must lose claims.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two Sentinel deployments and fails them over; skipped with -short")
	}
	t.Parallel()
	t.Run("kill", func(t *testing.T) { testFailover(t, false) })
	t.Run("kill while replication lags", func(t *testing.T) { testFailover(t, true) })
}

// Parameters of the failover test.
const (
	// failoverClients is how many clients load each API, one key at a time.
	failoverClients = 4
	// failoverWork is what each execution's handler takes: a call to a processor.
	failoverWork = 10 * time.Millisecond
	// failoverLease and failoverStoreTimeout are the middleware's. The lease outlasts
	// the failover (as the default 30 s does), and is short enough that records left
	// in flight by it lapse within the test.
	failoverLease        = 6 * time.Second
	failoverStoreTimeout = 2 * time.Second
	// rideThrough makes go-redis retry a command for longer than a failover takes
	// (its default gives up after 3 retries, about a second), within the call's
	// context: a completion under way at the kill then lands on the new master.
	rideThrough = "max_retries=20&min_retry_backoff=100ms&max_retry_backoff=500ms"
	// failoverWait is the WAIT bound of the wait API: below the StoreTimeout, so that
	// a claim that no replica acknowledges is given back rather than cut off.
	failoverWait = 500 * time.Millisecond
	// failoverRetryPause is how long a client waits before retrying a 409 or 503. It
	// does not honour Retry-After (1 s), to keep the load up through the failover.
	failoverRetryPause = 25 * time.Millisecond
	// failoverResumeBound bounds the time from the kill to the first request that
	// completes afresh on each API. Sentinel needs down-after (1 s) to suspect the
	// master, then a vote and the promotion; the rest is slack for a busy machine.
	failoverResumeBound = 15 * time.Second
	// requestBound bounds every answer: a claim (StoreTimeout), the work, a completion
	// (bounded by the lease), and slack.
	requestBound = failoverStoreTimeout + failoverLease + failoverWork + 2*time.Second
	// failoverAfterResume is how long the load goes on once every API resumed.
	failoverAfterResume = 2 * time.Second
)

func testFailover(t *testing.T, lag bool) {
	var links []*faultproxy.Proxy
	d := redistest.StartSentinel(t, redistest.SentinelOptions{Replicas: 2, ReplicaLink: func(master string) string {
		p := faultproxy.New(t, master)
		links = append(links, p)
		return p.Addr()
	}})
	apps := []*failoverApp{
		newFailoverApp(t, "plain", d.URL(), false),
		newFailoverApp(t, "backstop", d.URL(), true),
		newFailoverApp(t, "wait", d.URL()+"&wait_replicas=1&wait_timeout="+failoverWait.String()+"&"+rideThrough, false),
	}
	plain, withBackstop, waiting := apps[0], apps[1], apps[2]
	ctx := t.Context()
	switched, err := d.WatchSwitch(ctx)
	if err != nil {
		t.Fatal(err)
	}

	loadCtx, stopLoad := context.WithCancel(ctx)
	var clients sync.WaitGroup
	for _, a := range apps {
		for range failoverClients {
			clients.Go(func() { a.client(t, loadCtx) })
		}
	}
	defer func() { stopLoad(); clients.Wait() }()
	for _, a := range apps {
		a.waitCompleted(t, 20)
	}

	if lag {
		for _, l := range links {
			l.Stall()
		}
		// Requests complete on the master that no replica has: the plain and backstop
		// APIs complete keys; the wait API's claims are given back (503).
		plain.waitCompleted(t, plain.completedCount()+10)
		withBackstop.waitCompleted(t, withBackstop.completedCount()+10)
		waiting.waitRefused(t, 3)
	}
	killedAt := time.Now()
	d.Master.Kill()
	for _, l := range links {
		l.Reset() // what the master had not sent dies with it
	}
	for _, a := range apps {
		a.markKill(killedAt)
	}
	select {
	case addr := <-switched:
		t.Logf("Sentinel announced the new master %s %v after the kill", addr, time.Since(killedAt).Round(time.Millisecond))
	case <-time.After(failoverResumeBound):
		t.Fatalf("no +switch-master within %v of the kill", failoverResumeBound)
	}
	for _, a := range apps {
		resumed := a.waitResumed(t, killedAt.Add(failoverResumeBound))
		t.Logf("%s: service resumed %v after the kill", a.name, resumed.Round(time.Millisecond))
	}
	time.Sleep(failoverAfterResume) // the load runs on: a duration of load, not synchronisation
	stopLoad()
	clients.Wait()

	for _, a := range apps {
		a.retryEveryKey(t)
		a.check(t)
	}
	for _, a := range apps {
		newRecord, sameRecord := a.reexecuted()
		t.Logf("%s: %d keys; executed again under a new record (the failover lost their record): %d; executed again under their record, after its lease lapsed: %d; claims refused for want of a replica: %d",
			a.name, len(a.keys()), newRecord, sameRecord, a.refused.Load())
	}
	lost, _ := plain.reexecuted()
	if n := withBackstop.chargedTwice(t); n != 0 {
		t.Errorf("backstop: %d keys charged more than once", n)
	}
	if n, _ := waiting.reexecuted(); n != 0 {
		t.Errorf("wait: %d keys executed under a second record: a claim a replica acknowledged was lost", n)
	}
	if lag && lost == 0 {
		t.Error("plain: the failover lost no claim although replication lagged behind the kill: the test did not lose what it means to")
	}
}

// failoverApp is one API of the failover test: POST /v1/charges behind the middleware
// on its own records, and the retrying clients' view of it.
type failoverApp struct {
	name    string
	handler http.Handler
	db      *sql.DB // the backstop's database; nil without one

	mu sync.Mutex
	// execs: key → whether each execution took its record over (a lapsed lease) or
	// claimed a new one. The record id cannot tell: it is the request's (SPEC §13),
	// the same for a record the failover lost and the retry's new one.
	execs    map[string][]bool
	done     map[string][]byte // key → the body of its first 201
	answers  []answer
	killedAt time.Time
	resumed  time.Duration // first fresh 201 after the kill; 0 until then
	progress chan struct{} // a signal per completed key or refused claim, dropped when nobody waits

	refused atomic.Int64 // 503s of claims no replica acknowledged
}

// answer is one attempt's outcome.
type answer struct {
	status     int
	retryAfter bool
	began      time.Time
	took       time.Duration
	body       string
}

func newFailoverApp(t *testing.T, name, url string, withBackstop bool) *failoverApp {
	s := openStore(t, url)
	a := &failoverApp{name: name, execs: map[string][]bool{}, done: map[string][]byte{}, progress: make(chan struct{}, 1)}
	var bs *backstop.Backstop
	if withBackstop {
		db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "app.db")+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		if _, err := db.Exec(`CREATE TABLE charges (key TEXT NOT NULL, id TEXT NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		if bs, err = backstop.New(db, backstop.Config{Dialect: backstop.SQLite}); err != nil {
			t.Fatal(err)
		}
		if err := bs.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		a.db = db
	}
	mw := idem.New(idem.Config{Store: s, Lease: failoverLease, StoreTimeout: failoverStoreTimeout, Logger: discardLogger(),
		Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	a.handler = mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		charge := func(ctx context.Context) *idem.Response {
			a.mu.Lock()
			a.execs[key] = append(a.execs[key], idem.FromContext(ctx).TookOver())
			a.mu.Unlock()
			time.Sleep(failoverWork) // the processor call
			return &idem.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
				Body: []byte(`{"id":"ch_` + rand.Text() + `","object":"charge"}`)}
		}
		if bs == nil {
			resp := charge(r.Context())
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(resp.Status)
			_, _ = w.Write(resp.Body)
			return
		}
		err := bs.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO charges (key, id) VALUES (?, ?)`, key, rand.Text()); err != nil {
				return nil, err
			}
			return charge(ctx), nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	return a
}

// post sends one attempt of key and records its answer.
func (a *failoverApp) post(key string) answer {
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":2000}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	began := time.Now()
	a.handler.ServeHTTP(rec, req)
	res := rec.Result()
	body, _ := io.ReadAll(res.Body)
	ans := answer{status: res.StatusCode, retryAfter: res.Header.Get("Retry-After") != "", began: began, took: time.Since(began), body: string(body)}
	a.mu.Lock()
	a.answers = append(a.answers, ans)
	if ans.status == http.StatusCreated && a.resumed == 0 && !a.killedAt.IsZero() && began.After(a.killedAt) && res.Header.Get("Idempotent-Replayed") == "" {
		a.resumed = time.Since(a.killedAt)
	}
	a.mu.Unlock()
	return ans
}

// client sends keys one at a time, each until it gets a 201, until ctx ends (then it
// finishes the key it has).
func (a *failoverApp) client(t *testing.T, ctx context.Context) {
	for ctx.Err() == nil {
		key := "key-" + rand.Text()
		for attempt := 0; ; attempt++ {
			ans := a.post(key)
			if ans.status == http.StatusCreated {
				a.mu.Lock()
				a.done[key] = []byte(ans.body)
				a.mu.Unlock()
				a.signal()
				break
			}
			if ans.status == http.StatusServiceUnavailable && a.refusedForWait() {
				a.refused.Add(1)
				a.signal()
			}
			if attempt > int(requestBound/failoverRetryPause)*4 {
				t.Errorf("%s: key %s got no 201 in %d attempts; last %d %s", a.name, key, attempt, ans.status, ans.body)
				return
			}
			time.Sleep(failoverRetryPause) // the client's back-off, not synchronisation
		}
	}
}

// refusedForWait reports whether the wait API refuses claims: its 503s while the
// master is up come from WAIT (nothing else fails then).
func (a *failoverApp) refusedForWait() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.name == "wait" && a.killedAt.IsZero()
}

func (a *failoverApp) signal() {
	select {
	case a.progress <- struct{}{}:
	default:
	}
}

func (a *failoverApp) completedCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.done)
}

// waitCompleted waits until n keys have a 201.
func (a *failoverApp) waitCompleted(t *testing.T, n int) {
	t.Helper()
	a.waitFor(t, fmt.Sprintf("%d completed keys", n), func() bool { return a.completedCount() >= n })
}

// waitRefused waits until n claims were refused for want of a replica's
// acknowledgement.
func (a *failoverApp) waitRefused(t *testing.T, n int64) {
	t.Helper()
	a.waitFor(t, fmt.Sprintf("%d refused claims", n), func() bool { return a.refused.Load() >= n })
}

func (a *failoverApp) waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for !ok() {
		select {
		case <-a.progress:
		case <-deadline:
			t.Fatalf("%s: no %s within 30 s", a.name, what)
		}
	}
}

func (a *failoverApp) markKill(at time.Time) {
	a.mu.Lock()
	a.killedAt = at
	a.mu.Unlock()
}

// waitResumed waits until a request that began after the kill completed afresh, and
// returns how long after the kill it did; it fails t at deadline.
func (a *failoverApp) waitResumed(t *testing.T, deadline time.Time) time.Duration {
	t.Helper()
	for {
		a.mu.Lock()
		resumed := a.resumed
		a.mu.Unlock()
		if resumed > 0 {
			return resumed
		}
		select {
		case <-a.progress:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%s: no request completed within %v of the kill", a.name, failoverResumeBound)
		}
	}
}

// retryEveryKey sends every completed key once more, as a client that lost the first
// answer would, until it gets a 201 (a key still in flight after the failover gets
// 409 until its lease lapses). With the backstop, that 201 must carry the first body:
// a replay, or the backstop's answer.
func (a *failoverApp) retryEveryKey(t *testing.T) {
	t.Helper()
	for _, key := range a.keys() {
		for attempt := 0; ; attempt++ {
			ans := a.post(key)
			if ans.status == http.StatusCreated {
				a.mu.Lock()
				first := string(a.done[key])
				a.mu.Unlock()
				if a.db != nil && ans.body != first {
					t.Errorf("%s: the later retry of %s got %s, not its first answer %s", a.name, key, ans.body, first)
				}
				break
			}
			if attempt > int(requestBound/failoverRetryPause)*4 {
				t.Errorf("%s: the later retry of %s got no 201; last %d %s", a.name, key, ans.status, ans.body)
				break
			}
			time.Sleep(failoverRetryPause) // the client's back-off, not synchronisation
		}
	}
}

// check asserts the answers' shape: 201, 409 or 503, each 409 and 503 with
// Retry-After, none later than requestBound.
func (a *failoverApp) check(t *testing.T) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	counts := map[int]int{}
	var slowest time.Duration
	for _, ans := range a.answers {
		counts[ans.status]++
		slowest = max(slowest, ans.took)
		switch ans.status {
		case http.StatusCreated:
		case http.StatusConflict, http.StatusServiceUnavailable:
			if !ans.retryAfter {
				t.Errorf("%s: %d without Retry-After: %s", a.name, ans.status, ans.body)
			}
		default:
			t.Errorf("%s: an answer %d %s; want 201, 409 or 503", a.name, ans.status, ans.body)
		}
	}
	if slowest > requestBound {
		t.Errorf("%s: an answer took %v, past the bound %v", a.name, slowest, requestBound)
	}
	t.Logf("%s: %d answers: %d × 201, %d × 409, %d × 503; slowest %v", a.name, len(a.answers),
		counts[http.StatusCreated], counts[http.StatusConflict], counts[http.StatusServiceUnavailable], slowest.Round(time.Millisecond))
}

// keys returns the keys that got a 201.
func (a *failoverApp) keys() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for k := range a.done {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// reexecuted counts the keys executed more than once: under a second record (the
// failover lost the record of an execution, its claim or its completion before it
// replicated, and a later request claimed the key afresh), and under the same record
// again (a holder's lease lapsed, its completion having failed in the failover, and a
// retry took the key over).
func (a *failoverApp) reexecuted() (newRecord, sameRecord int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, tookOver := range a.execs {
		records := len(tookOver) - countTrue(tookOver)
		if records > 1 {
			newRecord++
		}
		if records < len(tookOver) {
			sameRecord++
		}
	}
	return newRecord, sameRecord
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// chargedTwice counts the keys with more than one charge in the backstop's database.
func (a *failoverApp) chargedTwice(t *testing.T) int {
	t.Helper()
	if a.db == nil {
		return 0
	}
	var n int
	if err := a.db.QueryRow(`SELECT count(*) FROM (SELECT key FROM charges GROUP BY key HAVING count(*) > 1)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var total int
	if err := a.db.QueryRow(`SELECT count(DISTINCT key) FROM charges`).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if keys := len(a.keys()); total != keys {
		t.Errorf("%s: %d keys charged, %d keys answered 201", a.name, total, keys)
	}
	return n
}
