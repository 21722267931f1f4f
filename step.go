package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"unicode/utf8"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
)

// Resumable operations (SPEC §13). An operation that calls a foreign system (a card
// processor) runs as named steps. Each step commits its own writes together with the
// record's new recovery point and a small result, in one transaction fenced by the
// lock token; the foreign call between two steps carries a key derived from the
// request and the step ([Handle.DerivedKey]), so that the foreign system
// deduplicates a call repeated after a crash. A holder that takes a lapsed key over
// (a retry, or the [Completer]) runs the operation again from the top: every step
// that committed returns its saved result without running, so the operation resumes
// after its last committed step and no committed step is ever redone.
//
// The steps of SQL stores run in the application's transaction:
// store/sqlite's Step and store/postgres's Step. [Step] here saves a result alone,
// on any store with Capabilities.RecoveryPoints.

// stepState is a Handle's view of its record's steps: the recovery point and the
// encoded results as the claim read them, or as the last step committed them.
type stepState struct {
	point string
	raw   []byte
	// saved is raw decoded, when decoded.
	saved   []savedStep
	decoded bool
	// prepared names the step PrepareStep readied last, for StepFailed's event, with
	// its params and its results in clear.
	prepared       string
	preparedParams *idemstore.StepParams
	preparedRaw    []byte
}

// savedStep is one committed step in the record's encoding of its steps.
type savedStep struct {
	Step   string          `json:"step"`
	Result json.RawMessage `json:"result"`
}

// acquired records the claim's record: the key is held, and its steps are those the
// record carries (none for a fresh claim; a takeover's committed ones).
func (h *Handle) acquired(rec *idemstore.Record) {
	h.claimed = rec
	h.mu.Lock()
	h.steps = stepState{point: rec.RecoveryPoint, raw: rec.Steps}
	h.mu.Unlock()
}

// RecoveryPoint returns the name of the operation's last committed step, or "" when
// no step has committed (SPEC §13). After a takeover it is the step the operation
// resumes after.
func (h *Handle) RecoveryPoint() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.steps.point
}

// Operation returns the name of the operation ([Call.Name], [RouteOptions.Name]), or
// "" when it has none.
func (h *Handle) Operation() string { return h.operation }

// DerivedKey returns the idempotency key to send to an outside system (a card
// processor, a bank) for the call the operation makes at step (SPEC §13); it has
// nothing to do with a database's foreign keys. It is hex SHA-256(record id ‖ step)
// ([idemstore.DeriveKey]), as every release of idem derives it, and the record id
// is derived from the request: its scope, key and fingerprint
// ([idemstore.RecordIDFor]). So it is the same for every holder of the record (a
// takeover, the [Completer], a process of the previous or the next release), and for
// the retry that makes a new record after this one was released or lost (a store
// failover that dropped its last commits): an outside system that deduplicates by it
// runs the call once. A record made by idem 0.2.0 or older keeps its random id, and
// its keys.
//
// step names the call, like a step's name: keep it stable across deploys while
// operations are unfinished, or a resumed operation sends a new key. It panics on a
// handle without an acquired claim (a [RouteOptions.ClaimInHandler] route, whose
// claim is not made yet; a nil *Handle, which [FromContext] returns on a request
// without a key): a key derived from nothing would be the same for every operation.
//
// So idem.FromContext(ctx).DerivedKey(step) is safe where an operation always holds
// a key: in a handler on a route that requires one (POST and PATCH do by default: a
// request without a key gets 400 key_required before the handler runs) and in a
// resume function. On a route where the key is optional, check FromContext for nil
// first: a request without a key is an operation of its own, which no retry repeats,
// and its outside call needs no key of ours (client.Transport adds a fresh one,
// kept across its attempts, to a POST that has none).
func (h *Handle) DerivedKey(step string) string {
	if h == nil || h.claimed == nil {
		panic("idem: Handle.DerivedKey needs an acquired claim: the handle is nil (a request without a key) or its claim is not made yet (a ClaimInHandler route)")
	}
	return idemstore.DeriveKey(h.claimed.ID, step)
}

// StepResult reports whether step committed, and when it did decodes the result it
// saved into v (a pointer, as for [json.Unmarshal]). Store packages' step helpers call
// it first, and return the saved result instead of running a step again; the
// [observe.Observer] is told of every saved result returned ([observe.StepSaved]).
func (h *Handle) StepResult(step string, v any) (committed bool, err error) {
	h.mu.Lock()
	saved, err := h.steps.decode()
	h.mu.Unlock()
	if err != nil {
		return false, err
	}
	for _, s := range saved {
		if s.Step == step {
			if err := json.Unmarshal(s.Result, v); err != nil {
				return true, fmt.Errorf("idem: decoding the saved result of step %q: %w", step, err)
			}
			h.observeStep(step, observe.StepSaved, nil)
			return true, nil
		}
	}
	return false, nil
}

// decode returns the saved steps, decoding them once. The caller holds the handle's mu.
func (st *stepState) decode() ([]savedStep, error) {
	if st.decoded || len(st.raw) == 0 {
		return st.saved, nil
	}
	var saved []savedStep
	if err := json.Unmarshal(st.raw, &saved); err != nil {
		return nil, fmt.Errorf("idem: the record's step results are malformed: %w", err)
	}
	st.saved, st.decoded = saved, true
	return saved, nil
}

// PrepareStep is for store packages implementing a step helper. Called inside the
// step's transaction, after the step's function returned result, it returns the fenced
// step to run in that transaction: the record's recovery point becomes step and its
// results gain result, JSON-encoded. It fails without a held claim (a
// [RouteOptions.ClaimInHandler] route), once the result is frozen for the completion,
// for a step that already committed ([ErrStepCommitted]), for an invalid step name, a
// result that cannot be encoded, or results over [MaxStepResultsBytes]. After the
// transaction commits, call [Handle.StepCommitted]; when it does not, call
// [Handle.StepFailed].
func (h *Handle) PrepareStep(step string, result any) (*idemstore.StepParams, error) {
	if h.g == nil || h.claimed == nil {
		return nil, errors.New("idem: a step needs a claim held under a lease (not a ClaimInHandler route)")
	}
	if err := checkStepName(step); err != nil {
		return nil, err
	}
	b, err := json.Marshal(result)
	if err != nil {
		return nil, fmt.Errorf("idem: encoding the result of step %q: %w", step, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.decided {
		return nil, fmt.Errorf("idem: step %q after the result was frozen for the completion", step)
	}
	saved, err := h.steps.decode()
	if err != nil {
		return nil, err
	}
	for _, s := range saved {
		if s.Step == step {
			return nil, fmt.Errorf("%w: %q", ErrStepCommitted, step)
		}
	}
	raw, err := json.Marshal(append(saved[:len(saved):len(saved)], savedStep{Step: step, Result: b}))
	if err != nil {
		return nil, err
	}
	if len(raw) > MaxStepResultsBytes {
		return nil, fmt.Errorf("idem: step %q: the results of the record's steps would take %d bytes, more than MaxStepResultsBytes (%d): save ids, not documents",
			step, len(raw), MaxStepResultsBytes)
	}
	p := &idemstore.StepParams{
		Scope: h.scope, Key: h.key, Token: h.claim.Token,
		RecoveryPoint: step, Steps: raw, Operation: h.operation,
	}
	if k := h.g.cfg.Seal; k != nil {
		if p.Steps, err = k.Seal(seal.PurposeSteps, h.binding(), raw); err != nil {
			return nil, err
		}
	}
	h.steps.prepared, h.steps.preparedParams, h.steps.preparedRaw = step, p, raw
	return p, nil
}

// checkStepName refuses a step name that is empty, too long, not UTF-8 or holds
// control characters.
func checkStepName(step string) error {
	if step == "" || len(step) > MaxStepNameLength || !utf8.ValidString(step) {
		return fmt.Errorf("idem: a step name must be 1 to %d bytes of UTF-8, got %q", MaxStepNameLength, step)
	}
	for _, r := range step {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("idem: a step name must not hold control characters, got %q", step)
		}
	}
	return nil
}

// StepCommitted tells the handle that the step p, prepared by PrepareStep, committed:
// the record's recovery point is p's step, and its result is saved.
func (h *Handle) StepCommitted(p *idemstore.StepParams) {
	h.mu.Lock()
	raw := p.Steps
	if p == h.steps.preparedParams {
		raw = h.steps.preparedRaw // in clear: p's are sealed under a keyring
	}
	h.steps = stepState{point: p.RecoveryPoint, raw: raw}
	h.mu.Unlock()
	h.observeStep(p.RecoveryPoint, observe.StepCommitted, nil)
}

// StepFailed tells the handle that the transaction of a step prepared by PrepareStep
// did not commit. When err is [ErrLeaseLost] (the fenced step found the key taken
// over) the operation's context is cancelled with that cause: another holder runs the
// operation now, and this one must stop.
func (h *Handle) StepFailed(err error) {
	h.mu.Lock()
	step := h.steps.prepared
	h.mu.Unlock()
	if !errors.Is(err, ErrLeaseLost) {
		h.observeStep(step, observe.StepFailed, err)
		return
	}
	h.observeStep(step, observe.StepLeaseLost, err)
	if h.cancel == nil {
		return
	}
	h.g.cfg.Logger.WarnContext(&h.detached, "idem: a step found its key taken over; cancelling the operation", h.attrs()...)
	h.cancel(ErrLeaseLost)
}

// Step runs fn as the step named step of the operation whose context is ctx, and saves
// its result in the record (SPEC §13): when the step committed already (before a
// crash, or in an earlier run of the operation) it returns the saved result without
// running fn; otherwise it runs fn, then records the result and advances the record's
// recovery point, fenced by the lock token ([ErrLeaseLost] when the key was taken
// over: the operation's context is then cancelled).
//
// Only the result is saved, not fn's other effects: use Step for a foreign call whose
// answer the operation needs later, with a key from [Handle.DerivedKey] so that a call
// repeated after a crash between the call and the save is deduplicated. To commit
// database writes with the step, use the store package's step helper (store/sqlite's
// Step, store/postgres's Step). The result must survive a JSON round trip.
//
// Without a claim in ctx (a request without a key) Step just runs fn. A store without
// Capabilities.RecoveryPoints (Redis) makes Step fail before fn runs; a failure to
// record the result returns a [*StoreError].
func Step[T any](ctx context.Context, step string, fn func(ctx context.Context) (T, error)) (T, error) {
	var v T
	h := FromContext(ctx)
	if h == nil {
		return fn(ctx)
	}
	if done, err := h.StepResult(step, &v); done || err != nil {
		return v, err
	}
	if h.g == nil || !h.g.cfg.Store.Capabilities().RecoveryPoints {
		return v, fmt.Errorf("idem: step %q: %w: the store keeps no recovery points (Capabilities.RecoveryPoints)", step, errors.ErrUnsupported)
	}
	v, err := fn(ctx)
	if err != nil {
		return v, err
	}
	p, err := h.PrepareStep(step, v)
	if err != nil {
		var zero T
		return zero, err
	}
	sctx, cancel := context.WithTimeout(ctx, h.g.cfg.Lease)
	start := h.storeCallStart()
	err = h.g.cfg.Store.RecordStep(sctx, p)
	h.observeStoreCall(observe.StoreOpStep, start, err)
	cancel()
	if err != nil {
		h.StepFailed(err)
		var zero T
		if errors.Is(err, ErrLeaseLost) {
			return zero, err
		}
		h.g.cfg.Logger.WarnContext(ctx, "idem: saving a step's result failed", h.attrs(slog.String("step", step), slog.Any("error", err))...)
		return zero, &StoreError{Op: "step", Err: err}
	}
	h.StepCommitted(p)
	return v, nil
}

// SetResult sets the result the completion stores to v, JSON-encoded with status 200,
// as [Do] stores its function's result; a repeat of the Do call decodes it. A
// [ResumeFunc] of an operation run with Do or DoTx sets its result with it.
func (h *Handle) SetResult(v any) error { return h.setResult(v) }
