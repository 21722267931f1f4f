package payments

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// orderID is the shape of an order id (SPEC §11).
var orderID = regexp.MustCompile(`^ord_[A-Za-z0-9_]{1,64}$`)

// orderStatuses are the statuses an order may have; "open" is the default.
var orderStatuses = []string{"open", "paid", "fulfilled", "canceled"}

// order is a row of the orders table. Orders belong to a principal: the primary key
// is (scope, id), so two principals may each have an order with the same id.
type order struct {
	ID             string
	Amount         int64
	Currency       string
	Description    *string
	Status         string
	Created        int64
	Updated        int64
	IdempotencyKey *string
	Fingerprint    *string
	KeyExpiresAt   *int64
	// KeyCreated says whether the write recorded in IdempotencyKey created the order
	// (a POST, or a PUT of an absent id) rather than replaced it: the backstop renders
	// a keyed PUT again with the status it first answered.
	KeyCreated bool
}

type orderJSON struct {
	ID             string  `json:"id"`
	Object         string  `json:"object"`
	Amount         int64   `json:"amount"`
	Currency       string  `json:"currency"`
	Description    *string `json:"description"`
	Status         string  `json:"status"`
	Created        int64   `json:"created"`
	Updated        int64   `json:"updated"`
	IdempotencyKey *string `json:"idempotency_key"`
}

func (o *order) render() []byte {
	b, _ := json.Marshal(orderJSON{ID: o.ID, Object: "order", Amount: o.Amount, Currency: o.Currency,
		Description: o.Description, Status: o.Status, Created: o.Created, Updated: o.Updated, IdempotencyKey: o.IdempotencyKey})
	return b
}

func scanOrder(s scanner) (*order, error) {
	var o order
	err := s.Scan(&o.ID, &o.Amount, &o.Currency, &o.Description, &o.Status, &o.Created, &o.Updated, &o.IdempotencyKey, &o.Fingerprint, &o.KeyExpiresAt, &o.KeyCreated)
	if err != nil {
		return nil, err
	}
	return &o, nil
}

func orderLocation(id string) string { return "/v1/orders/" + id }

// orderInput is the full content of an order, as POST and PUT take it.
type orderInput struct {
	Amount      int64
	Currency    string
	Description *string
	Status      string
}

func orderParams(p *params) (orderInput, *apiError) {
	var in orderInput
	var err *apiError
	if in.Amount, in.Currency, err = p.money("description", "status"); err != nil {
		return in, err
	}
	if in.Description, err = p.optionalString("description", 1000); err != nil {
		return in, err
	}
	status, err := p.optionalString("status", 32)
	switch {
	case err != nil:
		return in, err
	case status == nil:
		in.Status = "open"
	case !contains(orderStatuses, *status):
		return in, invalid("status", "must be one of open, paid, fulfilled, canceled")
	default:
		in.Status = *status
	}
	return in, nil
}

// readOrder reads and validates an order body, answering 4xx itself when it is bad.
func readOrder(w http.ResponseWriter, r *http.Request) (orderInput, []byte, bool) {
	p, body, aerr := readParams(w, r)
	if aerr == nil {
		var in orderInput
		if in, aerr = orderParams(p); aerr == nil {
			return in, body, true
		}
	}
	writeAPIError(w, aerr)
	return orderInput{}, nil, false
}

// createOrder is POST /v1/orders (key required): 201 with a new "ord_…" id.
func (s *Server) createOrder(w http.ResponseWriter, r *http.Request) {
	arrival := s.now()
	in, body, ok := readOrder(w, r)
	if !ok {
		return
	}
	k := s.keyOf(r, body, arrival)
	id, sc, now := newID("ord_"), scope(r), s.now().Unix()
	o := &order{ID: id, Amount: in.Amount, Currency: in.Currency, Description: in.Description, Status: in.Status,
		Created: now, Updated: now, IdempotencyKey: k.key, Fingerprint: k.fingerprint, KeyExpiresAt: k.expiresAt}
	rendered := o.render()
	s.write(w, r, orderReply(http.StatusCreated, id, rendered), func(b *pgx.Batch) {
		b.Queue(s.db.queries["order_insert_strict"], sc, id, in.Amount, in.Currency, in.Description, in.Status, now, k.key, k.fingerprint, k.expiresAt)
		if k.key != nil {
			b.Queue(s.db.queries["order_key_insert"], sc, *k.key, id, k.fingerprint, *k.expiresAt, http.StatusCreated, rendered)
		}
	}, func(ctx context.Context, q querier) (reply, error) {
		if out, err := s.orderBackstop(ctx, r, q, sc, k); out != nil || err != nil {
			return out, err
		}
		o, err := scanOrder(q.queryRow(ctx, "order_insert", sc, id, in.Amount, in.Currency, in.Description, in.Status, now, k.key, k.fingerprint, k.expiresAt))
		if err != nil {
			return nil, err
		}
		if err := recordOrderKey(ctx, q, sc, k, o, http.StatusCreated); err != nil {
			return nil, err
		}
		return orderReply(http.StatusCreated, o.ID, o.render()), nil
	})
	if k.key != nil {
		s.orderKeyWritten(r.Context())
	}
}

// putOrder is PUT /v1/orders/{id}: a full replace, 201 + Location when it created the
// order, 200 when it replaced it. A key is optional (SPEC §2) and honoured when sent.
func (s *Server) putOrder(w http.ResponseWriter, r *http.Request) {
	arrival := s.now()
	id := r.PathValue("id")
	if !orderID.MatchString(id) {
		writeAPIError(w, invalid("id", "an order id is ord_ followed by 1 to 64 letters, digits or underscores"))
		return
	}
	in, body, ok := readOrder(w, r)
	if !ok {
		return
	}
	k := s.keyOf(r, body, arrival)
	sc, now := scope(r), s.now().Unix()
	s.mutate(w, r, func(ctx context.Context, q querier) (reply, error) {
		if out, err := s.orderBackstop(ctx, r, q, sc, k); out != nil || err != nil {
			return out, err
		}
		// Replace first; when there is nothing to replace insert, and when a
		// concurrent PUT inserted it meanwhile (the insert does nothing), replace that.
		for range 2 {
			status := http.StatusOK
			o, err := scanOrder(q.queryRow(ctx, "order_replace", sc, id, in.Amount, in.Currency, in.Description, in.Status, now, k.key, k.fingerprint, k.expiresAt))
			if errors.Is(err, errNoRows) {
				status = http.StatusCreated
				o, err = scanOrder(q.queryRow(ctx, "order_insert", sc, id, in.Amount, in.Currency, in.Description, in.Status, now, k.key, k.fingerprint, k.expiresAt))
			}
			switch {
			case errors.Is(err, errNoRows):
				continue // a concurrent PUT created it meanwhile: replace that
			case err != nil:
				return nil, err
			}
			if err := recordOrderKey(ctx, q, sc, k, o, status); err != nil {
				return nil, err
			}
			return orderReply(status, id, o.render()), nil
		}
		return nil, errKeyConflict // the order kept appearing and disappearing: retry
	})
	if k.key != nil {
		s.orderKeyWritten(r.Context())
	}
}

// orderKey is a row of order_keys: a key that wrote an order, and what it answered.
type orderKey struct {
	OrderID     string
	Fingerprint *string
	ExpiresAt   int64
	Status      int
	Body        []byte // nil for a key recorded before order_keys kept responses
}

// recordOrderKey queues, in the write's transaction, the row of order_keys of a keyed
// request that wrote the order o and answers status with o as it is now.
func recordOrderKey(ctx context.Context, q querier, sc string, k keyInfo, o *order, status int) error {
	if k.key == nil {
		return nil
	}
	_, err := q.exec(ctx, "order_key_insert", sc, *k.key, o.ID, k.fingerprint, *k.expiresAt, status, o.render())
	return err
}

// orderReply is the answer of a write of order id: 201 + Location when it created the
// order, 200 when it replaced it.
func orderReply(status int, id string, body []byte) reply {
	if status == http.StatusCreated {
		return jsonReply(status, body, "Location", orderLocation(id))
	}
	return jsonReply(status, body)
}

// orderBackstop answers a keyed request whose key already wrote an order although the
// idempotency record did not know it (a store without §7 lost it, or a lapsed lease
// was taken over): the same request gets its first answer, kept in order_keys whatever
// became of the order since (replaced, deleted); another request gets key_reused. It
// returns a nil reply when the key wrote nothing, retiring a key whose record expired.
func (s *Server) orderBackstop(ctx context.Context, r *http.Request, q querier, sc string, k keyInfo) (reply, error) {
	if k.key == nil {
		return nil, nil
	}
	var prev orderKey
	err := q.queryRow(ctx, "order_key_get", sc, *k.key).Scan(&prev.OrderID, &prev.Fingerprint, &prev.ExpiresAt, &prev.Status, &prev.Body)
	switch {
	case errors.Is(err, errNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	case keyExpired(&prev.ExpiresAt, s.now()):
		// The key's record expired: the key starts a new operation (SPEC §8).
		_, err := q.exec(ctx, "order_key_retire", sc, *k.key)
		return nil, err
	case !sameRequest(prev.Fingerprint, *k.fingerprint):
		return s.keyReused(r), nil
	case prev.Body != nil:
		return orderReply(prev.Status, prev.OrderID, prev.Body), nil
	}
	// A key recorded before order_keys kept responses: the order as it is now.
	o, err := scanOrder(q.queryRow(ctx, "order_get", sc, prev.OrderID))
	switch {
	case errors.Is(err, errNoRows):
		return func(w http.ResponseWriter) { writeAPIError(w, errOrderDeleted()) }, nil
	case err != nil:
		return nil, err
	}
	return orderReply(prev.Status, o.ID, o.render()), nil
}

// getOrder is GET /v1/orders/{id}: 200, or 404 (also for a malformed id, which cannot
// exist, and for another principal's order).
func (s *Server) getOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !orderID.MatchString(id) {
		writeAPIError(w, errNotFound("order", id))
		return
	}
	ctx, cancel := s.readCtx(r)
	defer cancel()
	o, err := scanOrder(s.db.reader().queryRow(ctx, "order_get", scope(r), id))
	switch {
	case errors.Is(err, errNoRows):
		writeAPIError(w, errNotFound("order", id))
	case err != nil:
		s.logger.WarnContext(ctx, "payments: reading an order", "err", err)
		writeAPIError(w, errUnavailable())
	default:
		writeJSON(w, http.StatusOK, o.render())
	}
}

// deleteOrder is DELETE /v1/orders/{id}: 204 whether or not the principal had such an
// order (SPEC §2: deleting what is gone is not an error). A malformed id names no order
// either, so it is 204 too, without touching the database.
func (s *Server) deleteOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	noContent := func(w http.ResponseWriter) { w.WriteHeader(http.StatusNoContent) }
	if !orderID.MatchString(id) {
		noContent(w)
		return
	}
	sc := scope(r)
	s.mutate(w, r, func(ctx context.Context, q querier) (reply, error) {
		if _, err := q.exec(ctx, "order_delete", sc, id); err != nil {
			return nil, err
		}
		return noContent, nil
	})
}
