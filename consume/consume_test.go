package consume_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/consume/internal/consumetest"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
)

// The behaviour of a Processor for each case of the package documentation, over a
// real SQLite store. The crash proofs against real brokers are in consume/jsconsume and
// consume/amqpconsume.

const (
	scope      = "orders.billing"
	retryDelay = 300 * time.Millisecond
	lease      = 10 * time.Second
)

type bundle struct {
	*consumetest.Fixture
	t     *testing.T
	clock *testkit.Clock
	p     *consume.Processor[*sql.Tx]
	logs  *testkit.Buffer
}

// setup returns a fresh SQLite store with an invoices table, and a Processor over it
// whose guard (gcfg, with the default lease unless set) runs on a clock the test
// moves and logs into the bundle's buffer.
func setup(t *testing.T, gcfg idem.GuardConfig) *bundle {
	t.Helper()
	b := &bundle{t: t, clock: testkit.NewClock(time.Now()), logs: &testkit.Buffer{}}
	logger := slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	gcfg.Clock, gcfg.Logger = b.clock.Now, logger
	if gcfg.Lease == 0 {
		gcfg.Lease = lease
	}
	b.Fixture = consumetest.NewFixture(t, gcfg)
	b.p = consume.New(consume.Config[*sql.Tx]{Guard: b.Guard, InTx: b.Store.InTx, RetryDelay: retryDelay, Logger: logger})
	return b
}

func msg(id, payload string) consume.Message {
	return consume.Message{Scope: scope, ID: id, Payload: []byte(payload)}
}

// invoice is the effect of the tests: an invoice of the message's payload.
func (b *bundle) invoice(m consume.Message) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error { return b.Invoice(ctx, tx, m.Payload) }
}

// process processes m with the invoice effect.
func (b *bundle) process(m consume.Message) consume.Result {
	b.t.Helper()
	return b.p.Process(b.t.Context(), m, b.invoice(m))
}

func wantResult(t *testing.T, got, want consume.Result) {
	t.Helper()
	if got.Action != want.Action || got.Delay != want.Delay || got.Replayed != want.Replayed {
		t.Fatalf("result = %v (delay %v, replayed %v, err %v), want %v (delay %v, replayed %v)",
			got.Action, got.Delay, got.Replayed, got.Err, want.Action, want.Delay, want.Replayed)
	}
}

func TestNewMessageRunsTheEffectOnceAndIsAcked(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	res := b.process(msg("m-1", `{"amount":2000}`))
	wantResult(t, res, consume.Result{Action: consume.Ack})
	if res.Err != nil {
		t.Fatalf("Err = %v on Ack", res.Err)
	}
	b.WantInvoices(1)
	rec, err := b.Store.RecordGet(t.Context(), &idemstore.GetParams{Scope: scope, Key: "m-1"})
	if err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("record = %+v, %v; want completed with the effect", rec, err)
	}
}

func TestRepeatOfAProcessedMessageIsAckedWithoutEffect(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	m := msg("m-1", `{"amount":2000}`)
	b.process(m)
	for range 3 {
		wantResult(t, b.process(m), consume.Result{Action: consume.Ack, Replayed: true})
	}
	// The payload is fingerprinted as JSON: a re-serialised repeat is the same message.
	wantResult(t, b.process(msg("m-1", `{ "amount": 2000 }`)), consume.Result{Action: consume.Ack, Replayed: true})
	b.WantInvoices(1)
}

func TestSameIDInAnotherScopeIsAnotherMessage(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	b.process(msg("m-1", "x"))
	other := consume.Message{Scope: "orders.email", ID: "m-1", Payload: []byte("x")}
	wantResult(t, b.p.Process(t.Context(), other, b.invoice(other)), consume.Result{Action: consume.Ack})
	b.WantInvoices(2)
}

func TestRepeatWhileInFlightIsNakedWithDelay(t *testing.T) {
	b := setup(t, idem.GuardConfig{RetryAfter: 700 * time.Millisecond})
	m := msg("m-1", "x")
	// Another consumer holds the message, its lease live.
	b.Hold(scope, m.ID, m.Payload)

	res := b.process(m)
	wantResult(t, res, consume.Result{Action: consume.Nak, Delay: 700 * time.Millisecond})
	if !errors.Is(res.Err, idem.ErrKeyInProgress) {
		t.Fatalf("Err = %v, want ErrKeyInProgress", res.Err)
	}
	b.WantInvoices(0)

	// Config.InProgressDelay overrides the guard's RetryAfter.
	p := consume.New(consume.Config[*sql.Tx]{Guard: b.Guard, InTx: b.Store.InTx, InProgressDelay: 5 * time.Second})
	wantResult(t, p.Process(t.Context(), m, b.invoice(m)), consume.Result{Action: consume.Nak, Delay: 5 * time.Second})
}

// A scope past its bound (SPEC §19) is naked with the bound's delay, nothing claimed.
func TestAScopePastItsBoundIsNakedWithItsDelay(t *testing.T) {
	b := setup(t, idem.GuardConfig{MaxStoredBytesPerScope: 1, QuotaWindow: time.Minute})
	wantResult(t, b.process(msg("m-1", "x")), consume.Result{Action: consume.Ack})
	res := b.process(msg("m-2", "y"))
	if res.Action != consume.Nak || res.Delay <= 0 || res.Delay > time.Minute || !errors.Is(res.Err, idem.ErrQuotaExceeded) {
		t.Fatalf("a message past the scope's stored bytes: %+v, want Nak with the rest of the window", res)
	}
	b.WantInvoices(1)
}

func TestMessageOfACrashedConsumerIsTakenOverWhenItsLeaseLapses(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	m := msg("m-1", "x")
	// A consumer claimed the message and died: its record stays in flight.
	b.Hold(scope, m.ID, m.Payload)
	wantResult(t, b.process(m), consume.Result{Action: consume.Nak, Delay: idem.DefaultRetryAfter})

	b.clock.Advance(lease + time.Second)
	wantResult(t, b.process(m), consume.Result{Action: consume.Ack})
	wantResult(t, b.process(m), consume.Result{Action: consume.Ack, Replayed: true})
	b.WantInvoices(1)
}

func TestSameIDWithAnotherPayloadIsTerminatedAndLogged(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	b.process(msg("secret-id-1", `{"amount":2000}`))
	res := b.process(msg("secret-id-1", `{"amount":9999}`))
	wantResult(t, res, consume.Result{Action: consume.Term})
	if !errors.Is(res.Err, consume.ErrIDReused) {
		t.Fatalf("Err = %v, want ErrIDReused", res.Err)
	}
	b.WantInvoices(1)
	logs := b.logs.String()
	if !strings.Contains(logs, "terminated") || !strings.Contains(logs, "id_hash=") {
		t.Fatalf("no error line with the id's hash for the terminated message:\n%s", logs)
	}
	if strings.Contains(logs, "secret-id-1") || strings.Contains(logs, "9999") {
		t.Fatalf("the logs show the message's id or payload:\n%s", logs)
	}
}

func TestEffectErrorNaksReleasesTheKeyAndCommitsNothing(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	m := msg("m-1", "x")
	boom := errors.New("downstream refused")
	res := b.p.Process(t.Context(), m, func(ctx context.Context, tx *sql.Tx) error {
		if err := b.invoice(m)(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	wantResult(t, res, consume.Result{Action: consume.Nak, Delay: retryDelay})
	if !errors.Is(res.Err, boom) {
		t.Fatalf("Err = %v, want the effect's", res.Err)
	}
	b.WantInvoices(0)
	// The redelivery runs the effect afresh.
	wantResult(t, b.process(m), consume.Result{Action: consume.Ack})
	b.WantInvoices(1)
}

func TestPermanentEffectErrorTerminatesTheMessage(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	m := msg("m-1", "not json")
	bad := errors.New("payload does not parse")
	res := b.p.Process(t.Context(), m, func(context.Context, *sql.Tx) error { return consume.Permanent(bad) })
	wantResult(t, res, consume.Result{Action: consume.Term})
	if !errors.Is(res.Err, bad) || !consume.IsPermanent(res.Err) {
		t.Fatalf("Err = %v, want the permanent error", res.Err)
	}
	// The key is released: were the message published again and fixed, it would run.
	wantResult(t, b.process(m), consume.Result{Action: consume.Ack})
}

func TestStoreOutageNaksWithoutRunningTheEffect(t *testing.T) {
	b := setup(t, idem.GuardConfig{StoreTimeout: 200 * time.Millisecond})
	// Another connection holds SQLite's write lock: the claim cannot be made in time.
	conn, err := b.Store.DB().Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(t.Context(), "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	m := msg("m-1", "x")
	ran := false
	res := b.p.Process(t.Context(), m, func(context.Context, *sql.Tx) error { ran = true; return nil })
	wantResult(t, res, consume.Result{Action: consume.Nak, Delay: retryDelay})
	if !errors.Is(res.Err, idem.ErrStoreUnavailable) || ran {
		t.Fatalf("Err = %v, effect ran %v; want ErrStoreUnavailable and no effect", res.Err, ran)
	}
	if _, err := conn.ExecContext(t.Context(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	wantResult(t, b.process(m), consume.Result{Action: consume.Ack})
}

func TestMessageWithoutAUsableIDIsTerminated(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	for _, tc := range []struct {
		id   string
		want error
	}{
		{"", consume.ErrNoID},
		{strings.Repeat("x", consume.MaxIDLength+1), consume.ErrIDTooLong},
	} {
		res := b.process(msg(tc.id, "x"))
		wantResult(t, res, consume.Result{Action: consume.Term})
		if !errors.Is(res.Err, tc.want) {
			t.Fatalf("id of %d bytes: Err = %v, want %v", len(tc.id), res.Err, tc.want)
		}
	}
	wantResult(t, b.process(msg(strings.Repeat("x", consume.MaxIDLength), "x")), consume.Result{Action: consume.Ack})
}

func TestCancelledContextNaksAtOnce(t *testing.T) {
	b := setup(t, idem.GuardConfig{})
	ctx, cancel := context.WithCancel(t.Context())
	m := msg("m-1", "x")
	res := b.p.Process(ctx, m, func(ctx context.Context, tx *sql.Tx) error {
		cancel() // the consumer shuts down while the effect runs
		return ctx.Err()
	})
	wantResult(t, res, consume.Result{Action: consume.Nak})
	if !errors.Is(res.Err, context.Canceled) {
		t.Fatalf("Err = %v, want context.Canceled", res.Err)
	}
	wantResult(t, b.process(m), consume.Result{Action: consume.Ack})
}

func TestProcessorRefusesAnIncompleteConfig(t *testing.T) {
	st := setup(t, idem.GuardConfig{})
	for name, f := range map[string]func(){
		"consume: Config.Guard is required": func() { consume.New(consume.Config[*sql.Tx]{InTx: st.Store.InTx}) },
		"consume: Config.InTx is required":  func() { consume.New(consume.Config[*sql.Tx]{Guard: st.Guard}) },
		"consume: Config.TTL": func() { // not longer than the lease: refused when built, not at the first message
			consume.New(consume.Config[*sql.Tx]{Guard: st.Guard, InTx: st.Store.InTx, TTL: time.Second})
		},
		"consume: Message.Scope is required": func() {
			st.p.Process(t.Context(), consume.Message{ID: "m-1"}, st.invoice(msg("m-1", "")))
		},
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.HasPrefix(p.(string), name) {
					t.Errorf("panic = %v, want %q", p, name)
				}
			}()
			f()
		}()
	}
}
