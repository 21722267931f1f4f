// Package amqpconsume processes RabbitMQ (AMQP 0-9-1) deliveries at most once
// (BEE-8005, SPEC §16) with a [consume.Processor]: it keys each delivery by its
// message-id property, runs the effect in the SQL transaction that completes the
// message's record, and acknowledges the delivery only after that transaction
// committed. It uses the official client, github.com/rabbitmq/amqp091-go; consume
// with autoAck false.
//
// A consumer that crashes after its commit but before its Ack reaches the broker gets
// the message requeued as soon as its connection drops: the repeat is acknowledged
// without running the effect. One that crashes before its commit leaves nothing
// committed and its message's record in flight; the redelivery is nak'd with a delay
// (consume.Config.InProgressDelay) until the crashed claim's lease lapses, then runs
// the effect.
//
// What each consume.Action does: Ack is Delivery.Ack; Term is Delivery.Reject without
// requeue (the queue's dead-letter exchange gets it, if it has one); Nak is
// Delivery.Nack with requeue, after the Result's delay. AMQP 0-9-1 cannot requeue
// later, so a delayed Nak holds the delivery unacknowledged for the delay (it counts
// against the channel's prefetch meanwhile) and then requeues it; if the channel
// closes first, the broker requeues it then. A classic queue redelivers a message for
// ever; a quorum queue's x-delivery-limit bounds the redeliveries of a poison message.
package amqpconsume

import (
	"context"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/consume"
)

// Config configures a [Handler]. Scope is required.
type Config struct {
	// Scope names what processes the deliveries, such as the queue's name: the records
	// of one scope are never taken for another scope's. Two consumers with two effects
	// of the same messages (two queues bound to one exchange) need two scopes.
	// Required.
	Scope string

	// KeyHeader, when set, names the header (of Delivery.Headers, a string) holding
	// each message's id, in place of the message-id property. A delivery without an
	// id is rejected (consume.ErrNoID). Defaults to "": the message-id property.
	KeyHeader string

	// Logger receives a line for every acknowledgement that fails to reach the
	// broker. Defaults to [slog.Default].
	Logger *slog.Logger
}

// Handler processes deliveries with a Processor and an effect. It is safe for
// concurrent use; build one with [New].
type Handler[Tx any] struct {
	p      *consume.Processor[Tx]
	cfg    Config
	effect func(ctx context.Context, tx Tx, d amqp.Delivery) error
}

// New returns a Handler that processes each delivery with p, running effect in the
// transaction of p's InTx. It panics when an argument is missing (a programmer's
// mistake): "amqpconsume: Config.Scope is required".
func New[Tx any](p *consume.Processor[Tx], cfg Config, effect func(ctx context.Context, tx Tx, d amqp.Delivery) error) *Handler[Tx] {
	switch {
	case p == nil:
		panic("amqpconsume: the Processor is required")
	case cfg.Scope == "":
		panic("amqpconsume: Config.Scope is required")
	case effect == nil:
		panic("amqpconsume: the effect is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handler[Tx]{p: p, cfg: cfg, effect: effect}
}

// Process processes d at most once (consume.Processor.Process) and returns what to
// tell the broker, without telling it: for applications that acknowledge themselves.
// Most use Handle or Run.
func (h *Handler[Tx]) Process(ctx context.Context, d amqp.Delivery) consume.Result {
	m := consume.Message{Scope: h.cfg.Scope, ID: d.MessageId, Payload: d.Body}
	if h.cfg.KeyHeader != "" {
		m.ID = ""
		switch v := d.Headers[h.cfg.KeyHeader].(type) {
		case string:
			m.ID = v
		case []byte:
			m.ID = string(v)
		}
	}
	return h.p.Process(ctx, m, func(ctx context.Context, tx Tx) error { return h.effect(ctx, tx, d) })
}

// Handle processes d at most once and then acknowledges it as the result says
// ([Settle]): after the effect's transaction committed, or the repeat was recognised.
// An acknowledgement that fails is logged; the broker then requeues the delivery when
// the channel closes, and the repeat is acknowledged without effect.
func (h *Handler[Tx]) Handle(ctx context.Context, d amqp.Delivery) consume.Result {
	res := h.Process(ctx, d)
	if err := Settle(d, res); err != nil {
		h.cfg.Logger.WarnContext(ctx, "amqpconsume: acknowledging the delivery failed; the broker requeues it when the channel closes",
			slog.String("action", res.Action.String()), slog.Any("error", err))
	}
	return res
}

// Run handles every delivery of deliveries (a channel of Channel.Consume with autoAck
// false) with Handle, one at a time, until deliveries is closed (the consumer was
// cancelled, or the channel or connection closed: it returns nil) or ctx ends (it
// returns ctx's error; the deliveries not handled stay unacknowledged until the
// channel closes).
func (h *Handler[Tx]) Run(ctx context.Context, deliveries <-chan amqp.Delivery) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case d, ok := <-deliveries:
			if !ok {
				return nil
			}
			h.Handle(ctx, d)
		}
	}
}

// Settle tells the broker what res says about d: Ack, Reject without requeue (Term),
// or Nack with requeue (Nak) — after res.Delay, holding d unacknowledged meanwhile;
// the error of a delayed Nack is not reported (if the channel closed first, the
// broker requeued d then).
func Settle(d amqp.Delivery, res consume.Result) error {
	switch res.Action {
	case consume.Ack:
		return d.Ack(false)
	case consume.Term:
		return d.Reject(false)
	case consume.Nak:
		if res.Delay > 0 {
			time.AfterFunc(res.Delay, func() { _ = d.Nack(false, true) })
			return nil
		}
		return d.Nack(false, true)
	}
	return nil
}
