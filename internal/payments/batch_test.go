package payments

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// On PostgreSQL POST /v1/orders claims its key in its own transaction (one round trip,
// RouteOptions.ClaimInHandler); on SQLite it takes the lease path. Either way, 25
// concurrent requests with one key create one order, and every other answer is its
// replay or 409 request_in_progress.
func TestConcurrentRetriesOfOneOrderCreateOneOrder(t *testing.T) {
	eachDB(t, func(t *testing.T, newBundle func(...option) *bundle) {
		b := newBundle()
		key := newKey()
		body := `{"amount": 100, "currency": "usd"}`
		answers := make([]string, 25)
		codes := make([]int, 25)
		var wg sync.WaitGroup
		for i := range codes {
			wg.Go(func() {
				w := b.do(req{method: "POST", path: "/v1/orders", token: "tok_a", key: key, body: body})
				codes[i], answers[i] = w.Code, w.Body.String()
			})
		}
		wg.Wait()
		var first string
		for i, c := range codes {
			switch {
			case c == http.StatusCreated && first == "":
				first = answers[i]
			case c == http.StatusCreated && answers[i] != first:
				t.Fatalf("two different orders answered 201:\n%s\n%s", first, answers[i])
			case c == http.StatusConflict && strings.Contains(answers[i], "request_in_progress"):
			case c != http.StatusCreated:
				t.Fatalf("status %d %s among %v", c, answers[i], codes)
			}
		}
		if n := countRows(t, b, "orders"); n != 1 || first == "" {
			t.Fatalf("%d orders, want exactly 1 (codes %v)", n, codes)
		}
		replay := b.do(req{method: "POST", path: "/v1/orders", token: "tok_a", key: key, body: body})
		if replay.Code != http.StatusCreated || replay.Body.String() != first || replay.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay = %d %s, want the order replayed", replay.Code, replay.Body)
		}
	})
}

// countRows counts the rows of table in the bundle's database.
func countRows(t *testing.T, b *bundle, table string) int {
	t.Helper()
	var n int
	var err error
	ctx := context.Background()
	if b.db.dialect == dialectPostgres {
		err = b.db.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n)
	} else {
		err = b.db.sqlDB.QueryRowContext(ctx, "SELECT count(*) FROM "+table).Scan(&n)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}
