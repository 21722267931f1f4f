package payments

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/idem-go/idem"
)

// A charge through the card processor (SPEC §13) runs in Brandur Leach's order:
//
//  1. the step stepPending records the charge as pending, in one transaction with
//     the record's recovery point, before the processor is called, so that a crash
//     during the call leaves a charge to resume;
//  2. the processor call, under the key Handle.DerivedKey(stepProcessor): the same
//     for every holder of the record, so that the processor answers a repeated call
//     with the charge it made, and never makes a second;
//  3. one transaction that saves the processor's answer, settles the charge
//     (succeeded, or failed when the processor refused it) and completes the record
//     with the answer (SPEC §7).
//
// A holder that takes the key over (the client's retry, or the completer through
// resumeCharge) runs the same code: the pending step returns its saved result without
// running, and the call and the settlement follow. When the processor does not answer
// (its retries exhausted, or the lease ended), the request is answered 503
// processor_unavailable and the record is kept, its lease ended (a release never
// deletes a record whose recovery point advanced): the retry or the completer resumes
// it. A pending charge is never answered as succeeded: GET shows it pending.
const (
	// chargeOperation names the operation of POST /v1/charges in its records
	// (idem.RouteOptions.Name), so that the completer finds resumeCharge. It is the
	// route's pattern, as the other routes' observer events are labelled.
	chargeOperation = "POST /v1/charges"
	// stepPending is the step that records the charge as pending.
	stepPending = "charge_pending"
	// stepProcessor names the processor call, whose key is derived from it.
	stepProcessor = "processor_charge"
)

// pendingCharge is what the pending step saves: the charge, and what the processor
// call needs.
type pendingCharge struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// errAnswered ends the pending step without committing it: the request is answered
// otherwise (its key was reused, or its charge was settled already).
var errAnswered = errors.New("payments: answered without a pending step")

// chargeThroughProcessor is POST /v1/charges with a card processor: c, pending, is
// recorded, then charged at the processor, then settled.
func (s *Server) chargeThroughProcessor(w http.ResponseWriter, r *http.Request, c *charge) {
	ctx, sc := r.Context(), chargeScope(r)
	var early reply
	p, err := step(ctx, s.db, stepPending, func(ctx context.Context, q querier) (pendingCharge, error) {
		got, out, err := s.insertCharge(ctx, r, q, sc, c)
		switch {
		case err != nil:
			return pendingCharge{}, err
		case out != nil:
			early = out
			return pendingCharge{}, errAnswered
		case got.Status != statusPending:
			// Settled before its record was lost: answered as it stands.
			early = chargeReply(got)
			return pendingCharge{}, errAnswered
		}
		// Pending: inserted now, or left by an execution whose record was lost.
		return pendingCharge{ID: got.ID, Amount: got.Amount, Currency: got.Currency}, nil
	})
	switch {
	case errors.Is(err, errAnswered):
		early(w)
		return
	case errors.Is(err, errKeyConflict):
		idem.WriteError(w, r, s.cfg.Profile, idem.CodeRequestInProgress, "")
		return
	case err != nil:
		// Also a lost lease (idem.ErrLeaseLost): the middleware answers 503 then.
		s.logger.WarnContext(ctx, "payments: recording a pending charge failed", "err", err)
		writeAPIError(w, errUnavailable())
		return
	}
	settle, err := s.processorCharge(ctx, p)
	if err != nil {
		s.logger.WarnContext(ctx, "payments: the card processor did not answer; the charge stays pending", "charge", p.ID, "err", err)
		writeAPIError(w, errProcessorUnavailable("The card processor did not answer; the charge is pending. Retry the request with the same key to finish it."))
		return
	}
	s.mutate(w, r, settle)
}

// resumeCharge finishes, for the completer (idem.ResumeFunc), a charge whose holder
// died, or gave up on an unavailable processor, after its pending step committed: it
// calls the processor under the same key as every holder of the record did, settles
// the charge and completes the record with the answer a retry gets.
func (s *Server) resumeCharge(ctx context.Context, h *idem.Handle) error {
	var p pendingCharge
	committed, err := h.StepResult(stepPending, &p)
	switch {
	case err != nil:
		return err
	case !committed:
		return fmt.Errorf("payments: a charge's record at step %q has no pending charge", h.RecoveryPoint())
	}
	settle, err := s.processorCharge(ctx, p)
	if err != nil {
		return err
	}
	return s.db.inTx(ctx, func(ctx context.Context, q querier) error {
		out, err := settle(ctx, q)
		if err != nil {
			return err
		}
		h.SetResponse(recordReply(out))
		return nil
	})
}

// processorCharge charges the pending charge p at the processor, under the key derived
// from the record and stepProcessor when ctx carries the record's handle (without
// idempotency, a fresh key), and returns the transaction that settles it with the
// processor's answer: succeeded with its charge id, or failed when the processor
// refused. It fails when the processor did not answer. The settlement finds the
// charge by its id, whichever scope the charges table keeps it under.
func (s *Server) processorCharge(ctx context.Context, p pendingCharge) (func(context.Context, querier) (reply, error), error) {
	key := ""
	if h := idem.FromContext(ctx); h != nil {
		key = h.DerivedKey(stepProcessor)
	}
	status, pchID := statusSucceeded, (*string)(nil)
	pch, err := s.processor.charge(ctx, key, p.Amount, p.Currency)
	var refused *processorRefusal
	switch {
	case errors.As(err, &refused):
		s.logger.WarnContext(ctx, "payments: the card processor refused a charge", "charge", p.ID, "err", err)
		status = statusFailed
	case err != nil:
		return nil, err
	default:
		pchID = &pch.ID
	}
	return func(ctx context.Context, q querier) (reply, error) {
		// The key's record, whose recovery point advanced, expires a TTL after this
		// completion (SPEC §13): so does the key of its charge.
		keyExpires := s.now().Add(s.ttl).UnixMilli()
		got, err := scanCharge(q.queryRow(ctx, "charge_settle", p.ID, status, pchID, keyExpires))
		if errors.Is(err, errNoRows) {
			// Settled already: answered as it stands.
			got, err = scanCharge(q.queryRow(ctx, "charge_get_by_id", p.ID))
		}
		if err != nil {
			return nil, err
		}
		return chargeReply(got), nil
	}, nil
}

// recordReply runs out and returns what it wrote as the response an idempotency
// record stores: the status, the stored headers (idem.DefaultStoredHeaders, as the
// middleware keeps them) and the body.
func recordReply(out reply) *idem.Response {
	rec := &replyRecorder{header: http.Header{}, status: http.StatusOK}
	out(rec)
	stored := http.Header{}
	for _, name := range idem.DefaultStoredHeaders {
		if v := rec.header.Values(name); len(v) > 0 {
			stored[http.CanonicalHeaderKey(name)] = v
		}
	}
	return &idem.Response{Status: rec.status, Header: stored, Body: rec.body.Bytes()}
}

// replyRecorder is the http.ResponseWriter of recordReply.
type replyRecorder struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (r *replyRecorder) Header() http.Header { return r.header }

func (r *replyRecorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
}

func (r *replyRecorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.body.Write(b)
}
