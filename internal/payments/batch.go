package payments

import (
	"context"
	"database/sql"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// PostgresBatchFunc runs the statements queue adds in one transaction sent as one
// pipelined batch: store/postgres's (*Store).InTxBatch, which also completes (or, on a
// ClaimInHandler route, claims and completes) the idempotency record in it.
type PostgresBatchFunc func(ctx context.Context, queue func(b *pgx.Batch)) error

// batcher is what a store offers when it has the pipelined §7 helper.
type batcher interface {
	InTxBatch(ctx context.Context, queue func(b *pgx.Batch)) error
}

// pipelined returns how POST /v1/charges and /v1/orders run their one insert on
// PostgreSQL: BEGIN, the insert, the record's completion and COMMIT in one round trip.
// It is the store's InTxBatch when the DB shares the store's database, a plain
// pipelined transaction otherwise, and nil on SQLite. claims reports whether the
// store's transaction helper can also claim the key (RouteOptions.ClaimInHandler),
// so that POST /v1/orders claims, writes and completes in one transaction.
func pipelined(cfg Config) (batch PostgresBatchFunc, claims bool) {
	if cfg.DB.dialect != dialectPostgres {
		// store/sqlite's InTx claims on a ClaimInHandler route, in the transaction
		// the handler's read-then-write runs in.
		_, isSQLiteStore := cfg.Store.(interface {
			InTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error
		})
		return nil, isSQLiteStore && cfg.DB.completes
	}
	if st, ok := cfg.Store.(batcher); ok && cfg.DB.completes {
		return st.InTxBatch, true
	}
	return cfg.DB.plainBatch, false
}

// plainBatch runs the statements queue adds between BEGIN and COMMIT in one round
// trip, completing no record.
func (d *DB) plainBatch(ctx context.Context, queue func(b *pgx.Batch)) error {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	queue(b)
	b.Queue("COMMIT")
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // a connection left inside a transaction is closed, not reused
	err = conn.SendBatch(ctx, b).Close()
	if pc := conn.Conn().PgConn(); err != nil && pc.TxStatus() != 'I' {
		if _, rbErr := pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").ReadAll(); rbErr != nil {
			_ = pc.Close(context.WithoutCancel(ctx))
		}
	}
	return err
}

// mutateBatch is mutate for a request whose one write is known before it runs and
// whose reply does not depend on what the write returns: out is the reply of a
// successful write. It sends BEGIN, the write queued by queue, the record's completion
// and COMMIT in one round trip (with the claim too, on a ClaimInHandler route). It
// returns false, having answered nothing, when the write conflicted with an object the
// key wrote before (its record was lost, or expired): the caller then answers through
// mutate, whose read-then-write transaction explains the conflict.
func (s *Server) mutateBatch(w http.ResponseWriter, r *http.Request, out reply, queue func(b *pgx.Batch)) bool {
	h := idem.FromContext(r.Context())
	inside := s.db.CompletesRecords() && h != nil
	if inside {
		// The completion stores what the capture holds when the batch is sent.
		out(w)
	}
	err := s.batch(r.Context(), queue)
	switch {
	case err == nil:
		if !inside {
			out(w)
		}
		return true
	case errors.Is(err, idem.ErrClaimDeferred), errors.Is(err, idem.ErrKeyInProgress):
		// Nothing committed; the middleware claims the usual way (and runs this handler
		// again under a lease) or answers 409 request_in_progress.
		return true
	case errors.Is(interpretError(err), errKeyConflict) && (!inside || h.Reopen()):
		return false
	case inside:
		// The middleware answers 503 store_unavailable instead of the reply.
		s.logger.WarnContext(r.Context(), "payments: pipelined transaction failed after the response was rendered", "err", err)
		return true
	}
	s.logger.WarnContext(r.Context(), "payments: pipelined transaction failed", "err", err)
	writeAPIError(w, errUnavailable())
	return true
}
