package payments

import (
	"context"
	"database/sql"
	"errors"
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
)

// write runs the writes of a creation (POST /v1/charges, POST /v1/orders) in one
// transaction with the key's record, and sends its reply, the README's way: the
// store's Respond (SPEC §7), whose function returns the reply instead of writing it.
//
// On PostgreSQL the writes are known before they run: queue adds them to Respond's
// pipelined transaction, whose reply out does not depend on what they return (on a
// ClaimInHandler route the claim, the writes, the completed record and COMMIT are one
// round trip). When a write meets an object the key wrote before (its record was
// lost, or expired: a unique violation), nothing committed, and the request is
// answered through mutate, whose read-then-write transaction (fn) explains the
// conflict. On SQLite fn runs inside Respond's transaction itself (no round trips to
// save). Without the store's helpers (a DB of its own, beside a Redis store) the
// writes run in a plain transaction and the middleware completes the record after
// the handler.
func (s *Server) write(w http.ResponseWriter, r *http.Request, out reply, queue func(b *pgx.Batch), fn mutation) {
	var err error
	switch d := s.db; {
	case d.pgStore != nil:
		err = d.pgStore.Respond(w, r, func(b *pgx.Batch) (*idem.Response, error) {
			queue(b)
			return recordReply(out), nil
		})
		if errors.Is(interpretError(err), errKeyConflict) {
			s.mutate(w, r, fn)
			return
		}
	case d.sqliteStore != nil:
		err = d.sqliteStore.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			got, err := fn(ctx, sqlQuerier{db: tx, queries: d.queries})
			if err != nil {
				return nil, err
			}
			return recordReply(got), nil
		})
		if errors.Is(interpretError(err), errKeyConflict) {
			// Another execution of this key is inserting right now (its idempotency
			// record was lost); its outcome is replayed by the backstop on retry.
			idem.WriteError(w, r, s.cfg.Profile, idem.CodeRequestInProgress, "")
			return
		}
	case d.dialect == dialectPostgres && !d.completes:
		if err = d.plainBatch(r.Context(), queue); err == nil {
			out(w)
			return
		}
		if errors.Is(interpretError(err), errKeyConflict) {
			s.mutate(w, r, fn)
			return
		}
	default:
		s.mutate(w, r, fn)
		return
	}
	if err != nil {
		s.logger.WarnContext(r.Context(), "payments: transaction failed", "err", err)
		writeAPIError(w, errUnavailable())
	}
}

// plainBatch runs the statements queue adds in one READ COMMITTED transaction, one
// round trip: BEGIN, the statements and COMMIT, pipelined. It completes no record.
// (SET TRANSACTION in a pipeline without BEGIN draws a WARNING from the server, a line
// in its log per request.) A transaction that failed is rolled back before the
// connection goes back to the pool.
func (d *DB) plainBatch(ctx context.Context, queue func(b *pgx.Batch)) error {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	queue(b)
	b.Queue("COMMIT")
	err = conn.SendBatch(ctx, b).Close()
	if pc := conn.Conn().PgConn(); err != nil && pc.TxStatus() != 'I' {
		if _, rbErr := pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").ReadAll(); rbErr != nil {
			_ = pc.Close(context.WithoutCancel(ctx))
		}
	}
	return err
}
