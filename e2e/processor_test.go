package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Parameters of the kill loop with a card processor (issue 11).
const (
	cardOps     = 60 // operations, each its own key, body and amount
	cardClients = 4  // client goroutines sharing them
	cardKills   = 6  // SIGKILLs of the payments process
	// cardKillsInCalls is how many kills at least must land while the payments
	// process waits on the processor: the moment the double charge needs.
	cardKillsInCalls = 3
)

// cardProcessor is a running `idem processor` over an SQLite file of its own.
type cardProcessor struct {
	*server
	db *sql.DB // read-only, for the tests' own look at its records
}

// startCardProcessor starts `idem processor` with flags over a fresh SQLite file.
func startCardProcessor(t *testing.T, flags ...string) *cardProcessor {
	t.Helper()
	path := filepath.Join(t.TempDir(), "processor.db")
	s := startProcessor(t, append([]string{"--store", "sqlite:" + path}, flags...)...)
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &cardProcessor{server: s, db: db}
}

// callsInFlight returns how many charges the processor is making now: requests that
// hold their key, whose callers wait for the answer.
func (p *cardProcessor) callsInFlight() int {
	var n int
	if err := p.db.QueryRow("SELECT count(*) FROM idem_records WHERE state = 'in_flight'").Scan(&n); err != nil {
		return 0
	}
	return n
}

// processorChargeJSON is a charge as the processor lists it.
type processorChargeJSON struct {
	ID             string `json:"id"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	IdempotencyKey string `json:"idempotency_key"`
}

// charges returns every charge the processor made, paging through its list.
func (p *cardProcessor) charges(t testing.TB) []processorChargeJSON {
	t.Helper()
	c := newClient()
	var all []processorChargeJSON
	after := ""
	for {
		path := "/v1/processor/charges?limit=1000"
		if after != "" {
			path += "&starting_after=" + after
		}
		res := c.do(t, p.URL(), request{method: "GET", path: path})
		var page struct {
			Object  string                `json:"object"`
			Data    []processorChargeJSON `json:"data"`
			HasMore bool                  `json:"has_more"`
		}
		if res.Status != http.StatusOK || json.Unmarshal(res.Body, &page) != nil || page.Object != "list" {
			t.Fatalf("GET %s: %s", path, res)
		}
		all = append(all, page.Data...)
		if !page.HasMore || len(page.Data) == 0 {
			return all
		}
		after = page.Data[len(page.Data)-1].ID
	}
}

// cardOp is one operation of a test with a processor: a key and a body with an amount
// of its own, so that the processor's charges tell which operation they belong to.
type cardOp struct {
	key    string
	amount int
	body   []byte
	seen   [][]byte // bodies of every 201
}

func newCardOp(amount int) *cardOp {
	return &cardOp{key: newKey(), amount: amount, body: chargeJSON(amount)}
}

// TestSIGKILLLoopWithAProcessorChargesEachCardExactlyOnce is the kill loop of the e2e
// tests with a card processor that is slow, fails and loses replies: cardOps
// operations, each retried by its client until it gets a final answer, while the
// payments process is killed cardKills times, at least cardKillsInCalls of them while
// it waits on the processor. The processor must hold exactly one charge per
// operation, and payments exactly one succeeded charge per operation, carrying that
// processor charge.
func TestSIGKILLLoopWithAProcessorChargesEachCardExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			proc := startCardProcessor(t, "--latency", "100ms", "--lost-reply-rate", "0.2", "--fail-rate", "0.1")
			pay := startServer(t, append(storeFlags(t, kind), "--processor-url", proc.URL(), "--lock-timeout", "1s")...)
			c := newClient()
			// One connection per request: a killed server leaves no stale pooled ones.
			c.http.Transport.(*http.Transport).DisableKeepAlives = true

			ops := make([]*cardOp, cardOps)
			for i := range ops {
				ops[i] = newCardOp(1000 + i)
			}
			var (
				done  atomic.Int64
				stats retryStats
				wg    sync.WaitGroup
				errs  = make(chan error, cardClients)
			)
			ctx, cancel := context.WithTimeout(context.Background(), 2*killOpTimeout)
			defer cancel()
			for g := range cardClients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := g; i < len(ops); i += cardClients {
						o := ops[i]
						// The operation, then one retry after success: both 201s with the
						// same bytes, whatever kills happen in between.
						for range 2 {
							res, err := retryCounting(ctx, c, pay.URL, o.key, o.body, killOpTimeout, &stats)
							if err != nil {
								errs <- err
								return
							}
							o.seen = append(o.seen, res.Body)
						}
						done.Add(1)
					}
				}()
			}
			clientsDone := make(chan struct{})
			go func() { wg.Wait(); close(clientsDone) }()

			kills, inCalls := 0, 0
			for kills < cardKills {
				// Spread the kills over the run: the k-th once k/(cardKills+2) of the
				// operations are done, at a moment the processor is making a charge
				// for payments (within a bound: past it, the kill lands anywhere).
				threshold := int64((kills + 1) * cardOps / (cardKills + 2))
				waitUntil(clientsDone, 30*time.Second, func() bool { return done.Load() >= threshold })
				during := waitUntil(clientsDone, 5*time.Second, func() bool { return proc.callsInFlight() > 0 })
				pay.kill()
				kills++
				if during {
					inCalls++
				}
				if err := pay.relaunch(); err != nil {
					t.Fatalf("restart after kill %d: %v", kills, err)
				}
			}
			<-clientsDone
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if t.Failed() {
				t.FailNow()
			}
			t.Logf("%d operations, %d kills (%d while payments waited on the processor); retried: %v", len(ops), kills, inCalls, &stats)
			if inCalls < cardKillsInCalls {
				t.Errorf("only %d of %d kills landed during a processor call, want at least %d", inCalls, kills, cardKillsInCalls)
			}
			wantEachCardChargedOnce(t, c, pay, proc, ops)
		})
	}
}

// waitUntil polls cond until it holds (true), or until stop is closed or d passes
// (false).
func waitUntil(stop <-chan struct{}, d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		select {
		case <-stop:
			return false
		default:
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// wantEachCardChargedOnce fails unless the processor holds exactly one charge per
// operation (by amount), payments holds exactly one succeeded charge per operation
// carrying that processor charge, and every 201 of an operation is that charge.
func wantEachCardChargedOnce(t *testing.T, c *client, pay *server, proc *cardProcessor, ops []*cardOp) {
	t.Helper()
	byAmount := map[int64][]processorChargeJSON{}
	pchs := proc.charges(t)
	for _, p := range pchs {
		byAmount[p.Amount] = append(byAmount[p.Amount], p)
	}
	var twice []string
	for _, o := range ops {
		if n := len(byAmount[int64(o.amount)]); n > 1 {
			var keys []string
			for _, p := range byAmount[int64(o.amount)] {
				keys = append(keys, p.ID+" (key "+p.IdempotencyKey[:min(12, len(p.IdempotencyKey))]+"…)")
			}
			twice = append(twice, fmt.Sprintf("amount %d charged %d times: %s", o.amount, n, strings.Join(keys, ", ")))
		}
	}
	sort.Strings(twice)
	if len(pchs) != len(ops) {
		t.Errorf("the processor holds %d charges, want %d (one per operation); cards charged more than once:\n  %s",
			len(pchs), len(ops), strings.Join(twice, "\n  "))
	}

	want := map[string]string{} // key → the charge id its client was answered
	for i, o := range ops {
		for j, b := range o.seen {
			if string(b) != string(o.seen[0]) {
				t.Errorf("operation %d: 201 #%d differs from the first:\n got %s\nwant %s", i, j+1, b, o.seen[0])
			}
		}
		want[o.key] = (&response{Body: o.seen[0]}).id(t)
	}
	wantChargesExactly(t, c, pay, want, "payments after the kills")
	wantCardsChargedAtMostOnce(t, c, pay, proc, ops)
}

// Parameters of the tests whose clients give up.
const (
	giveUpOps = 8 // operations, each sent once, concurrently
	// leaseFlag and completerFlag are the payments process's lease and completer
	// interval: a charge whose client gave up is finished after about their sum.
	leaseFlag, completerFlag = "1s", "500ms"
	// finishBound bounds the wait for the completer: the lease, the interval, and the
	// processor calls and restarts of a loaded machine.
	finishBound = 30 * time.Second
)

// TestChargesWhoseClientsGaveUpAreFinishedByTheCompleter kills the payments process
// while its clients' charges wait on the processor; the clients never retry. After
// the lease and the completer's interval every card the processor charged has its
// succeeded charge in payments, every charge that was recorded pending is finished,
// and no card is charged twice.
func TestChargesWhoseClientsGaveUpAreFinishedByTheCompleter(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			proc := startCardProcessor(t, "--latency", "300ms", "--lost-reply-rate", "0.2", "--fail-rate", "0.1")
			pay := startServer(t, append(storeFlags(t, kind), "--processor-url", proc.URL(),
				"--lock-timeout", leaseFlag, "--completer-interval", completerFlag)...)
			c := newClient()
			c.http.Transport.(*http.Transport).DisableKeepAlives = true
			ops := make([]*cardOp, giveUpOps)
			answers := make([]<-chan answer, giveUpOps)
			for i := range ops {
				ops[i] = newCardOp(5000 + i)
				answers[i] = postInBackground(c, pay.URL(), ops[i].key, ops[i].body)
			}
			waitFor(t, 10*time.Second, "the processor to be charging for payments", func() (bool, string) {
				n := proc.callsInFlight()
				return n >= 2, fmt.Sprintf("%d calls in flight", n)
			})
			pay.kill()
			gaveUp := 0
			for i, a := range answers {
				switch got := <-a; {
				case got.err != nil:
					gaveUp++ // the client gives up for good
				case got.res.Status == http.StatusCreated:
					ops[i].seen = [][]byte{got.res.Body}
				default:
					t.Fatalf("operation %d before the kill: %s", i, got.res)
				}
			}
			if err := pay.relaunch(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			waitFor(t, finishBound, "the completer to finish every pending charge", func() (bool, string) {
				pending := 0
				list := c.listCharges(t, pay.URL())
				for _, ch := range list {
					if ch["status"] != "succeeded" {
						pending++
					}
				}
				n := len(proc.charges(t))
				return pending == 0 && n == len(list), fmt.Sprintf("%d charges in payments, %d not succeeded; %d at the processor", len(list), pending, n)
			})
			t.Logf("%d of %d clients gave up when the process was killed; all finished %v after the restart (lease %s, completer every %s)",
				gaveUp, len(ops), time.Since(start).Round(time.Millisecond), leaseFlag, completerFlag)
			if gaveUp == 0 {
				t.Fatal("no client gave up: the kill hit no charge")
			}
			wantCardsChargedAtMostOnce(t, c, pay, proc, ops)
		})
	}
}

// TestSurvivorFinishesTheChargesOfAProcessKilledMidStep runs two payments processes on
// one store and kills the one whose charges wait on the processor: one client gives up,
// the other retries at the survivor. The survivor's completer finishes the first, the
// retry the second, and the processor makes each charge once.
func TestSurvivorFinishesTheChargesOfAProcessKilledMidStep(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			proc := startCardProcessor(t, "--latency", "1s")
			servers := startServers(t, 2, "--store", newStore(t, kind), "--processor-url", proc.URL(),
				"--lock-timeout", leaseFlag, "--completer-interval", completerFlag)
			c := newClient()
			gaveUp, retried := newCardOp(2000), newCardOp(3000)
			a1 := postInBackground(c, servers[0].URL(), gaveUp.key, gaveUp.body)
			a2 := postInBackground(c, servers[0].URL(), retried.key, retried.body)
			waitFor(t, 10*time.Second, "both charges to be at the processor", func() (bool, string) {
				n := proc.callsInFlight()
				return n == 2, fmt.Sprintf("%d calls in flight", n)
			})
			servers[0].kill()
			for _, a := range []<-chan answer{a1, a2} {
				if got := <-a; got.err == nil {
					t.Fatalf("the killed process answered: %s", got.res)
				}
			}

			res, err := retryUntilCreated(context.Background(), c, servers[1].URL(), retried.key, retried.body, finishBound)
			if err != nil {
				t.Fatal(err)
			}
			retried.seen = [][]byte{res.Body}
			waitFor(t, finishBound, "the survivor's completer to finish the charge whose client gave up", func() (bool, string) {
				list := c.listCharges(t, servers[1].URL())
				for _, ch := range list {
					if ch["amount"] == float64(gaveUp.amount) {
						return ch["status"] == "succeeded", fmt.Sprintf("charge %v is %v", ch["id"], ch["status"])
					}
				}
				return false, fmt.Sprintf("%d charges, none of %d", len(list), gaveUp.amount)
			})
			// The client that gave up comes back at last: its charge, finished.
			late := c.postCharge(t, servers[1].URL(), gaveUp.key, gaveUp.body)
			want201(t, "the late retry", late)
			if !late.replayed() {
				t.Fatalf("the late retry executed the charge again: %s", late)
			}
			gaveUp.seen = [][]byte{late.Body}
			wantCardsChargedAtMostOnce(t, c, servers[1], proc, []*cardOp{gaveUp, retried})
			if n := len(proc.charges(t)); n != 2 {
				t.Fatalf("the processor holds %d charges, want 2", n)
			}
		})
	}
}

// wantCardsChargedAtMostOnce fails unless every charge in payments succeeded and
// carries a processor charge of its amount that no other charge carries, every
// processor charge belongs to one of them, no operation was charged twice, and an
// operation that got a 201 got its charge.
func wantCardsChargedAtMostOnce(t *testing.T, c *client, pay *server, proc *cardProcessor, ops []*cardOp) {
	t.Helper()
	pchs := proc.charges(t)
	byID := map[string]processorChargeJSON{}
	perAmount := map[int64]int{}
	for _, p := range pchs {
		byID[p.ID] = p
		perAmount[p.Amount]++
	}
	for _, o := range ops {
		if n := perAmount[int64(o.amount)]; n > 1 {
			t.Errorf("the card of operation %d (key %s) was charged %d times", o.amount, o.key, n)
		}
	}
	byKey := map[string]map[string]any{}
	carried := map[string]string{}
	list := c.listCharges(t, pay.URL())
	for _, ch := range list {
		id, _ := ch["id"].(string)
		pch, _ := ch["processor_charge_id"].(string)
		amount, _ := ch["amount"].(float64)
		key, _ := ch["idempotency_key"].(string)
		byKey[key] = ch
		switch p, ok := byID[pch]; {
		case ch["status"] != "succeeded":
			t.Errorf("charge %s is %v, want succeeded", id, ch["status"])
		case !ok:
			t.Errorf("charge %s carries processor charge %q, which the processor does not hold", id, pch)
		case p.Amount != int64(amount):
			t.Errorf("charge %s of %v carries processor charge %s of %d", id, amount, pch, p.Amount)
		case carried[pch] != "":
			t.Errorf("charges %s and %s carry the same processor charge %s", carried[pch], id, pch)
		}
		carried[pch] = id
	}
	if len(list) != len(pchs) {
		t.Errorf("payments holds %d charges, the processor %d: every card charged needs its charge", len(list), len(pchs))
	}
	for _, o := range ops {
		if len(o.seen) == 0 {
			continue
		}
		got := (&response{Body: o.seen[0]}).id(t)
		if ch := byKey[o.key]; ch == nil || ch["id"] != got {
			t.Errorf("operation %d was answered charge %s, but payments holds %v for its key", o.amount, got, ch)
		}
	}
}

// TestUnknownPolicyAnswersOutcomeUnknownUntilAnOperatorResolves runs charges under
// --charge-on-lapse unknown (a processor that cannot deduplicate) and kills the process
// while two charges wait on it. After the lease every retry of either gets the same
// 500 outcome_unknown, never a second execution, until `idem keys resolve`: released,
// the next retry charges; completed with a response, the next retry gets that response.
func TestUnknownPolicyAnswersOutcomeUnknownUntilAnOperatorResolves(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			store := newStore(t, kind)
			pay := startServer(t, "--store", store, "--processor-latency", "3s", "--lock-timeout", leaseFlag, "--charge-on-lapse", "unknown")
			c := newClient()
			released, completed := newCardOp(4000), newCardOp(4100)
			a1 := postInBackground(c, pay.URL(), released.key, released.body)
			a2 := postInBackground(c, pay.URL(), completed.key, completed.body)
			for _, o := range []*cardOp{released, completed} {
				if kind == storeSQLite {
					waitInFlight(t, strings.TrimPrefix(store, "sqlite:"), o.key)
				} else {
					waitInFlightPG(t, store, o.key)
				}
			}
			pay.kill()
			for _, a := range []<-chan answer{a1, a2} {
				if got := <-a; got.err == nil {
					t.Fatalf("the killed process answered: %s", got.res)
				}
			}
			pay.restart()

			for _, o := range []*cardOp{released, completed} {
				// Until the lease lapses the key is in progress; then outcome_unknown.
				var first *response
				waitFor(t, finishBound, "the retry to meet the lapsed lease", func() (bool, string) {
					first = c.postCharge(t, pay.URL(), o.key, o.body)
					return first.Status != http.StatusConflict, first.String()
				})
				wantError(t, "the retry after the lease", first, http.StatusInternalServerError, "outcome_unknown")
				for i := range 2 {
					again := c.postCharge(t, pay.URL(), o.key, o.body)
					if again.Status != first.Status || string(again.Body) != string(first.Body) {
						t.Fatalf("retry %d: %s, want the same as the first: %s", i+2, again, first)
					}
				}
			}
			if n := len(c.listCharges(t, pay.URL())); n != 0 {
				t.Fatalf("outcome_unknown keys charged: %d charges", n)
			}

			// The operator finds out at the processor, then resolves each key.
			mustRunIdem(t, "keys", "resolve", "--store", store, "--token", c.token, "--key", released.key, "--release")
			declined := `{"error":{"type":"card_error","code":"card_declined","message":"Declined at the processor (resolved by an operator)."}}`
			mustRunIdem(t, "keys", "resolve", "--store", store, "--token", c.token, "--key", completed.key, "--status", "402", "--body", declined)

			charged := c.postCharge(t, pay.URL(), released.key, released.body)
			want201(t, "the retry of the released key", charged)
			if charged.replayed() {
				t.Fatalf("the released key was replayed, not executed: %s", charged)
			}
			wantReplayOf(t, "the next retry of the released key", charged, c.postCharge(t, pay.URL(), released.key, released.body), released.key)
			for range 2 {
				got := c.postCharge(t, pay.URL(), completed.key, completed.body)
				if got.Status != http.StatusPaymentRequired || string(got.Body) != declined || !got.replayed() {
					t.Fatalf("the retry of the key resolved as 402: %s, want the operator's 402 replayed", got)
				}
			}
			wantChargesExactly(t, c, pay, map[string]string{released.key: charged.id(t)}, "after the resolutions")
		})
	}
}
