// Command abserve is the minimal handler of scripts/bench-ab: one INSERT, 201, behind
// the library on the paths a user takes, and behind a hand-written idempotency floor.
// It uses only the public API of the previous release (v0.2.0), as internal/minimal
// does, so that scripts/bench-ab can copy both directories into a worktree of that
// release and build the same handler against it, and against the current tree. It is
// a tool of the repository, not a product:
//
//	POST /respond          the README's path: ClaimInHandler + Respond (one round trip)
//	POST /lease            the lease path: the middleware claims, then Respond
//	POST /intx             the lease path: the middleware claims, then InTx
//	POST /floor            no library: the claim (one INSERT, its own transaction), then
//	                       BEGIN, the item's INSERT, the completion (one UPDATE), COMMIT
//	POST /floor-pipelined  /floor with its second transaction sent as one batch
//
// All on one pool. Usage: abserve --db URL [--pool 32]; the line "abserve listening
// addr=HOST:PORT" on stderr says where it listens.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/minimal"
	"github.com/idem-go/idem/store/postgres"
)

// The floor's table and statements. floor_records is the least a
// hand-written idempotency record needs: the key, a fingerprint, a state, a token and
// a lease while in flight, the response once completed, and its expiry.
const (
	floorTable = `CREATE TABLE IF NOT EXISTS floor_records (
	scope           bytea       NOT NULL,
	key             bytea       NOT NULL,
	fingerprint     bytea       NOT NULL,
	state           text        NOT NULL,
	lock_token      text,
	lease_end       timestamptz,
	response_status integer,
	response_body   bytea,
	created_at      timestamptz NOT NULL,
	expires_at      timestamptz NOT NULL,
	PRIMARY KEY (scope, key)
)`
	floorClaim = `INSERT INTO floor_records (scope, key, fingerprint, state, lock_token, lease_end, created_at, expires_at)
VALUES ($1, $2, $3, 'in_flight', $4, now() + interval '30 seconds', now(), now() + interval '24 hours')`
	floorComplete = `UPDATE floor_records
SET state = 'completed', lock_token = NULL, lease_end = NULL, response_status = $4, response_body = $5
WHERE scope = $1 AND key = $2 AND lock_token = $3 AND state = 'in_flight'`
	// floorCompleteFenced is floorComplete that fails (division by zero) when it
	// updated nothing, aborting the transaction before the COMMIT queued behind it.
	floorCompleteFenced = `WITH done AS (` + floorComplete + ` RETURNING 1)
SELECT 1 / (SELECT count(*)::integer FROM done)`
)

type server struct {
	st   *postgres.Store
	pool *pgxpool.Pool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "abserve:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	dbURL := flag.String("db", "", "PostgreSQL URL of the store, the items and the floor's records (required)")
	conns := flag.Int("pool", 32, "connections in the pool that every path shares")
	flag.Parse()
	st, err := minimal.Open(ctx, *dbURL, *conns)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.Pool().Exec(ctx, floorTable); err != nil {
		return err
	}
	s := &server{st: st, pool: st.Pool()}
	mw := idem.New(idem.Config{Store: st, Scope: minimal.BearerScope, Logger: slog.New(slog.DiscardHandler)})
	mux := http.NewServeMux()
	mux.Handle("POST /respond", mw.Route(idem.RouteOptions{ClaimInHandler: true})(minimal.Respond(st)))
	mux.Handle("POST /lease", mw.Handler(minimal.Respond(st)))
	mux.Handle("POST /intx", mw.Handler(minimal.InTx(st)))
	mux.HandleFunc("POST /floor", func(w http.ResponseWriter, r *http.Request) { s.floor(w, r, false) })
	mux.HandleFunc("POST /floor-pipelined", func(w http.ResponseWriter, r *http.Request) { s.floor(w, r, true) })

	return minimal.Serve(ctx, "abserve", "127.0.0.1:0", mux)
}

// floor is the least any design can do for a new key: claim it (one INSERT, committed
// on its own, so that a duplicate sees it), then write the item and complete the
// record in one transaction, fenced by the token. A key that is there already is 409;
// the floor does not replay (new keys only). pipelined sends the second transaction
// as one batch, whose completion aborts it when the token no longer holds.
func (s *server) floor(w http.ResponseWriter, r *http.Request, pipelined bool) {
	in, sc, body, ok := minimal.Read(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	scope, key := []byte(sc), []byte(r.Header.Get("Idempotency-Key"))
	fp := sha256.Sum256(body)
	var tok [16]byte
	copy(tok[:], fp[16:]) // any value unique enough for a floor: the body's hash
	token := hex.EncodeToString(tok[:])
	if _, err := s.pool.Exec(ctx, floorClaim, scope, key, fp[:], token); err != nil {
		http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
		return
	}
	resp, _ := json.Marshal(in)
	var err error
	if pipelined {
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(minimal.InsertItem, sc, in.ID, in.Amount)
		b.Queue(floorCompleteFenced, scope, key, token, http.StatusCreated, resp)
		b.Queue("COMMIT")
		err = s.pool.SendBatch(ctx, b).Close()
	} else {
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, minimal.InsertItem, sc, in.ID, in.Amount); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, floorComplete, scope, key, token, http.StatusCreated, resp)
			if err == nil && tag.RowsAffected() != 1 {
				err = errors.New("lease lost")
			}
			return err
		})
	}
	if err != nil {
		http.Error(w, `{"error":"unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	minimal.WriteItem(w, http.StatusCreated, in)
}
