package e2e

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// killOp is one logical operation of a kill loop: a key, a body, and the bodies of
// every 201 it got.
type killOp struct {
	key  string
	body []byte
	seen [][]byte // bodies of every 201
	// replayed: the 201 to the retry sent after success was a replay.
	replayed bool
}

// killLoop kills a random one of servers at random moments while clients retry their
// operations (same key, same body) until they get a 201, and restarts it on the same
// address and store.
type killLoop struct {
	servers []*server
	client  *client // shared by the client goroutines
	ops     int     // operations at least, each its own key and body
	clients int     // client goroutines sharing them
	kills   int     // SIGKILLs of a server
	// beforeKill, when set, runs on the test's goroutine at each random moment, before
	// the kill, with the number of kills done so far.
	beforeKill func(ctx context.Context, kills int)
}

// run runs the loop within ctx (and 2*killOpTimeout), waits for the clients, and
// returns every operation, client by client, the number of kills, and what the
// clients retried. It stops the test when a restart failed or the test has failed
// otherwise, after reporting each client's error.
func (l killLoop) run(ctx context.Context, t *testing.T) ([]*killOp, int, *retryStats) {
	t.Helper()
	anyURL := func() string { return l.servers[rand.IntN(len(l.servers))].URL() }
	perClient := make([][]*killOp, l.clients)
	killerDone := make(chan struct{})
	stats := &retryStats{}

	ctx, cancel := context.WithTimeout(ctx, 2*killOpTimeout)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, l.clients)
	for g := range l.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// At least its share of the operations, and more until the killer is done,
			// so that every kill hits traffic.
			for i := 0; ; i++ {
				if i >= l.ops/l.clients {
					select {
					case <-killerDone:
						return
					default:
					}
				}
				o := &killOp{key: newKey(), body: chargeJSON(1000 + g*10000 + i)}
				perClient[g] = append(perClient[g], o)
				// The operation, then one retry after success: both must be 201s with
				// the same bytes, whatever kills happen in between.
				for range 2 {
					res, err := retryCounting(ctx, l.client, anyURL, o.key, o.body, killOpTimeout, stats)
					if err != nil {
						errs <- err
						return
					}
					o.seen = append(o.seen, res.Body)
					o.replayed = res.replayed()
				}
			}
		}()
	}
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()

	kills := 0
	var killErr error
	for kills < l.kills && killErr == nil {
		time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond) // a random moment
		if l.beforeKill != nil {
			l.beforeKill(ctx, kills)
		}
		victim := l.servers[rand.IntN(len(l.servers))]
		victim.kill()
		kills++
		killErr = victim.relaunch()
	}
	close(killerDone)
	if killErr != nil {
		cancel()
	}
	<-clientsDone
	close(errs)
	if killErr != nil {
		t.Fatalf("restart after kill %d: %v", kills, killErr)
	}
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	var ops []*killOp
	for _, p := range perClient {
		ops = append(ops, p...)
	}
	return ops, kills, stats
}

// firstCharges fails the test for each operation whose 201s differ from its first, and
// returns the charge id of each operation's first 201, by key.
func firstCharges(t *testing.T, ops []*killOp) map[string]string {
	t.Helper()
	want := map[string]string{}
	for i, o := range ops {
		for j, b := range o.seen {
			if !bytes.Equal(b, o.seen[0]) {
				t.Errorf("operation %d: 201 #%d differs from the first:\n got %s\nwant %s", i, j+1, b, o.seen[0])
			}
		}
		want[o.key] = (&response{Body: o.seen[0]}).id(t)
	}
	return want
}
