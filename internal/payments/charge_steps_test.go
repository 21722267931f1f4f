package payments

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/processor"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/sqlite"
)

// cardProcessor is an in-process `idem processor` that fails every charge while down
// is set.
type cardProcessor struct {
	url  string
	down atomic.Bool
}

func newCardProcessor(t *testing.T) *cardProcessor {
	t.Helper()
	ctx := testenv.Context(t)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "processor.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	db := processor.SQLite(st)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	p := &cardProcessor{}
	rand := func() float64 {
		if p.down.Load() {
			return 0 // under FailRate: answered 503
		}
		return 0.9
	}
	srv := httptest.NewServer(processor.New(processor.Config{DB: db, FailRate: 0.5, Rand: rand, Logger: quietLogger()}).Handler())
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

// charges returns the processor's charges, newest first.
func (p *cardProcessor) charges(t *testing.T) []map[string]any {
	t.Helper()
	res, err := http.Get(p.url + "/v1/processor/charges")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var l struct {
		Data []map[string]any `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	return l.Data
}

// withProcessor makes the bundle charge through the processor at url, with two
// attempts per call (the tests' processor is down or up, never in between).
func withProcessor(url string) option {
	return func(c *Config) {
		c.ProcessorURL = url
		c.ProcessorClient = client.NewClient(&client.Transport{
			Base:        &http.Transport{ResponseHeaderTimeout: 5 * time.Second},
			MaxAttempts: 2,
			Logger:      quietLogger(),
		})
	}
}

func processorBundle(t *testing.T, newBundle func(...option) *bundle, p *cardProcessor) *bundle {
	return newBundle(withProcessor(p.url))
}

// record returns the idempotency record of the key of token.
func (b *bundle) record(token, key string) *idemstore.Record {
	b.t.Helper()
	rec, err := b.store.RecordGet(testenv.Context(b.t), &idemstore.GetParams{Scope: ScopeOfToken(token), Key: key})
	if err != nil {
		b.t.Fatalf("the record of %s: %v", key, err)
	}
	return rec
}

func TestChargeThroughProcessorCarriesItsChargeMadeUnderTheDerivedKey(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		p := newCardProcessor(t)
		b := processorBundle(t, newBundle, p)
		key := newKey()
		w := b.postCharge("tok_a", key, `{"amount": 2000, "currency": "usd"}`)
		wantStatus(t, w, http.StatusCreated)
		c := decode(t, w)
		pchs := p.charges(t)
		if len(pchs) != 1 {
			t.Fatalf("the processor holds %d charges, want 1", len(pchs))
		}
		if c["status"] != statusSucceeded || c["processor_charge_id"] != pchs[0]["id"] {
			t.Fatalf("charge %s, want succeeded with the processor's charge %v", w.Body, pchs[0]["id"])
		}
		// The processor's key is derived from the request and the step: the same for
		// every holder of the record, and for every record of this request.
		if got, want := pchs[0]["idempotency_key"], b.record("tok_a", key).DerivedKey(stepProcessor); got != want {
			t.Fatalf("the processor's charge has key %v, want %s", got, want)
		}
		again := b.postCharge("tok_a", key, `{"currency": "usd", "amount": 2000}`)
		wantStatus(t, again, http.StatusCreated)
		if again.Body.String() != w.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the retry: %s, want a replay of %s", again.Body, w.Body)
		}
		if n := len(p.charges(t)); n != 1 {
			t.Fatalf("the retry charged the card again: %d processor charges", n)
		}
	})
}

func TestPendingChargeIsNeverAnsweredAsSucceededAndItsRetryFinishesIt(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		p := newCardProcessor(t)
		b := processorBundle(t, newBundle, p)
		key := newKey()
		p.down.Store(true)
		w := b.postCharge("tok_a", key, `{"amount": 1500, "currency": "eur"}`)
		wantStatus(t, w, http.StatusServiceUnavailable)
		if code := apiErr(t, w)["code"]; code != "processor_unavailable" {
			t.Fatalf("code %v, want processor_unavailable", code)
		}
		list := b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"})
		var l listJSON
		_ = json.Unmarshal(list.Body.Bytes(), &l)
		if len(l.Data) != 1 || l.Data[0].Status != statusPending || l.Data[0].ProcessorChargeID != nil {
			t.Fatalf("charges %s, want one pending charge without a processor charge", list.Body)
		}
		pending := l.Data[0].ID
		// The record is kept, its lease ended at once: the retry resumes it.
		rec := b.record("tok_a", key)
		if rec.State != idemstore.StateInFlight || rec.RecoveryPoint != stepPending || rec.LeaseEnd.After(time.Now()) {
			t.Fatalf("record %s at %q, lease end %v: want in flight at %s, lease ended", rec.State, rec.RecoveryPoint, rec.LeaseEnd, stepPending)
		}

		p.down.Store(false)
		w = b.postCharge("tok_a", key, `{"amount": 1500, "currency": "eur"}`)
		wantStatus(t, w, http.StatusCreated)
		c := decode(t, w)
		if c["id"] != pending || c["status"] != statusSucceeded || c["processor_charge_id"] == nil {
			t.Fatalf("the retry: %s, want the pending charge %s succeeded", w.Body, pending)
		}
		if n := len(p.charges(t)); n != 1 {
			t.Fatalf("the processor holds %d charges, want 1", n)
		}
	})
}

func TestCompleterFinishesAChargeWhoseClientGaveUp(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		p := newCardProcessor(t)
		b := processorBundle(t, newBundle, p)
		key := newKey()
		p.down.Store(true)
		wantStatus(t, b.postCharge("tok_a", key, `{"amount": 700, "currency": "usd"}`), http.StatusServiceUnavailable)

		// The client never comes back; the processor does.
		p.down.Store(false)
		pass := idem.NewCompleter(b.srv.Guard(), idem.CompleterConfig{Logger: quietLogger()}).Pass(testenv.Context(t))
		if pass.Resumed != 1 || pass.Failed != 0 || pass.Err != nil {
			t.Fatalf("completer pass %+v, want one record resumed", pass)
		}
		list := b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"})
		var l listJSON
		_ = json.Unmarshal(list.Body.Bytes(), &l)
		pchs := p.charges(t)
		if len(l.Data) != 1 || l.Data[0].Status != statusSucceeded || len(pchs) != 1 || *l.Data[0].ProcessorChargeID != pchs[0]["id"] {
			t.Fatalf("charges %s, processor %v: want the charge succeeded with the processor's one charge", list.Body, pchs)
		}
		// A late retry gets the stored answer: the charge, byte for byte as GET renders it.
		w := b.postCharge("tok_a", key, `{"amount": 700, "currency": "usd"}`)
		wantStatus(t, w, http.StatusCreated)
		get := b.do(req{method: "GET", path: "/v1/charges/" + l.Data[0].ID, token: "tok_a"})
		if w.Header().Get("Idempotent-Replayed") != "true" || w.Body.String() != get.Body.String() || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("the late retry: %v %s, want a replay of %s", w.Header(), w.Body, get.Body)
		}
	})
}

// withStoreClock runs the middleware's leases and expiries with ttl on clock, and the
// API's objects on it too, so that a test can move past a key's TTL.
func withStoreClock(clock *testkit.Clock, ttl time.Duration) option {
	return func(c *Config) {
		c.TTL, c.Now = ttl, clock.Now
		c.Middleware = idem.New(idem.Config{Store: c.Store, Scope: scopeOf, TTL: ttl, Clock: clock.Now, Logger: c.Logger})
	}
}

// pendingPastItsTTL posts a charge while the processor is down, so that it stays
// pending, then moves the clock past its key's TTL and brings the processor back. It
// returns the key and the pending charge's id.
func pendingPastItsTTL(t *testing.T, b *bundle, p *cardProcessor, clock *testkit.Clock, body string) (key, pending string) {
	t.Helper()
	key = newKey()
	p.down.Store(true)
	w := b.postCharge("tok_a", key, body)
	wantStatus(t, w, http.StatusServiceUnavailable)
	list := b.do(req{method: "GET", path: "/v1/charges", token: "tok_a"})
	var l listJSON
	_ = json.Unmarshal(list.Body.Bytes(), &l)
	if len(l.Data) != 1 || l.Data[0].Status != statusPending {
		t.Fatalf("charges %s, want one pending charge", list.Body)
	}
	pending = l.Data[0].ID
	clock.Advance(2 * time.Minute)
	p.down.Store(false)
	return key, pending
}

// A charge left pending past its key's TTL is not dropped: the retry finds its record,
// resumes it under the same processor key and finishes that charge, charging once.
// (Before, the record expired: the retry claimed the key afresh, the backstop retired
// the pending charge's key, and a second charge was made.)
func TestAChargePendingPastItsTTLIsFinishedByTheRetryOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		p := newCardProcessor(t)
		clock := testkit.NewClock(time.Now().Truncate(time.Millisecond))
		b := newBundle(withProcessor(p.url), withStoreClock(clock, time.Minute))
		body := `{"amount": 777, "currency": "usd"}`
		key, pending := pendingPastItsTTL(t, b, p, clock, body)
		first := b.record("tok_a", key)

		w := b.postCharge("tok_a", key, body)
		wantStatus(t, w, http.StatusCreated)
		c := decode(t, w)
		pchs := p.charges(t)
		if c["id"] != pending || c["status"] != statusSucceeded || len(pchs) != 1 || c["processor_charge_id"] != pchs[0]["id"] {
			t.Fatalf("the retry past the TTL: %s, processor %v; want the pending charge %s succeeded with the one processor charge", w.Body, pchs, pending)
		}
		if pchs[0]["idempotency_key"] != first.DerivedKey(stepProcessor) {
			t.Fatalf("the processor's charge has key %v, want the one derived from the first record %s", pchs[0]["idempotency_key"], first.ID)
		}
		if n := b.count("charges"); n != 1 {
			t.Fatalf("payments holds %d charges, want 1", n)
		}
		// The record lives a TTL from its completion: replayed until then.
		clock.Advance(time.Minute - time.Second)
		again := b.postCharge("tok_a", key, body)
		if again.Body.String() != w.Body.String() || again.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("a retry a moment before a TTL from the completion: %s, want the replay of %s", again.Body, w.Body)
		}
	})
}

// A pending charge's key is never retired by the backstop, however old: when an
// operator abandoned its record (idem keys delete --abandon), the key's next request
// adopts and finishes the pending charge rather than recording a second one.
func TestAPendingChargeWhoseRecordWasAbandonedIsAdoptedNotChargedTwice(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		p := newCardProcessor(t)
		clock := testkit.NewClock(time.Now().Truncate(time.Millisecond))
		b := newBundle(withProcessor(p.url), withStoreClock(clock, time.Minute))
		body := `{"amount": 778, "currency": "usd"}`
		key, pending := pendingPastItsTTL(t, b, p, clock, body)
		err := b.store.(admin.Store).RecordDelete(testenv.Context(t), &admin.RecordDeleteParams{
			Scope: ScopeOfToken("tok_a"), Key: key, Abandon: true, Now: clock.Now()})
		if err != nil {
			t.Fatal(err)
		}
		w := b.postCharge("tok_a", key, body)
		wantStatus(t, w, http.StatusCreated)
		if c := decode(t, w); c["id"] != pending || c["status"] != statusSucceeded {
			t.Fatalf("the request after the abandonment: %s, want the pending charge %s adopted and succeeded", w.Body, pending)
		}
		if n, pchs := b.count("charges"), len(p.charges(t)); n != 1 || pchs != 1 {
			t.Fatalf("payments holds %d charges and the processor %d, want 1 each", n, pchs)
		}
	})
}

func TestProcessorRefusalFailsTheChargeWith402(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		var calls atomic.Int32
		refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusPaymentRequired)
			_, _ = w.Write([]byte(`{"error": {"type": "card_error", "code": "card_declined"}}`))
		}))
		t.Cleanup(refusing.Close)
		b := newBundle(withProcessor(refusing.URL))
		key := newKey()
		w := b.postCharge("tok_a", key, `{"amount": 900, "currency": "usd"}`)
		wantStatus(t, w, http.StatusPaymentRequired)
		e := apiErr(t, w)
		if e["type"] != "card_error" || e["code"] != "card_declined" || !strings.HasPrefix(e["charge"].(string), "ch_") {
			t.Fatalf("error %v, want a card_error card_declined naming the charge", e)
		}
		get := b.do(req{method: "GET", path: "/v1/charges/" + e["charge"].(string), token: "tok_a"})
		if decode(t, get)["status"] != statusFailed {
			t.Fatalf("the refused charge: %s, want failed", get.Body)
		}
		// The refusal is the operation's outcome: stored and replayed, never re-sent.
		again := b.postCharge("tok_a", key, `{"amount": 900, "currency": "usd"}`)
		if again.Code != http.StatusPaymentRequired || again.Body.String() != w.Body.String() || calls.Load() != 1 {
			t.Fatalf("the retry: %d %s after %d processor calls, want the stored 402 and 1 call", again.Code, again.Body, calls.Load())
		}
	})
}

func TestProcessorNeedsADBThatRunsSteps(t *testing.T) {
	t.Parallel()
	defer func() {
		if p := recover(); p == nil || !strings.Contains(p.(string), "NewSQLiteStoreDB") {
			t.Fatalf("New panicked with %v, want a message naming NewSQLiteStoreDB", p)
		}
	}()
	st, err := sqlite.Open(testenv.Context(t), filepath.Join(t.TempDir(), "idem.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	New(Config{Store: st, DB: NewSQLiteDB(st.DB(), st.InTx), ProcessorURL: "http://127.0.0.1:1", ProcessorClient: http.DefaultClient})
}
