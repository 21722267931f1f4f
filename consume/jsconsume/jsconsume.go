// Package jsconsume processes NATS JetStream messages at most once (BEE-8005, SPEC
// §16) with a [consume.Processor]: it keys each message by its Nats-Msg-Id header (the
// id JetStream deduplicates publishes by; publish with jetstream.WithMsgID), runs the
// effect in the SQL transaction that completes the message's record, and acknowledges
// the message only after that transaction committed. It uses the official client,
// github.com/nats-io/nats.go/jetstream.
//
// A consumer that crashes after its commit but before its Ack reaches the server gets
// the message again after the consumer's AckWait: the repeat is acknowledged without
// running the effect. One that crashes before its commit leaves nothing committed and
// its message's record in flight; the redelivery is nak'd with a delay
// (consume.Config.InProgressDelay) until the crashed claim's lease lapses, then runs
// the effect. Set AckWait a little longer than the guard's Lease, so that a
// redelivery after a crash usually finds the lease lapsed, and MaxDeliver to -1 or
// high enough to outlast it: each Nak counts as a delivery.
//
// What each consume.Action does: Ack is Msg.Ack, Nak is Msg.NakWithDelay (Msg.Nak
// without delay), Term is Msg.Term.
package jsconsume

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/consume"
)

// Config configures a [Handler]. Scope is required.
type Config struct {
	// Scope names what processes the messages, such as "ORDERS/billing" (the stream
	// and the durable consumer): the records of one scope are never taken for another
	// scope's. Two consumers of one stream with two effects need two scopes, and a
	// consumer must keep its scope across restarts; an ephemeral consumer's name is
	// not a scope. Required.
	Scope string

	// KeyHeader is the header holding each message's id. A message without it is
	// terminated (consume.ErrNoID). Defaults to "Nats-Msg-Id" (jetstream.MsgIDHeader).
	KeyHeader string

	// Logger receives a line for every acknowledgement that fails to reach the
	// server. Defaults to [slog.Default].
	Logger *slog.Logger
}

// Handler processes JetStream messages with a Processor and an effect. It is safe for
// concurrent use; build one with [New].
type Handler[Tx any] struct {
	p      *consume.Processor[Tx]
	cfg    Config
	effect func(ctx context.Context, tx Tx, msg jetstream.Msg) error
}

// New returns a Handler that processes each message with p, running effect in the
// transaction of p's InTx. It panics when an argument is missing (a programmer's
// mistake): "jsconsume: Config.Scope is required".
func New[Tx any](p *consume.Processor[Tx], cfg Config, effect func(ctx context.Context, tx Tx, msg jetstream.Msg) error) *Handler[Tx] {
	switch {
	case p == nil:
		panic("jsconsume: the Processor is required")
	case cfg.Scope == "":
		panic("jsconsume: Config.Scope is required")
	case effect == nil:
		panic("jsconsume: the effect is required")
	}
	if cfg.KeyHeader == "" {
		cfg.KeyHeader = jetstream.MsgIDHeader
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Handler[Tx]{p: p, cfg: cfg, effect: effect}
}

// Process processes msg at most once (consume.Processor.Process) and returns what to
// tell the server, without telling it: for applications that acknowledge themselves.
// Most use Handle or MessageHandler.
func (h *Handler[Tx]) Process(ctx context.Context, msg jetstream.Msg) consume.Result {
	m := consume.Message{Scope: h.cfg.Scope, Payload: msg.Data()}
	if hdr := msg.Headers(); hdr != nil {
		m.ID = hdr.Get(h.cfg.KeyHeader)
	}
	return h.p.Process(ctx, m, func(ctx context.Context, tx Tx) error { return h.effect(ctx, tx, msg) })
}

// Handle processes msg at most once and then acknowledges it as the result says
// ([Settle]): after the effect's transaction committed, or the repeat was recognised.
// An acknowledgement that fails is logged; the server then redelivers the message
// after AckWait, and the repeat is acknowledged without effect.
func (h *Handler[Tx]) Handle(ctx context.Context, msg jetstream.Msg) consume.Result {
	res := h.Process(ctx, msg)
	if err := Settle(msg, res); err != nil {
		h.cfg.Logger.WarnContext(ctx, "jsconsume: acknowledging the message failed; the server redelivers it after AckWait",
			slog.String("action", res.Action.String()), slog.Any("error", err))
	}
	return res
}

// MessageHandler returns a function for jetstream.Consumer.Consume that handles each
// message with Handle under ctx. Cancelling ctx makes the message being processed
// (and every later one) Nak'd at once, for another consumer to take.
func (h *Handler[Tx]) MessageHandler(ctx context.Context) jetstream.MessageHandler {
	return func(msg jetstream.Msg) { h.Handle(ctx, msg) }
}

// Settle tells the server what res says about msg: Ack, NakWithDelay (Nak when the
// delay is 0) or Term.
func Settle(msg jetstream.Msg, res consume.Result) error {
	switch res.Action {
	case consume.Ack:
		return msg.Ack()
	case consume.Term:
		return msg.Term()
	case consume.Nak:
		if res.Delay > 0 {
			return msg.NakWithDelay(res.Delay)
		}
		return msg.Nak()
	}
	return nil
}
