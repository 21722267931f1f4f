package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
)

// A completion on the lease path writes no index entry: it is a heap-only (HOT) update
// of the row its claim inserted, since it changes no indexed column (migration 0008;
// issue 21: every completion wrote an entry in each index again, as the partial index
// of resumable records read state). PostgreSQL counts HOT updates per table; its
// backends report their counts when they exit, so the pool is closed before reading.
func TestCompletionsAreHeapOnlyUpdates(t *testing.T) {
	t.Parallel()
	dbURL, schema := pgtest.Schema(t)
	st, err := postgres.Open(t.Context(), dbURL, postgres.Config{Schema: schema, MaxConns: 2, DisableCleaner: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	const n = 100
	for i := range n {
		p := &idemstore.ClaimParams{Scope: "user-1", Key: fmt.Sprintf("key-hot-%03d", i), Token: "tok", RecordID: fmt.Sprint(i),
			Lease: time.Minute, TTL: time.Hour}
		if res, err := st.RecordClaim(t.Context(), p); err != nil || res.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("claim %d: %v %v", i, res, err)
		}
		err := st.RecordComplete(t.Context(), &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, TTL: p.TTL,
			Response: &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1","object":"charge","amount":2000,"currency":"usd"}`)}})
		if err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
	}
	st.Close() // its backends exit and report their counts

	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var upd, hot int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := conn.Exec(t.Context(), `SELECT pg_stat_clear_snapshot()`); err != nil {
			t.Fatal(err)
		}
		err := conn.QueryRow(t.Context(), `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = 'idem_records'`, schema).Scan(&upd, &hot)
		if err != nil {
			t.Fatal(err)
		}
		if upd >= n+1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling for the exited backends' reports, bounded by the deadline
	}
	// And one more: the completion of the store's state record, which Migrate wrote
	// (SPEC §20).
	if upd != n+1 || hot != n+1 {
		t.Fatalf("%d updates of idem_records, %d of them heap-only; want %d, all heap-only", upd, hot, n+1)
	}
}
