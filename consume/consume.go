// Package consume processes delivered messages at most once (BEE-8005, SPEC §16): a
// broker delivers at least once, so a consumer that crashes after its effects commit
// but before its acknowledgement reaches the broker gets the message again. A
// [Processor] keys each message by its id, runs its effects in the same SQL
// transaction as the idempotency record (SPEC §7), and says what to tell the broker
// only after that transaction committed: acknowledge a message processed now or
// before, redeliver one that could not be processed yet, or terminate one that never
// can be.
//
// The package knows no broker. consume/jsconsume (NATS JetStream) and
// consume/amqpconsume (RabbitMQ, AMQP 0-9-1) take a message's id, payload and
// acknowledgement from their broker's official client; another broker needs only the
// same few lines.
//
// What a delivery gets, by what the store holds for its (scope, id):
//
//	nothing, or a lapsed lease   the effect runs; Ack after its transaction commits
//	completed, same payload      Ack, Replayed: the effect ran before; nothing runs
//	completed, other payload     Term, ErrIDReused: the id is reused; logged
//	in flight (lease live)       Nak after InProgressDelay: another delivery runs it
//	store unavailable            Nak after RetryDelay: nothing ran
//	effect error                 Nak after RetryDelay: nothing committed, key released
//	effect error Permanent(err)  Term: nothing committed, key released; logged
//	no id, or an id too long     Term, ErrNoID or ErrIDTooLong; logged
//
// How often a message is redelivered before the broker gives up (a poison message) is
// the broker's setting: JetStream's MaxDeliver, a quorum queue's delivery-limit.
package consume

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/logsummary"
)

// DefaultRetryDelay is how long a message waits for redelivery after its effect failed
// or the store was unavailable ([Config.RetryDelay]).
const DefaultRetryDelay = time.Second

// MaxIDLength is the longest message id a Processor accepts, in bytes: the longest
// idempotency key (SPEC §3).
const MaxIDLength = 255

// Config configures a [Processor]. Guard and InTx are required; every other field has
// a default.
type Config[Tx any] struct {
	// Guard runs the state machine of SPEC §5 over a SQL store (SQLite or PostgreSQL):
	// its Lease bounds how long a crashed consumer's message waits before another
	// delivery takes it over, and its TTL how long a repeat is recognised, which must
	// be longer than the broker may redeliver a message. Required.
	Guard *idem.Guard

	// InTx is the store's SPEC §7 helper: store/sqlite's (*Store).InTx (Tx *sql.Tx) or
	// store/postgres's (*Store).InTx (Tx pgx.Tx), of the store the Guard uses. The
	// effect's writes and the record's completion commit in its transaction. Required.
	InTx func(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error

	// TTL, when set, is how long the record of a processed message lives in place of
	// the Guard's TTL: a repeat delivered later runs the effect again. Like every TTL
	// it must be longer than the Guard's Lease. Defaults to 0: the Guard's TTL.
	TTL time.Duration

	// InProgressDelay is how long a delivery that finds its message in flight elsewhere
	// (another consumer runs it, or one that crashed holds its lease) waits before it
	// is redelivered. A guard with GuardConfig.InFlightWait first waits that long for
	// the other delivery to finish, and acknowledges the message if it did. Defaults to
	// 0: the RetryAfter of the guard's [idem.InProgressError] (GuardConfig.RetryAfter,
	// 1 s unless set).
	InProgressDelay time.Duration

	// RetryDelay is how long a message waits before it is redelivered after its effect
	// failed or the store was unavailable. Defaults to [DefaultRetryDelay].
	RetryDelay time.Duration

	// Logger receives a line for every message that is not acknowledged, with a short
	// hash of its id (never the id or the payload); repeated warnings and errors (a
	// store outage naks every delivery alike) are summarised, one line and a count per
	// logsummary.DefaultInterval (10 s). Defaults to
	// [slog.Default].
	Logger *slog.Logger
}

// Processor processes delivered messages at most once each. It is safe for concurrent
// use; build one with [New].
type Processor[Tx any] struct {
	cfg Config[Tx]
}

// New returns a Processor for cfg. It panics, naming the field, when cfg is invalid (a
// programmer's mistake): "consume: Config.Guard is required".
func New[Tx any](cfg Config[Tx]) *Processor[Tx] {
	switch {
	case cfg.Guard == nil:
		panic("consume: Config.Guard is required")
	case cfg.InTx == nil:
		panic("consume: Config.InTx is required (the store's SPEC §7 helper, such as (*sqlite.Store).InTx)")
	case cfg.TTL < 0 || cfg.InProgressDelay < 0 || cfg.RetryDelay < 0:
		panic(fmt.Sprintf("consume: Config durations must not be negative (TTL %v, InProgressDelay %v, RetryDelay %v)",
			cfg.TTL, cfg.InProgressDelay, cfg.RetryDelay))
	}
	if err := cfg.Guard.CheckTTL(cfg.TTL); err != nil {
		panic("consume: Config.TTL: " + err.Error())
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A broker redelivers a failing message every RetryDelay: one line per failure
	// and interval, not per delivery.
	cfg.Logger = slog.New(logsummary.New(cfg.Logger.Handler(), 0))
	return &Processor[Tx]{cfg: cfg}
}

// Message is a delivery as the Processor sees it.
type Message struct {
	// Scope names what processes the message: the queue, or the stream and consumer,
	// whose effect this is. A message processed by two consumers with two effects
	// needs two scopes; nothing of one scope is ever taken for a repeat in another.
	// It also names the operation in the guard's Observer events (Call.Name), so keep
	// it to a small set of values. Required (Process panics without it).
	Scope string
	// ID identifies the message across its redeliveries and its publisher's retries:
	// JetStream's Nats-Msg-Id header, AMQP's message-id property, or a key taken from
	// another header. At most MaxIDLength bytes.
	ID string
	// Payload is what the fingerprint covers: a repeat of ID with another payload is
	// not the same message ([ErrIDReused]). Headers are not covered.
	Payload []byte
}

// Action is what an adapter tells the broker about a delivery.
type Action int

const (
	// Ack acknowledges the message: it was processed, now or before.
	Ack Action = iota + 1
	// Nak asks the broker to redeliver the message after Result.Delay: it was not
	// processed, and may be later.
	Nak
	// Term tells the broker never to redeliver the message (JetStream's Term, AMQP's
	// reject without requeue, which dead-letters it when the queue has a dead-letter
	// exchange): it cannot be processed at most once, or its effect refused it for
	// good.
	Term
)

// String returns "ack", "nak" or "term".
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Nak:
		return "nak"
	case Term:
		return "term"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Result is the outcome of processing one delivery.
type Result struct {
	// Action is what to tell the broker.
	Action Action
	// Delay is how long the broker should wait before it redelivers a Nak'd message;
	// 0 means at once.
	Delay time.Duration
	// Replayed is set on an Ack of a repeat: the effect ran for an earlier delivery,
	// and nothing ran now.
	Replayed bool
	// Err says why a message was not acknowledged: the effect's error, a
	// [*idem.StoreError], an [*idem.InProgressError], [ErrIDReused], [ErrNoID],
	// [ErrIDTooLong], [idem.ErrLeaseLost] or the context's error. Nil on Ack.
	Err error
}

// The errors of Results that terminate a message.
var (
	// ErrIDReused: the message's id was processed before with another payload. It is
	// [idem.ErrKeyReused].
	ErrIDReused = idem.ErrKeyReused
	// ErrNoID: the message carries no id, so it cannot be processed at most once.
	ErrNoID = errors.New("consume: the message has no id; it cannot be processed at most once")
	// ErrIDTooLong: the message's id is longer than MaxIDLength bytes.
	ErrIDTooLong = fmt.Errorf("consume: the message's id is longer than %d bytes", MaxIDLength)
)

// permanentError is an effect's error that terminates its message.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent wraps err, an effect's error, so that the message is terminated instead of
// redelivered: its payload can never succeed (it does not parse, say). Permanent(nil)
// is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was wrapped by [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// noResult is what the record of a processed message stores: a queue has no caller to
// replay a result to.
type noResult struct{}

// Process processes m at most once per (m.Scope, m.ID) and returns what to tell the
// broker (see the package documentation for each case). When the store holds no
// completed record of the message it claims it and runs effect inside the
// configured InTx, whose transaction commits effect's writes and the record's
// completion together; Process returns Ack only after that commit. effect's context
// is cancelled with cause [idem.ErrLeaseLost] if the claim's lease is lost; its writes
// then never commit.
//
// When ctx ends before the message is processed, Process returns Nak without delay
// and ctx's error, so that another consumer gets the message at once. A panic in
// effect releases the key and is raised again.
func (p *Processor[Tx]) Process(ctx context.Context, m Message, effect func(ctx context.Context, tx Tx) error) Result {
	if m.Scope == "" {
		panic("consume: Message.Scope is required")
	}
	switch {
	case m.ID == "":
		return p.term(ctx, m, ErrNoID)
	case len(m.ID) > MaxIDLength:
		return p.term(ctx, m, ErrIDTooLong)
	}
	call := idem.Call{Scope: m.Scope, Key: m.ID, Fingerprint: idem.FingerprintInput(m.Scope, m.Payload),
		TTL: p.cfg.TTL, Name: m.Scope}
	var effectErr error
	_, replayed, err := idem.DoTx(ctx, p.cfg.Guard, call, p.cfg.InTx, func(ctx context.Context, tx Tx) (noResult, error) {
		effectErr = effect(ctx, tx)
		if effectErr != nil && errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
			// The effect failed because another delivery took the message over.
			effectErr = fmt.Errorf("%w (the effect returned: %w)", idem.ErrLeaseLost, effectErr)
		}
		return noResult{}, effectErr
	})
	var inProgress *idem.InProgressError
	var quota *idem.QuotaError
	switch {
	case err == nil, errors.Is(err, idem.ErrResponseNotStored):
		return Result{Action: Ack, Replayed: replayed || err != nil}
	case effectErr != nil && IsPermanent(effectErr):
		return p.term(ctx, m, effectErr)
	case ctx.Err() != nil:
		return Result{Action: Nak, Err: context.Cause(ctx)}
	case errors.As(err, &quota):
		// The scope (the queue) reached a bound of its own (SPEC §19): nothing was
		// claimed; the message comes back when the bound may let it through.
		p.cfg.Logger.DebugContext(ctx, "consume: the scope reached a bound; the message is redelivered",
			idHash(m), slog.String("limit", quota.Limit), slog.Duration("delay", quota.RetryAfter))
		return Result{Action: Nak, Delay: quota.RetryAfter, Err: err}
	case errors.As(err, &inProgress):
		delay := p.cfg.InProgressDelay
		if delay == 0 {
			delay = inProgress.RetryAfter
		}
		p.cfg.Logger.DebugContext(ctx, "consume: the message is in flight elsewhere; it is redelivered",
			idHash(m), slog.Duration("delay", delay))
		return Result{Action: Nak, Delay: delay, Err: err}
	case errors.Is(err, idem.ErrKeyReused):
		return p.term(ctx, m, ErrIDReused)
	case effectErr != nil && !errors.Is(effectErr, idem.ErrLeaseLost):
		p.cfg.Logger.WarnContext(ctx, "consume: the effect failed; nothing committed, the message is redelivered",
			idHash(m), slog.Duration("delay", p.cfg.RetryDelay), slog.Any("error", err))
	default:
		// The store failed or timed out, or the commit did, or the lease was lost to
		// another delivery: nothing of this one committed.
		p.cfg.Logger.WarnContext(ctx, "consume: not processed; the message is redelivered",
			idHash(m), slog.Duration("delay", p.cfg.RetryDelay), slog.Any("error", err))
	}
	return Result{Action: Nak, Delay: p.cfg.RetryDelay, Err: err}
}

// term logs why m is terminated and returns the Term result.
func (p *Processor[Tx]) term(ctx context.Context, m Message, err error) Result {
	p.cfg.Logger.ErrorContext(ctx, "consume: the message is terminated; it is not redelivered",
		idHash(m), slog.Any("error", err))
	return Result{Action: Term, Err: err}
}

// idHash identifies m in logs without revealing its id: the guard's key_hash of it.
func idHash(m Message) slog.Attr {
	sum := sha256.Sum256([]byte(m.Scope + "\x00" + m.ID))
	return slog.String("id_hash", hex.EncodeToString(sum[:6]))
}
