package amqpconsume_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/consume/amqpconsume"
	"github.com/idem-go/idem/consume/internal/consumetest"
	"github.com/idem-go/idem/internal/secret"
	"github.com/idem-go/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	consumetest.Main(m, consumetest.Children{SQLite: consumer[*sql.Tx], Postgres: consumer[pgx.Tx]})
}

// dial connects to the test RabbitMQ server; the connection closes when t ends.
func dial(t testing.TB) *amqp.Connection {
	t.Helper()
	url := testenv.AMQPURL(t)
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ at %s refused the connection: %v", secret.RedactURL(url), secret.RedactURLError(err))
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// channel opens a channel on conn.
func channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// newQueue declares a queue private to t, deleted when t ends, and returns its name.
func newQueue(t testing.TB, conn *amqp.Connection) string {
	t.Helper()
	name := testenv.Name("idemtest.")
	if _, err := channel(t, conn).QueueDeclare(name, false, false, false, false, nil); err != nil {
		t.Fatalf("declaring queue %s: %v", name, err)
	}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(name, false, false, false)
		}
		if err != nil {
			t.Errorf("deleting queue %s: %v", name, err)
		}
	})
	return name
}

// publish publishes the messages to queue and waits until the broker confirms them.
func publish(t testing.TB, conn *amqp.Connection, queue string, msgs ...amqp.Publishing) {
	t.Helper()
	ch := channel(t, conn)
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		var err error
		if confirms[i], err = ch.PublishWithDeferredConfirmWithContext(t.Context(), "", queue, true, false, m); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range confirms {
		if ok, err := c.WaitContext(t.Context()); !ok || err != nil {
			t.Fatalf("message %d not confirmed: %v", i, err)
		}
	}
}

// ready returns how many messages of queue wait for delivery (not those delivered and
// unacknowledged).
func ready(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch := channel(t, conn)
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting queue %s: %v", queue, err)
	}
	return q.Messages
}

// The behaviour of Handle against a real RabbitMQ server, each case with its own
// queue and a fresh SQLite store.

// consumerTag is the tag of the behaviour tests' consumers.
const consumerTag = "billing"

type bundle struct {
	*consumetest.Fixture
	t          *testing.T
	conn       *amqp.Connection
	queue      string
	ch         *amqp.Channel // the consumer's
	deliveries <-chan amqp.Delivery
}

func setup(t *testing.T) *bundle {
	t.Helper()
	conn := dial(t)
	b := &bundle{Fixture: consumetest.NewFixture(t, idem.GuardConfig{}), t: t, conn: conn, queue: newQueue(t, conn)}
	b.ch = channel(t, conn)
	if err := b.ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	var err error
	if b.deliveries, err = b.ch.Consume(b.queue, consumerTag, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	return b
}

// handler returns a Handler of the fixture's Processor whose effect writes an invoice
// of the delivery's body.
func (b *bundle) handler(cfg amqpconsume.Config) *amqpconsume.Handler[*sql.Tx] {
	if cfg.Scope == "" {
		cfg.Scope = b.queue
	}
	return amqpconsume.New(b.Processor, cfg, func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
		return b.Invoice(ctx, tx, d.Body)
	})
}

func (b *bundle) publish(msgs ...amqp.Publishing) {
	b.t.Helper()
	publish(b.t, b.conn, b.queue, msgs...)
}

// next returns the next delivery, waiting up to 10 s for it.
func (b *bundle) next() amqp.Delivery {
	b.t.Helper()
	select {
	case d := <-b.deliveries:
		return d
	case <-time.After(10 * time.Second):
		b.t.Fatal("no delivery within 10s")
	}
	panic("unreachable")
}

// settledWith closes the consumer's channel, so that the broker has processed its
// acknowledgements and requeued what it did not acknowledge, then checks that the
// queue is empty and that the effects wrote the invoices they should have.
func (b *bundle) settledWith(invoices int) {
	b.t.Helper()
	if err := b.ch.Close(); err != nil {
		b.t.Fatal(err)
	}
	if n := ready(b.t, b.conn, b.queue); n != 0 {
		b.t.Fatalf("%d messages left in the queue, want none", n)
	}
	b.WantInvoices(invoices)
}

func TestRedeliveryOfAProcessedMessageIsAckedWithoutEffect(t *testing.T) {
	b := setup(t)
	h := b.handler(amqpconsume.Config{})
	b.publish(amqp.Publishing{MessageId: "order-1-created", Body: []byte(`{"order":1}`)})

	// The first delivery commits, but its acknowledgement never reaches the broker:
	// the broker delivers the message again.
	first := b.next()
	consumetest.WantAction(t, h.Process(t.Context(), first), consume.Ack, false)
	if err := first.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	again := b.next()
	if !again.Redelivered {
		t.Fatal("the second delivery is not marked redelivered")
	}
	consumetest.WantAction(t, h.Handle(t.Context(), again), consume.Ack, true)
	b.settledWith(1)
}

func TestMessageInFlightElsewhereIsHeldThenRequeued(t *testing.T) {
	b := setup(t)
	h := b.handler(amqpconsume.Config{})
	body := []byte(`{"order":2}`)
	b.publish(amqp.Publishing{MessageId: "order-2-created", Body: body})
	// Another consumer holds the message, its lease live.
	release := b.Hold(b.queue, "order-2-created", body)

	res := h.Handle(t.Context(), b.next())
	consumetest.WantAction(t, res, consume.Nak, false)
	if res.Delay != idem.DefaultRetryAfter || !errors.Is(res.Err, idem.ErrKeyInProgress) {
		t.Fatalf("Nak after %v (%v), want after the guard's RetryAfter, in progress", res.Delay, res.Err)
	}
	// The other consumer gives up its claim; the delivery comes back after the delay
	// and runs the effect.
	release()
	again := b.next()
	if !again.Redelivered {
		t.Fatal("the second delivery is not marked redelivered")
	}
	consumetest.WantAction(t, h.Handle(t.Context(), again), consume.Ack, false)
	b.settledWith(1)
}

func TestSameMessageIDWithAnotherBodyIsRejected(t *testing.T) {
	b := setup(t)
	h := b.handler(amqpconsume.Config{})
	b.publish(amqp.Publishing{MessageId: "evt-3", Body: []byte(`{"order":3,"amount":2000}`)},
		amqp.Publishing{MessageId: "evt-3", Body: []byte(`{"order":3,"amount":9999}`)})

	consumetest.WantAction(t, h.Handle(t.Context(), b.next()), consume.Ack, false)
	res := h.Handle(t.Context(), b.next())
	consumetest.WantAction(t, res, consume.Term, false)
	if !errors.Is(res.Err, consume.ErrIDReused) {
		t.Fatalf("Err = %v, want ErrIDReused", res.Err)
	}
	b.settledWith(1) // rejected: not requeued
}

func TestIDFromAHeader(t *testing.T) {
	b := setup(t)
	h := b.handler(amqpconsume.Config{KeyHeader: "Event-Id"})
	evt := amqp.Publishing{Headers: amqp.Table{"Event-Id": "evt-4"}, Body: []byte(`{"order":4}`)}
	b.publish(evt, evt, amqp.Publishing{MessageId: "has-a-property-but-no-header", Body: []byte("x")})

	consumetest.WantAction(t, h.Handle(t.Context(), b.next()), consume.Ack, false)
	consumetest.WantAction(t, h.Handle(t.Context(), b.next()), consume.Ack, true)
	res := h.Handle(t.Context(), b.next())
	consumetest.WantAction(t, res, consume.Term, false)
	if !errors.Is(res.Err, consume.ErrNoID) {
		t.Fatalf("Err = %v, want ErrNoID", res.Err)
	}
	b.settledWith(1)
}

func TestMessageWithoutMessageIDIsRejected(t *testing.T) {
	b := setup(t)
	b.publish(amqp.Publishing{Body: []byte(`{"order":5}`)})
	res := b.handler(amqpconsume.Config{}).Handle(t.Context(), b.next())
	consumetest.WantAction(t, res, consume.Term, false)
	if !errors.Is(res.Err, consume.ErrNoID) {
		t.Fatalf("Err = %v, want ErrNoID", res.Err)
	}
	b.settledWith(0)
}

func TestRunHandlesAQueueUntilItsConsumerIsCancelled(t *testing.T) {
	b := setup(t)
	const n = 20
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: consumetest.ID(i), Body: consumetest.Payload(i)}
	}
	// Each message twice: the second of each is a repeat.
	b.publish(append(msgs, msgs...)...)
	h := b.handler(amqpconsume.Config{})
	done := make(chan error, 1)
	go func() { done <- h.Run(t.Context(), b.deliveries) }()

	// Poll the broker's count until the queue is empty.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ready(t, b.conn, b.queue) != 0 {
		select {
		case <-deadline:
			t.Fatal("the queue was not consumed within 10s")
		case <-tick.C:
		}
	}
	if err := b.ch.Cancel(consumerTag, false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil once its deliveries close", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its consumer's cancellation")
	}
	b.settledWith(n)
}

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	defer func() {
		if p := recover(); p != "amqpconsume: Config.Scope is required" {
			t.Fatalf("panic = %v", p)
		}
	}()
	amqpconsume.New(&consume.Processor[*sql.Tx]{}, amqpconsume.Config{}, func(context.Context, *sql.Tx, amqp.Delivery) error { return nil })
}

// The crash proof (issue 15 item 2): 200 messages, consumer processes killed with
// SIGKILL inside the effect's transaction, between the commit and the
// acknowledgement, and wherever they are, the broker requeueing what a dead
// connection held.

// amqpBroker is the kill tests' broker: a private queue.
type amqpBroker struct {
	conn  *amqp.Connection
	queue string
}

// The environment of the kill tests' consumer processes.
const (
	envURL   = "IDEM_KILLTEST_AMQP_URL"
	envQueue = "IDEM_KILLTEST_AMQP_QUEUE"
)

func (b *amqpBroker) Prepare(t *testing.T, n int) []string {
	b.conn = dial(t)
	b.queue = newQueue(t, b.conn)
	msgs := make([]amqp.Publishing, n)
	for i := range msgs {
		msgs[i] = amqp.Publishing{MessageId: consumetest.ID(i), Body: consumetest.Payload(i)}
	}
	publish(t, b.conn, b.queue, msgs...)
	return []string{envURL + "=" + testenv.AMQPURL(t), envQueue + "=" + b.queue}
}

// Outstanding counts the messages ready in the queue; those a live consumer holds
// unacknowledged are not counted, but go back to the queue when it stops.
func (b *amqpBroker) Outstanding(t *testing.T) int { return ready(t, b.conn, b.queue) }

// consumer is the kill tests' consumer process: it handles the queue's deliveries one
// by one until the parent stops it.
func consumer[Tx any](ctx context.Context, c *consumetest.Child[Tx]) error {
	conn, err := amqp.Dial(os.Getenv(envURL))
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(20, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(os.Getenv(envQueue), "killtest", false, false, false, false, nil)
	if err != nil {
		return err
	}
	go func() {
		<-c.Stopping()
		_ = ch.Cancel("killtest", false) // deliveries closes after those in flight
	}()
	var h *amqpconsume.Handler[Tx]
	if c.Processor != nil {
		h = amqpconsume.New(c.Processor, amqpconsume.Config{Scope: consumetest.Scope}, func(ctx context.Context, tx Tx, d amqp.Delivery) error {
			return c.Effect(ctx, tx, d.MessageId)
		})
	}
	for d := range deliveries {
		delivery := 1
		if d.Redelivered {
			delivery = 2
		}
		res := c.Handle(ctx, d.MessageId, delivery, func(ctx context.Context) consume.Result { return h.Process(ctx, d) })
		if err := amqpconsume.Settle(d, res); err != nil {
			return err
		}
	}
	return nil
}

func TestKilledConsumersApplyEveryMessageOnce(t *testing.T) {
	consumetest.ProveExactlyOnce(t, func() consumetest.Broker { return &amqpBroker{} })
}

func TestKilledConsumersWithoutTheHelperApplyMessagesTwice(t *testing.T) {
	consumetest.ProveDuplicatesWithoutHelper(t, func() consumetest.Broker { return &amqpBroker{} })
}
