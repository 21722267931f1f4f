package postgres

import (
	"cmp"
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lazyTx is the pgx.Tx that InTx hands the application. Its BEGIN is not sent until
// the first statement, and then it goes in the same round trip as that statement (a
// batch begun with pgx's Batch.BeginTx: BEGIN, the statement). A lease-path request is
// then three round trips (the claim; BEGIN with the handler's first statement; the
// completion with COMMIT) instead of four, and a function that runs no statement pays
// for no BEGIN: its completion's batch carries it.
//
// No statement can run outside the transaction it is in: a method that could reach the
// connection otherwise (Conn, CopyFrom, Prepare, LargeObjects, a nested Begin, a
// statement whose first argument is a pgx.QueryExecMode, which a batch cannot carry,
// an Exec without arguments, which pgx sends as a simple query of maybe several)
// begins the transaction first, in a round trip of its own, and a connection whose
// BEGIN failed is closed, so that what is sent on it fails rather than autocommits.
// TestNoStatementOfInTxRunsOutsideIt runs each of them and rolls back.
type lazyTx struct {
	ctx  context.Context // InTx's, for Conn and LargeObjects, which take none
	conn *pgxpool.Conn

	mu     sync.Mutex
	tx     pgx.Tx // pgx's transaction, once BEGIN was sent
	closed bool   // Commit or Rollback ended it before it began
}

var _ pgx.Tx = (*lazyTx)(nil)

var txOptions = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// begin begins the transaction in a round trip of its own, for what cannot carry its
// BEGIN: after it, t.tx is pgx's.
func (t *lazyTx) begin(ctx context.Context) (pgx.Tx, error) {
	switch {
	case t.tx != nil:
		return t.tx, nil
	case t.closed:
		return nil, pgx.ErrTxClosed
	}
	tx, err := t.conn.BeginTx(ctx, txOptions)
	if err != nil {
		t.poison()
		t.closed = true
		return nil, err
	}
	t.tx = tx
	return tx, nil
}

// poison closes the connection when it is outside a transaction although the
// application's function is still running (its BEGIN failed), so that nothing sent on
// it afterwards (through Conn) runs on its own. The pool discards the connection when
// InTx releases it.
func (t *lazyTx) poison() {
	if c := t.conn.Conn(); c.PgConn().TxStatus() == 'I' {
		_ = c.Close(context.WithoutCancel(t.ctx))
	}
}

// batchable reports whether a statement with args can be queued on a pgx.Batch: a
// batch takes no per-statement QueryExecMode or result formats.
func batchable(args []any) bool {
	if len(args) == 0 {
		return true
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// sendWithBegin sends BEGIN and queries in one batch, keeps the transaction it began,
// and returns the batch with BEGIN's result read.
func (t *lazyTx) sendWithBegin(ctx context.Context, queries []*pgx.QueuedQuery) pgx.BatchResults {
	b := &pgx.Batch{}
	b.BeginTx(txOptions)
	b.QueuedQueries = append(b.QueuedQueries, queries...)
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		err = cmp.Or(br.Close(), err)
		t.poison()
		return pgx.FailedBatchResults(&pgx.Batch{}, err)
	}
	return br
}

// first reports whether the statement is the first and can carry the BEGIN.
func (t *lazyTx) first(args []any) bool { return t.tx == nil && !t.closed && batchable(args) }

// Exec runs sql in the transaction; the first statement carries its BEGIN.
func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// An Exec without arguments goes alone: pgx sends it as a simple query, which may
	// hold several statements, and a batch's extended protocol takes one.
	if t.first(args) && len(args) > 0 {
		br := t.sendWithBegin(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
		tag, err := br.Exec()
		return tag, cmp.Or(err, br.Close())
	}
	tx, err := t.begin(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

// Query runs sql in the transaction; the first statement carries its BEGIN.
func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.first(args) {
		br := t.sendWithBegin(ctx, []*pgx.QueuedQuery{{SQL: sql, Arguments: args}})
		rows, err := br.Query()
		if err != nil {
			return nil, cmp.Or(br.Close(), err)
		}
		return &batchRows{Rows: rows, br: br}, nil
	}
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Query(ctx, sql, args...)
}

// QueryRow runs sql in the transaction and returns its first row, as pgx's.
func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := t.Query(ctx, sql, args...)
	return &lazyRow{rows: rows, err: err}
}

// SendBatch sends b in the transaction; a first batch carries its BEGIN.
func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tx == nil && !t.closed {
		return t.sendWithBegin(ctx, b.QueuedQueries)
	}
	tx, err := t.begin(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return tx.SendBatch(ctx, b)
}

// CopyFrom begins the transaction first, then copies in it.
func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tx, err := t.begin(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

// Prepare begins the transaction first, then prepares in it.
func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

// Begin begins the transaction first, then a savepoint in it, as pgx's.
func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tx, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

// LargeObjects begins the transaction first. pgx's LargeObjects returns no error: a
// transaction that cannot begin fails loudly instead (InTx rolls back and raises the
// panic again; the middleware releases the key).
func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	t.mu.Lock()
	defer t.mu.Unlock()
	tx, err := t.begin(t.ctx)
	if err != nil {
		panic("postgres: InTx: LargeObjects: the transaction could not begin: " + err.Error())
	}
	return tx.LargeObjects()
}

// Conn returns the connection with the transaction begun on it: a statement sent on
// it directly runs inside the transaction, never on its own.
func (t *lazyTx) Conn() *pgx.Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, _ = t.begin(t.ctx) // a failure closed the connection: what is sent on it fails
	return t.conn.Conn()
}

// Commit commits; a transaction that never began has nothing to commit.
func (t *lazyTx) Commit(ctx context.Context) error { return t.end(ctx, pgx.Tx.Commit) }

// Rollback rolls back; a transaction that never began has nothing to roll back.
func (t *lazyTx) Rollback(ctx context.Context) error { return t.end(ctx, pgx.Tx.Rollback) }

// end ends the transaction with pgx's Commit or Rollback, or, when it never began,
// closes it without a round trip.
func (t *lazyTx) end(ctx context.Context, with func(pgx.Tx, context.Context) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tx == nil {
		if t.closed {
			return pgx.ErrTxClosed
		}
		t.closed = true
		return nil
	}
	return with(t.tx, ctx)
}

// batchRows are the rows of a statement sent with BEGIN: once they end or are closed,
// the batch is closed too.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closeErr error
	done     bool
}

func (r *batchRows) closeBatch() {
	if !r.done {
		r.done = true
		r.Rows.Close()
		r.closeErr = r.br.Close()
	}
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.closeBatch()
	return false
}

func (r *batchRows) Close() { r.closeBatch() }

func (r *batchRows) Err() error { return cmp.Or(r.Rows.Err(), r.closeErr) }

// lazyRow is QueryRow's row: the first row of the rows, scanned, then the rows closed,
// as pgx's own.
type lazyRow struct {
	rows pgx.Rows
	err  error
}

func (r *lazyRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
