package jsconsume_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/consume/internal/consumetest"
	"github.com/idem-go/idem/consume/jsconsume"
	"github.com/idem-go/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	consumetest.Main(m, consumetest.Children{SQLite: consumer[*sql.Tx], Postgres: consumer[pgx.Tx]})
}

// connect connects to the test NATS server and checks that it has JetStream.
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := testenv.NATSURL(t)
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		testenv.Unavailable(t, "NATS at %s refused the connection: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(t.Context()); err != nil {
		testenv.Unavailable(t, "NATS at %s has no JetStream (start nats-server with -js): %v", url, err)
	}
	return nc, js
}

// newStream creates a stream private to t on one subject, deleted when t ends, and
// returns its name and subject.
func newStream(t testing.TB, js jetstream.JetStream) (name, subject string) {
	t.Helper()
	name = testenv.Name("IDEMTEST_")
	subject = "idemtest." + name
	_, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage,
	})
	if err != nil {
		t.Fatalf("creating stream %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Errorf("deleting stream %s: %v", name, err)
		}
	})
	return name, subject
}

// newConsumer creates the durable pull consumer "billing" of stream.
func newConsumer(t testing.TB, js jetstream.JetStream, stream string, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	cons, err := js.CreateOrUpdateConsumer(t.Context(), stream, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait, MaxDeliver: -1,
	})
	if err != nil {
		t.Fatalf("creating the consumer of %s: %v", stream, err)
	}
	return cons
}

// The behaviour of Handle against a real JetStream server, each case with its own
// stream and a fresh SQLite store.

type bundle struct {
	*consumetest.Fixture
	t    *testing.T
	js   jetstream.JetStream
	subj string
	cons jetstream.Consumer
}

func setup(t *testing.T) *bundle {
	t.Helper()
	_, js := connect(t)
	stream, subj := newStream(t, js)
	return &bundle{Fixture: consumetest.NewFixture(t, idem.GuardConfig{}), t: t, js: js, subj: subj,
		cons: newConsumer(t, js, stream, 30*time.Second)}
}

// handler returns a Handler of the fixture's Processor whose effect writes an invoice
// of the message's payload.
func (b *bundle) handler(cfg jsconsume.Config) *jsconsume.Handler[*sql.Tx] {
	if cfg.Scope == "" {
		cfg.Scope = "billing"
	}
	return jsconsume.New(b.Processor, cfg, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
		return b.Invoice(ctx, tx, msg.Data())
	})
}

// publish publishes payload with the headers hdr (name, value, ...).
func (b *bundle) publish(payload string, hdr ...string) {
	b.t.Helper()
	m := nats.NewMsg(b.subj)
	m.Data = []byte(payload)
	for i := 0; i+1 < len(hdr); i += 2 {
		m.Header.Set(hdr[i], hdr[i+1])
	}
	if _, err := b.js.PublishMsg(b.t.Context(), m); err != nil {
		b.t.Fatal(err)
	}
}

// next fetches the next delivery, waiting up to 10 s for it.
func (b *bundle) next() jetstream.Msg {
	b.t.Helper()
	msg, err := b.cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		b.t.Fatalf("no delivery: %v", err)
	}
	return msg
}

// redelivery fetches the next delivery, which must be a message's second.
func (b *bundle) redelivery() jetstream.Msg {
	b.t.Helper()
	msg := b.next()
	md, err := msg.Metadata()
	if err != nil {
		b.t.Fatal(err)
	}
	if md.NumDelivered != 2 {
		b.t.Fatalf("NumDelivered = %d, want the redelivery", md.NumDelivered)
	}
	return msg
}

// settledWith waits until the server holds nothing for the consumer (every message
// was acknowledged or terminated; acknowledgements are asynchronous), then checks that
// the effects wrote the invoices they should have.
func (b *bundle) settledWith(invoices int) {
	b.t.Helper()
	b.settled()
	b.WantInvoices(invoices)
}

// settled waits until the server holds nothing for the consumer. The test itself
// fetches every delivery, so a message delivered while only acknowledgements are
// outstanding is a redelivery of a settled message: a failure.
func (b *bundle) settled() {
	b.t.Helper()
	b.waitSettled(func(info *jetstream.ConsumerInfo) {
		if info.NumPending > 0 {
			// Undelivered messages: fetching one would take a first delivery.
			<-time.After(20 * time.Millisecond)
			return
		}
		if _, err := b.cons.Next(jetstream.FetchMaxWait(20 * time.Millisecond)); err == nil {
			b.t.Fatal("a message was delivered again after it was settled")
		}
	})
}

// waitSettled polls the consumer until it holds nothing, calling between each poll
// wait, which must take a moment (a fetch with a short wait, or a tick).
func (b *bundle) waitSettled(wait func(info *jetstream.ConsumerInfo)) {
	b.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := b.cons.Info(b.t.Context())
		if err != nil {
			b.t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("consumer not settled: %d pending, %d awaiting acknowledgement", info.NumPending, info.NumAckPending)
		}
		wait(info)
	}
}

func TestRedeliveryOfAProcessedMessageIsAckedWithoutEffect(t *testing.T) {
	b := setup(t)
	h := b.handler(jsconsume.Config{})
	b.publish(`{"order":1}`, jetstream.MsgIDHeader, "order-1-created")

	// The first delivery commits, but its acknowledgement never reaches the server: the
	// server delivers the message again (at once here, instead of after AckWait).
	first := b.next()
	consumetest.WantAction(t, h.Process(t.Context(), first), consume.Ack, false)
	if err := first.Nak(); err != nil {
		t.Fatal(err)
	}
	again := b.redelivery()
	consumetest.WantAction(t, h.Handle(t.Context(), again), consume.Ack, true)
	b.settledWith(1)
}

func TestMessageInFlightElsewhereIsNakedAndRedelivered(t *testing.T) {
	b := setup(t)
	h := b.handler(jsconsume.Config{})
	payload := `{"order":2}`
	b.publish(payload, jetstream.MsgIDHeader, "order-2-created")
	// Another consumer holds the message, its lease live.
	release := b.Hold("billing", "order-2-created", []byte(payload))

	res := h.Handle(t.Context(), b.next())
	consumetest.WantAction(t, res, consume.Nak, false)
	if res.Delay != idem.DefaultRetryAfter || !errors.Is(res.Err, idem.ErrKeyInProgress) {
		t.Fatalf("Nak after %v (%v), want after the guard's RetryAfter, in progress", res.Delay, res.Err)
	}
	// The other consumer gives up its claim; the redelivery runs the effect.
	release()
	again := b.redelivery()
	consumetest.WantAction(t, h.Handle(t.Context(), again), consume.Ack, false)
	b.settledWith(1)
}

func TestIDFromAnotherHeaderReusedWithAnotherPayloadIsTerminated(t *testing.T) {
	b := setup(t)
	// JetStream would drop a second publish with the same Nats-Msg-Id; an id of the
	// application's own header reaches the consumer twice.
	h := b.handler(jsconsume.Config{KeyHeader: "Event-Id"})
	b.publish(`{"order":3,"amount":2000}`, "Event-Id", "evt-3")
	b.publish(`{"order":3,"amount":9999}`, "Event-Id", "evt-3")

	consumetest.WantAction(t, h.Handle(t.Context(), b.next()), consume.Ack, false)
	res := h.Handle(t.Context(), b.next())
	consumetest.WantAction(t, res, consume.Term, false)
	if !errors.Is(res.Err, consume.ErrIDReused) {
		t.Fatalf("Err = %v, want ErrIDReused", res.Err)
	}
	b.settledWith(1) // terminated: not redelivered
}

func TestMessageWithoutIDIsTerminated(t *testing.T) {
	b := setup(t)
	h := b.handler(jsconsume.Config{})
	b.publish(`{"order":4}`)
	res := h.Handle(t.Context(), b.next())
	consumetest.WantAction(t, res, consume.Term, false)
	if !errors.Is(res.Err, consume.ErrNoID) {
		t.Fatalf("Err = %v, want ErrNoID", res.Err)
	}
	b.settledWith(0)
}

func TestEffectErrorIsNakedAndTheRedeliveryRunsIt(t *testing.T) {
	b := setup(t)
	fail := true
	h := jsconsume.New(b.Processor, jsconsume.Config{Scope: "billing"}, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
		if err := b.Invoice(ctx, tx, msg.Data()); err != nil {
			return err
		}
		if fail {
			fail = false
			return errors.New("the ledger is down")
		}
		return nil
	})
	b.publish(`{"order":5}`, jetstream.MsgIDHeader, "order-5-created")
	consumetest.WantAction(t, h.Handle(t.Context(), b.next()), consume.Nak, false)
	consumetest.WantAction(t, h.Handle(t.Context(), b.next()), consume.Ack, false)
	b.settledWith(1) // the failed attempt's write rolled back
}

func TestMessageHandlerConsumesAStream(t *testing.T) {
	b := setup(t)
	const n = 20
	for i := range n {
		b.publish(string(consumetest.Payload(i)), jetstream.MsgIDHeader, consumetest.ID(i))
	}
	cc, err := b.cons.Consume(b.handler(jsconsume.Config{}).MessageHandler(t.Context()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	// The running Consume takes every delivery: a fetch here would steal one.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	b.waitSettled(func(*jetstream.ConsumerInfo) { <-tick.C })
	b.WantInvoices(n)
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	defer func() {
		if p := recover(); p != "jsconsume: Config.Scope is required" {
			t.Fatalf("panic = %v", p)
		}
	}()
	jsconsume.New(&consume.Processor[*sql.Tx]{}, jsconsume.Config{}, func(context.Context, *sql.Tx, jetstream.Msg) error { return nil })
}

// The crash proof (issue 15 item 2): 200 messages, consumer processes killed with
// SIGKILL inside the effect's transaction, between the commit and the
// acknowledgement, and wherever they are, the server redelivering after AckWait.

// jsBroker is the kill tests' broker: a private stream with a durable consumer whose
// AckWait is shorter than the consumers' lease, so that redeliveries meet messages
// still in flight under a killed consumer's claim.
type jsBroker struct {
	js   jetstream.JetStream
	cons jetstream.Consumer
}

// The environment of the kill tests' consumer processes.
const (
	envURL      = "IDEM_KILLTEST_NATS_URL"
	envStream   = "IDEM_KILLTEST_NATS_STREAM"
	envConsumer = "IDEM_KILLTEST_NATS_CONSUMER"
)

func (b *jsBroker) Prepare(t *testing.T, n int) []string {
	_, b.js = connect(t)
	stream, subj := newStream(t, b.js)
	for i := range n {
		if _, err := b.js.Publish(t.Context(), subj, consumetest.Payload(i), jetstream.WithMsgID(consumetest.ID(i))); err != nil {
			t.Fatal(err)
		}
	}
	b.cons = newConsumer(t, b.js, stream, time.Second)
	return []string{envURL + "=" + testenv.NATSURL(t), envStream + "=" + stream, envConsumer + "=billing"}
}

func (b *jsBroker) Outstanding(t *testing.T) int {
	info, err := b.cons.Info(t.Context())
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return int(info.NumPending) + info.NumAckPending
}

// consumer is the kill tests' consumer process: it handles the stream's messages one by
// one until the parent stops it.
func consumer[Tx any](ctx context.Context, c *consumetest.Child[Tx]) error {
	nc, err := nats.Connect(os.Getenv(envURL))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, os.Getenv(envStream), os.Getenv(envConsumer))
	if err != nil {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(20), jetstream.WithMessagesErrOnMissingHeartbeat(false))
	if err != nil {
		return err
	}
	go func() {
		<-c.Stopping()
		it.Stop()
	}()
	var h *jsconsume.Handler[Tx]
	if c.Processor != nil {
		h = jsconsume.New(c.Processor, jsconsume.Config{Scope: consumetest.Scope}, func(ctx context.Context, tx Tx, msg jetstream.Msg) error {
			return c.Effect(ctx, tx, msg.Headers().Get(jetstream.MsgIDHeader))
		})
	}
	for {
		msg, err := it.Next()
		if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
			return nc.Flush()
		}
		if err != nil {
			return err
		}
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		res := c.Handle(ctx, msg.Headers().Get(jetstream.MsgIDHeader), int(md.NumDelivered),
			func(ctx context.Context) consume.Result { return h.Process(ctx, msg) })
		if err := jsconsume.Settle(msg, res); err != nil {
			return err
		}
	}
}

func TestKilledConsumersApplyEveryMessageOnce(t *testing.T) {
	consumetest.ProveExactlyOnce(t, func() consumetest.Broker { return &jsBroker{} })
}

func TestKilledConsumersWithoutTheHelperApplyMessagesTwice(t *testing.T) {
	consumetest.ProveDuplicatesWithoutHelper(t, func() consumetest.Broker { return &jsBroker{} })
}
