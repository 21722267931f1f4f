package postgres_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/postgres"
)

// InTx's transaction sends its BEGIN with its first statement (issue 31). Whatever the
// handler's first call on it — a statement, a batch, a COPY, a prepared statement, a
// nested transaction, a large object, a statement run on tx.Conn() directly — it runs
// inside the transaction the handler thinks it is in: the function then fails, the
// transaction rolls back, and nothing it wrote is left. A tx whose Conn handed out the
// connection before sending BEGIN would leave the row committed on its own.
func TestNoStatementOfInTxRunsOutsideIt(t *testing.T) {
	t.Parallel()
	app := newChargeApp(t, txHelpers[0])
	table := app.s.table("charges")
	insert := `INSERT INTO ` + table + ` (name) VALUES ($1)`
	ways := map[string]func(ctx context.Context, tx pgx.Tx, name string) error{
		"Exec": func(ctx context.Context, tx pgx.Tx, name string) error {
			_, err := tx.Exec(ctx, insert, name)
			return err
		},
		"Exec in the simple protocol": func(ctx context.Context, tx pgx.Tx, name string) error {
			_, err := tx.Exec(ctx, insert, pgx.QueryExecModeSimpleProtocol, name)
			return err
		},
		"Exec of two statements without arguments (a simple query)": func(ctx context.Context, tx pgx.Tx, name string) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (name) VALUES ('`+name+`'); SELECT 1`)
			return err
		},
		"Query": func(ctx context.Context, tx pgx.Tx, name string) error {
			rows, err := tx.Query(ctx, insert+` RETURNING name`, name)
			if err != nil {
				return err
			}
			got, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err == nil && (len(got) != 1 || got[0] != name) {
				err = errors.New("RETURNING gave " + strings.Join(got, ","))
			}
			return err
		},
		"Query read to its end without Close": func(ctx context.Context, tx pgx.Tx, name string) error {
			rows, err := tx.Query(ctx, insert+` RETURNING name`, name)
			if err != nil {
				return err
			}
			for rows.Next() {
			}
			return rows.Err()
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx, name string) error {
			var got string
			return tx.QueryRow(ctx, insert+` RETURNING name`, name).Scan(&got)
		},
		"SendBatch": func(ctx context.Context, tx pgx.Tx, name string) error {
			b := &pgx.Batch{}
			b.Queue(insert, name)
			return tx.SendBatch(ctx, b).Close()
		},
		"CopyFrom": func(ctx context.Context, tx pgx.Tx, name string) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{app.s.schema, "charges"}, []string{"name"}, pgx.CopyFromRows([][]any{{name}}))
			return err
		},
		"Prepare": func(ctx context.Context, tx pgx.Tx, name string) error {
			if _, err := tx.Prepare(ctx, "insert_charge", insert); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "insert_charge", name)
			return err
		},
		"Begin (a savepoint)": func(ctx context.Context, tx pgx.Tx, name string) error {
			nested, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := nested.Exec(ctx, insert, name); err != nil {
				return err
			}
			return nested.Commit(ctx)
		},
		"Conn": func(ctx context.Context, tx pgx.Tx, name string) error {
			_, err := tx.Conn().Exec(ctx, insert, name)
			return err
		},
		"Conn().PgConn().Exec": func(ctx context.Context, tx pgx.Tx, name string) error {
			return tx.Conn().PgConn().Exec(ctx, strings.Replace(insert, "$1", "'"+name+"'", 1)).Close()
		},
		"Conn, in the simple protocol": func(ctx context.Context, tx pgx.Tx, name string) error {
			_, err := tx.Conn().Exec(ctx, strings.Replace(insert, "$1", "'"+name+"'", 1))
			return err
		},
		"LargeObjects, then Exec": func(ctx context.Context, tx pgx.Tx, name string) error {
			lo := tx.LargeObjects()
			if _, err := lo.Create(ctx, 0); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, insert, name)
			return err
		},
	}
	boom := errors.New("boom")
	for way, write := range ways {
		name := strings.ReplaceAll(way, " ", "-")
		err := app.s.InTx(idem.WithoutKey(t.Context()), func(ctx context.Context, tx pgx.Tx) error {
			if err := write(ctx, tx, name); err != nil {
				return err
			}
			// The write is visible inside the transaction: it ran, and in it.
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE name = $1`, name).Scan(&n); err != nil || n != 1 {
				t.Errorf("%s: the transaction sees %d rows (%v), want its own 1", way, n, err)
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Errorf("%s: InTx = %v, want the function's error", way, err)
		}
	}
	if names := app.charges(t); len(names) != 0 {
		t.Fatalf("rows left by functions that failed: %q; each should have rolled back with its transaction", names)
	}
}

// A lease-route request whose handler's first call on the transaction is tx.Conn()
// completes its record in the same transaction as that write: the charge and the
// stored response commit together, and the replay runs nothing.
func TestInTxOnConnCommitsWithTheRecord(t *testing.T) {
	t.Parallel()
	app := newChargeApp(t, txHelpers[0])
	m := idem.New(idem.Config{Store: app.s.Store, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	runs := 0
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		err := app.s.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Conn().Exec(ctx, `INSERT INTO `+app.s.table("charges")+` (name) VALUES ($1)`, "on-conn"); err != nil {
				return err
			}
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	for i := range 2 {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "key-on-conn")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			t.Fatalf("request %d = %d %s", i, rec.Code, rec.Body)
		}
	}
	if names := app.charges(t); runs != 1 || len(names) != 1 {
		t.Fatalf("%d runs, charges %q; want one run and one charge", runs, names)
	}
}

// TestInTxFirstStatementFailure: a first statement that fails (with BEGIN in its
// round trip) rolls back, and leaves the pool's connections usable.
func TestInTxFirstStatementFailure(t *testing.T) {
	t.Parallel()
	s := newStoreWith(t, postgres.Config{MaxConns: 1, DisableCleaner: true})
	table := s.table("lazy")
	if _, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+table+` (name text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	ctx := idem.WithoutKey(t.Context())
	for range 3 {
		err := s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (name) VALUES ($1::int::text)`, "not a number")
			return err
		})
		if err == nil {
			t.Fatal("InTx with a failing statement = nil")
		}
		var missing string
		err = s.InTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT name FROM `+table+` WHERE name = $1`, "x").Scan(&missing)
		})
		if !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("QueryRow of no row = %v, want pgx.ErrNoRows", err)
		}
	}
	var status string
	if err := s.Pool().QueryRow(t.Context(), `SELECT 'idle'`).Scan(&status); err != nil {
		t.Fatalf("the pool after failed transactions: %v", err)
	}
}

// TestInTxWithoutStatementsCompletesTheRecord: a handler that writes its response but
// runs no statement still gets its record completed (BEGIN goes with the completion
// and COMMIT): the claim and that one round trip.
func TestInTxWithoutStatementsCompletesTheRecord(t *testing.T) {
	t.Parallel()
	b := newCountingBundle(t)
	m := idem.New(idem.Config{
		Store: b.s,
		Scope: func(*http.Request) (string, error) { return "user-1", nil },
	})
	handler := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := b.s.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	post := poster(handler)
	if code := post("key-warm-up"); code != http.StatusCreated {
		t.Fatalf("warm-up request = %d", code)
	}
	b.wantTrips("request whose InTx runs no statement", 2, func() {
		if code := post("key-counted"); code != http.StatusCreated {
			t.Fatalf("request = %d", code)
		}
	})
	b.wantTrips("its replay", 1, func() {
		if code := post("key-counted"); code != http.StatusCreated {
			t.Fatalf("replay = %d", code)
		}
	})
}
