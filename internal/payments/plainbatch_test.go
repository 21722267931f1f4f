package payments

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/internal/pgtest"
)

// A plain batch (a request without a key, or the API without idempotency) is one READ
// COMMITTED transaction that draws no notice from the server: it opened with SET
// TRANSACTION, which PostgreSQL answers in a pipeline without BEGIN with a WARNING, a
// line in its log per request. A batch that fails leaves the connection idle.
func TestPlainBatchDrawsNoNoticeAndRollsBackAFailure(t *testing.T) {
	t.Parallel()
	dbURL, schema := pgtest.Schema(t)
	var notices pgtest.Notices
	pool := pgtest.Pool(t, pgtest.SearchPathURL(t, dbURL, schema), 1, notices.Hook)
	if _, err := pool.Exec(t.Context(), `CREATE TABLE plain (k text PRIMARY KEY, isolation text)`); err != nil {
		t.Fatal(err)
	}
	d := NewPostgresDB(pool, nil)
	insert := func(k string) error {
		return d.plainBatch(t.Context(), func(b *pgx.Batch) {
			b.Queue(`INSERT INTO plain VALUES ($1, current_setting('transaction_isolation'))`, k)
		})
	}
	if err := insert("a"); err != nil {
		t.Fatal(err)
	}
	if err := insert("a"); err == nil {
		t.Fatal("a duplicate key did not fail")
	}
	if err := insert("b"); err != nil { // on the same, only, connection
		t.Fatalf("after a failed batch: %v", err)
	}
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM plain WHERE isolation = 'read committed'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d rows written at READ COMMITTED, want 2 (%v)", n, err)
	}
	if n := notices.Take(); len(n) > 0 {
		t.Fatalf("the server sent %d notices, want none: %q", len(n), n)
	}
}
