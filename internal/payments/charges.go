package payments

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// charge is a row of the charges table.
type charge struct {
	ID             string
	Amount         int64
	Currency       string
	CustomerID     *string
	Status         string
	Created        int64
	IdempotencyKey *string
	Fingerprint    *string
	KeyExpiresAt   *int64
	// ProcessorChargeID is the card processor's charge (SPEC §13); nil without a
	// processor, and while the charge is pending.
	ProcessorChargeID *string
}

// chargeJSON is a charge as the API renders it; the order of its fields is fixed, so
// the same row always renders to the same bytes.
type chargeJSON struct {
	ID                string  `json:"id"`
	Object            string  `json:"object"`
	Amount            int64   `json:"amount"`
	Currency          string  `json:"currency"`
	CustomerID        *string `json:"customer_id"`
	Status            string  `json:"status"`
	Created           int64   `json:"created"`
	IdempotencyKey    *string `json:"idempotency_key"`
	ProcessorChargeID *string `json:"processor_charge_id"`
}

func (c *charge) view() chargeJSON {
	return chargeJSON{ID: c.ID, Object: "charge", Amount: c.Amount, Currency: c.Currency, CustomerID: c.CustomerID,
		Status: c.Status, Created: c.Created, IdempotencyKey: c.IdempotencyKey, ProcessorChargeID: c.ProcessorChargeID}
}

func (c *charge) render() []byte {
	b, _ := json.Marshal(c.view())
	return b
}

func scanCharge(s scanner) (*charge, error) {
	var c charge
	err := s.Scan(&c.ID, &c.Amount, &c.Currency, &c.CustomerID, &c.Status, &c.Created, &c.IdempotencyKey, &c.Fingerprint, &c.KeyExpiresAt, &c.ProcessorChargeID)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// Statuses of a charge.
const (
	statusSucceeded = "succeeded"
	// statusPending: recorded before the card processor was called (SPEC §13); it
	// settles once the processor answers.
	statusPending = "pending"
	// statusFailed: the card processor refused the charge.
	statusFailed = "failed"
)

// createCharge is POST /v1/charges: {"amount", "currency", "customer_id"?} → 201.
func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	arrival := s.now()
	p, _, aerr := readParams(w, r)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	in, aerr := chargeParams(p)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	k := s.keyOf(r, nil, arrival) // the record's fingerprint: the charge keeps it
	c := &charge{ID: newID("ch_"), Amount: in.Amount, Currency: in.Currency, CustomerID: in.CustomerID,
		Status: statusSucceeded, Created: s.now().Unix(), IdempotencyKey: k.key, Fingerprint: k.fingerprint, KeyExpiresAt: k.expiresAt}
	if s.processor != nil {
		c.Status = statusPending
		s.chargeThroughProcessor(w, r, c)
		return
	}
	if h := idem.FromContext(r.Context()); h != nil && h.RecoveryPoint() != "" {
		// A charge begun through a card processor, resumed by a process that has none.
		writeAPIError(w, errProcessorUnavailable("This charge was begun through a card processor, which this server is not configured with; retry the request."))
		return
	}
	if !s.callProcessor(w, r) {
		return
	}
	sc := chargeScope(r)
	insert := func(ctx context.Context, q querier) (reply, error) {
		got, out, err := s.insertCharge(ctx, r, q, sc, c)
		if out != nil || err != nil {
			return out, err
		}
		return chargeReply(got), nil
	}
	if s.otherScope(r, sc) != "" && s.db.sqliteStore == nil {
		// The pipelined insert cannot look under the other scope first.
		s.mutate(w, r, insert)
		return
	}
	s.write(w, r, jsonReply(http.StatusCreated, c.render()), func(b *pgx.Batch) {
		b.Queue(s.db.queries["charge_insert_strict"], c.ID, sc, c.Amount, c.Currency, c.CustomerID,
			c.Status, c.Created, c.IdempotencyKey, c.Fingerprint, c.KeyExpiresAt, c.ProcessorChargeID)
	}, insert)
}

// chargeScope is the scope a new charge of r is kept under: its record's, keyed while
// the store's sealing is in effect (SPEC §19), so that the charges table keeps no
// digest of a credential that the records do not; the principal's plain scope without
// a record.
func chargeScope(r *http.Request) string {
	if h := idem.FromContext(r.Context()); h != nil {
		return h.Scope()
	}
	return scope(r)
}

// otherScope is r's principal's scope in the other form than sc (the keyed one for the
// plain one, and the other way round), where charges made before sealing began (or
// before it ended) are kept; "" without a keyring, which makes no keyed scope.
func (s *Server) otherScope(r *http.Request, sc string) string {
	plain, keyed := s.scopes(r)
	switch {
	case keyed == "":
		return ""
	case sc == plain:
		return keyed
	}
	return plain
}

// scopes are the principal's scopes in the charges table: its plain one, and under a
// keyring its keyed one ("" without).
func (s *Server) scopes(r *http.Request) (plain, keyed string) {
	plain = scope(r)
	if ring := s.cfg.Seal; ring != nil && ring.Keyed() {
		keyed = ring.Scope(plain)
	}
	return plain, keyed
}

// chargeGet reads the principal's charge id, under either of its scopes.
func (s *Server) chargeGet(ctx context.Context, r *http.Request, q querier, id string) (*charge, error) {
	if plain, keyed := s.scopes(r); keyed != "" {
		return scanCharge(q.queryRow(ctx, "charge_get_either", plain, keyed, id))
	}
	return scanCharge(q.queryRow(ctx, "charge_get", scope(r), id))
}

// insertCharge inserts c, or finds the live charge that c's key wrote already
// although its idempotency record did not know it (a store without §7 lost it, or the
// record expired, SPEC §8): it returns the charge inserted or found, or the reply to a
// request that reused the key with other parameters.
func (s *Server) insertCharge(ctx context.Context, r *http.Request, q querier, sc string, c *charge) (*charge, reply, error) {
	if other := s.otherScope(r, sc); other != "" && c.IdempotencyKey != nil {
		// The key's charge may be kept under the principal's other scope: made before
		// sealing began (or ended), its record lost.
		prev, out, err := s.chargeBackstop(ctx, r, q, other, *c.IdempotencyKey, *c.Fingerprint)
		if prev != nil || out != nil || err != nil {
			return prev, out, err
		}
	}
	// At most two rounds: the second follows the retirement of an expired key.
	for range 2 {
		got, err := scanCharge(q.queryRow(ctx, "charge_insert", c.ID, sc, c.Amount, c.Currency, c.CustomerID,
			c.Status, c.Created, c.IdempotencyKey, c.Fingerprint, c.KeyExpiresAt, c.ProcessorChargeID))
		if err == nil {
			return got, nil, nil
		}
		if !errors.Is(err, errNoRows) {
			return nil, nil, err
		}
		prev, out, err := s.chargeBackstop(ctx, r, q, sc, *c.IdempotencyKey, *c.Fingerprint)
		if prev != nil || out != nil || err != nil {
			return prev, out, err
		}
	}
	return nil, nil, errKeyConflict
}

// chargeBackstop finds the live charge that key wrote already: the same request gets
// that charge, another request the key_reused reply. When the key's record has
// expired it retires the key and returns neither: the key starts a new operation
// (SPEC §8). A pending charge's key is never retired, however old: its operation is
// unfinished (SPEC §13), and its record never expires; only an operator's delete
// (idem keys delete --abandon) loses it, and then the key's next execution adopts and
// finishes the charge instead of recording a second one.
func (s *Server) chargeBackstop(ctx context.Context, r *http.Request, q querier, sc, key, fp string) (*charge, reply, error) {
	prev, err := scanCharge(q.queryRow(ctx, "charge_get_by_key", sc, key))
	switch {
	case errors.Is(err, errNoRows): // retired meanwhile: insert again
		return nil, nil, nil
	case err != nil:
		return nil, nil, err
	case prev.Status != statusPending && keyExpired(prev.KeyExpiresAt, s.now()):
		_, err := q.exec(ctx, "charge_retire_key", prev.ID)
		return nil, nil, err
	case !sameChargeRequest(r, prev.Fingerprint, fp):
		return nil, s.keyReused(r), nil
	}
	return prev, nil, nil
}

// sameChargeRequest reports whether a charge's stored request fingerprint is that of
// r's request, current: in either form when r holds a key (the record's keyed one, or
// the plain one exactly, as the middleware compares them, SPEC §20), as sameRequest
// compares them otherwise.
func sameChargeRequest(r *http.Request, stored *string, current string) bool {
	h := idem.FromContext(r.Context())
	if h == nil || stored == nil {
		return sameRequest(stored, current)
	}
	fp, ok := parseFingerprint(*stored)
	return ok && h.FingerprintMatches(fp)
}

// chargeReply is the answer that a charge stands for: 201 and the charge when it
// succeeded; 402 card_declined naming it when the card processor refused it; 409
// charge_pending (released, SPEC §6: the retry finishes it) while it is pending.
func chargeReply(c *charge) reply {
	switch c.Status {
	case statusFailed:
		return func(w http.ResponseWriter) {
			writeAPIError(w, &apiError{status: http.StatusPaymentRequired, typ: "card_error", code: "card_declined",
				message: "The card processor refused the charge.", charge: c.ID})
		}
	case statusPending:
		return func(w http.ResponseWriter) {
			writeAPIError(w, &apiError{status: http.StatusConflict, code: "charge_pending",
				message: "The charge is pending at the card processor; retry the request to finish it.", charge: c.ID})
		}
	}
	return jsonReply(http.StatusCreated, c.render())
}

type chargeInput struct {
	Amount     int64
	Currency   string
	CustomerID *string
}

func chargeParams(p *params) (chargeInput, *apiError) {
	var in chargeInput
	var err *apiError
	if in.Amount, in.Currency, err = p.money("customer_id"); err != nil {
		return in, err
	}
	in.CustomerID, err = p.optionalString("customer_id", 255)
	return in, err
}

// callProcessor stands for the card processor: it sleeps ProcessorLatency holding no
// transaction or connection. It answers 503 and returns false when the request ends
// first (the client went away, or the lease was lost).
func (s *Server) callProcessor(w http.ResponseWriter, r *http.Request) bool {
	if s.beforeCharge != nil {
		s.beforeCharge(r)
	}
	d := s.cfg.ProcessorLatency
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		writeAPIError(w, &apiError{status: http.StatusServiceUnavailable, code: "processor_interrupted", message: "The request ended before the card processor answered; retry it."})
		return false
	}
}

// getCharge is GET /v1/charges/{id}: 200, or 404 also for another principal's charge.
func (s *Server) getCharge(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := s.readCtx(r)
	defer cancel()
	c, err := s.chargeGet(ctx, r, s.db.reader(), id)
	switch {
	case errors.Is(err, errNoRows):
		writeAPIError(w, errNotFound("charge", id))
	case err != nil:
		s.logger.WarnContext(ctx, "payments: reading a charge", "err", err)
		writeAPIError(w, errUnavailable())
	default:
		writeJSON(w, http.StatusOK, c.render())
	}
}

type listJSON struct {
	Object  string       `json:"object"`
	Data    []chargeJSON `json:"data"`
	HasMore bool         `json:"has_more"`
	URL     string       `json:"url"`
}

// listCharges is GET /v1/charges?limit=N&starting_after=ID: the principal's charges,
// newest first by (created, id).
func (s *Server) listCharges(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	limit, aerr := parseLimit(query.Get("limit"))
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	ctx, cancel := s.readCtx(r)
	defer cancel()
	q := s.db.reader()
	plain, keyed := s.scopes(r)
	name, args := "charge_list", []any{plain, limit + 1}
	if keyed != "" {
		name, args = "charge_list_either", []any{plain, keyed, limit + 1}
	}
	if after := query.Get("starting_after"); after != "" {
		cursor, err := s.chargeGet(ctx, r, q, after)
		if errors.Is(err, errNoRows) {
			writeAPIError(w, &apiError{status: http.StatusBadRequest, code: "resource_missing", param: "starting_after", message: "No such charge: '" + after + "'"})
			return
		}
		if err != nil {
			s.logger.WarnContext(ctx, "payments: reading a charge", "err", err)
			writeAPIError(w, errUnavailable())
			return
		}
		name, args = "charge_list_after", []any{plain, cursor.Created, cursor.ID, limit + 1}
		if keyed != "" {
			name, args = "charge_list_after_either", []any{plain, keyed, cursor.Created, cursor.ID, limit + 1}
		}
	}
	out := listJSON{Object: "list", Data: []chargeJSON{}, URL: "/v1/charges"}
	err := q.query(ctx, name, args, func(row scanner) error {
		c, err := scanCharge(row)
		if err != nil {
			return err
		}
		out.Data = append(out.Data, c.view())
		return nil
	})
	if err != nil {
		s.logger.WarnContext(ctx, "payments: listing charges", "err", err)
		writeAPIError(w, errUnavailable())
		return
	}
	if len(out.Data) > limit {
		out.Data, out.HasMore = out.Data[:limit], true
	}
	b, _ := json.Marshal(out)
	writeJSON(w, http.StatusOK, b)
}
