package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConcurrentDuplicatesAcrossProcessesChargeOnce sends 20 keys × 25 concurrent
// duplicates spread over three processes sharing one store: exactly one charge per key,
// and every other answer is a replay of the winner's or 409 request_in_progress.
func TestConcurrentDuplicatesAcrossProcessesChargeOnce(t *testing.T) {
	t.Parallel()
	// Redis: redis_test.go runs this on a private Redis and Redis Cluster.
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			servers := startServers(t, 3, append(storeFlags(t, kind), "--processor-latency", "50ms")...)
			testConcurrentDuplicates(t, servers, 20, 25)
		})
	}
}

// startServers starts n servers with the same flags at once (so their migrations race,
// as SPEC §10 allows) and waits for all of them.
func startServers(t *testing.T, n int, flags ...string) []*server {
	t.Helper()
	servers := make([]*server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range servers {
		servers[i] = newServer(t, flags...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = servers[i].launch("127.0.0.1:0")
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return servers
}

type answer struct {
	res *response
	err error
}

func testConcurrentDuplicates(t *testing.T, servers []*server, keys, dups int) {
	c := newClient()
	body := chargeJSON(2000)
	answers := make([][]answer, keys)
	start := make(chan struct{})
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	keyNames := make([]string, keys)
	for k := range keys {
		keyNames[k] = newKey()
		answers[k] = make([]answer, dups)
		for d := range dups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				s := servers[(k+d)%len(servers)]
				res, err := c.send(ctx, s.URL(), request{method: "POST", path: "/v1/charges", key: keyNames[k], contentType: contentJSON, body: body})
				answers[k][d] = answer{res, err}
			}()
		}
	}
	close(start)
	wg.Wait()

	winners := map[string]string{} // key → charge id
	counts := map[string]int{}
	for k, key := range keyNames {
		var winner *response
		executed := 0
		for d, a := range answers[k] {
			if a.err != nil {
				t.Errorf("key %d duplicate %d: %v", k, d, a.err)
				continue
			}
			res := a.res
			switch {
			case res.Status == http.StatusCreated && !res.replayed():
				counts["executed"]++
				executed++
				if winner != nil {
					if executed == 2 {
						t.Errorf("key %d: more than one executed (non-replayed) 201:\n%s\n%s", k, winner.Body, res.Body)
					}
					continue
				}
				winner = res
			case res.Status == http.StatusCreated:
				counts["replayed"]++
			case res.Status == http.StatusConflict && res.errorCode() == "request_in_progress":
				counts["in progress"]++
				if res.Header.Get("Retry-After") == "" || res.Header.Get("Idempotency-Key") != key {
					t.Errorf("key %d: 409 request_in_progress without Retry-After or the echoed key: %s", k, res)
				}
			default:
				counts["other"]++
				t.Errorf("key %d duplicate %d: want 201 or 409 request_in_progress, got %s", k, d, res)
			}
		}
		if winner == nil {
			t.Errorf("key %d: no executed 201 among %d duplicates", k, dups)
			continue
		}
		winners[key] = winner.id(t)
		for d, a := range answers[k] {
			if a.err == nil && a.res.Status == http.StatusCreated && !bytes.Equal(a.res.Body, winner.Body) {
				t.Errorf("key %d duplicate %d: 201 body differs from the winner's:\n got %s\nwant %s", k, d, a.res.Body, winner.Body)
			}
		}
	}
	t.Logf("answers: %v", counts)

	for i, s := range servers {
		wantChargesExactly(t, c, s, winners, fmt.Sprintf("listing via process %d", i+1))
	}
}

// wantChargesExactly fails unless the principal's charges are exactly one per key of
// want (key → charge id), with the idempotency_key of that key.
func wantChargesExactly(t testing.TB, c *client, s *server, want map[string]string, what string) {
	t.Helper()
	list := c.listCharges(t, s.URL())
	seen := map[string]string{}
	for _, ch := range list {
		key, _ := ch["idempotency_key"].(string)
		id, _ := ch["id"].(string)
		if prev, dup := seen[key]; dup {
			t.Errorf("%s: key %s has two charges: %s and %s", what, key, prev, id)
		}
		seen[key] = id
		if wantID, ok := want[key]; !ok {
			t.Errorf("%s: unexpected charge %s with idempotency_key %q", what, id, key)
		} else if wantID != id {
			t.Errorf("%s: key %s: charge %s listed, but the client was answered %s", what, key, id, wantID)
		}
	}
	if len(list) != len(want) {
		t.Errorf("%s: %d charges, want %d", what, len(list), len(want))
	}
}

// TestSlowHolderStillChargesOnce holds a key longer than its lease timeout (the
// heartbeat must keep it, or a takeover must be fenced); a duplicate arrives meanwhile at
// another process on the same store. Exactly one charge results, executed once, and both
// clients end with it.
func TestSlowHolderStillChargesOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range allStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			servers := startServers(t, 2, append(storeFlags(t, kind), "--processor-latency", "3s", "--lock-timeout", "1s")...)
			c := newClient()
			key := newKey()
			answers := make(chan answer, 2)
			send := func(s *server) {
				res, err := retryUntilCreated(context.Background(), c, s.URL(), key, chargeJSON(2000), 30*time.Second)
				answers <- answer{res, err}
			}
			go send(servers[0])
			time.Sleep(1800 * time.Millisecond) // the scenario: a duplicate while the holder is slow
			go send(servers[1])
			var got []*response
			executed := 0
			for range 2 {
				a := <-answers
				if a.err != nil {
					t.Fatal(a.err)
				}
				got = append(got, a.res)
				if !a.res.replayed() {
					executed++
				}
			}
			if got[0].id(t) != got[1].id(t) || !bytes.Equal(got[0].Body, got[1].Body) {
				t.Fatalf("the two clients got different answers:\n%s\n%s", got[0].Body, got[1].Body)
			}
			if executed != 1 {
				t.Fatalf("%d of the two final 201s were executions, want exactly 1 (the other a replay)", executed)
			}
			wantChargesExactly(t, c, servers[1], map[string]string{key: got[0].id(t)}, "after the slow holder")
		})
	}
}

// retryUntilCreated posts the charge with key and body until it gets a 201, retrying
// transport errors, 409 request_in_progress and 503, within d.
func retryUntilCreated(ctx context.Context, c *client, base, key string, body []byte, d time.Duration) (*response, error) {
	return retryCounting(ctx, c, func() string { return base }, key, body, d, &retryStats{})
}

// retryStats counts the retried answers of retryCounting.
type retryStats struct {
	transportErrors, inProgress, unavailable atomic.Int64
}

func (s *retryStats) String() string {
	return fmt.Sprintf("%d transport errors, %d request_in_progress, %d 503", s.transportErrors.Load(), s.inProgress.Load(), s.unavailable.Load())
}

// retryCounting is retryUntilCreated counting what it retried in stats, sending each
// attempt to the server base returns.
func retryCounting(ctx context.Context, c *client, base func() string, key string, body []byte, d time.Duration, stats *retryStats) (*response, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last string
	for attempt := 1; ; attempt++ {
		res, err := c.send(ctx, base(), request{method: "POST", path: "/v1/charges", key: key, contentType: contentJSON, body: body})
		switch {
		case err != nil:
			stats.transportErrors.Add(1)
			last = err.Error()
		case res.Status == http.StatusCreated:
			return res, nil
		case res.Status == http.StatusConflict && res.errorCode() == "request_in_progress":
			stats.inProgress.Add(1)
			last = res.String()
		case res.Status == http.StatusServiceUnavailable:
			stats.unavailable.Add(1)
			last = res.String()
		default:
			return nil, fmt.Errorf("key %s attempt %d: final answer %s", key, attempt, res)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("key %s: no 201 within %v after %d attempts; last: %s", key, d, attempt, last)
		case <-time.After(backoff(attempt)):
		}
	}
}

// backoff is a short capped backoff between retries of one logical request.
func backoff(attempt int) time.Duration {
	d := time.Duration(attempt) * 20 * time.Millisecond
	return min(d, 200*time.Millisecond)
}
