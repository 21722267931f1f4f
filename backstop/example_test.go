package backstop_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/backstop"
	"github.com/idem-go/idem/store/redis"
)

// Records in Redis, charges in PostgreSQL: the charge's INSERT and the key's backstop
// row commit together, so a retry after Redis lost the record is answered the first
// response instead of charging again. (Needs Redis and PostgreSQL, so the example is
// compiled, not run.)
func Example() {
	ctx := context.Background()
	store, err := redis.Open(ctx, "redis://127.0.0.1:6379/0", redis.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool) // database/sql on pgx's pool
	bs, err := backstop.New(db, backstop.Config{Dialect: backstop.Postgres})
	if err != nil {
		log.Fatal(err)
	}
	if err := bs.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	createCharge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := bs.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			var id int64
			err := tx.QueryRowContext(ctx, `INSERT INTO charges (amount) VALUES (2000) RETURNING id`).Scan(&id)
			if err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, map[string]any{"id": fmt.Sprintf("ch_%d", id), "object": "charge", "amount": 2000})
		})
		if err != nil { // the insert failed: nothing committed, nothing was sent
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
	})
	mw := idem.New(idem.Config{
		Store: store,
		Scope: func(r *http.Request) (string, error) { return "user-1", nil }, // the authenticated principal
	})
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mw.Handler(createCharge)))
}
