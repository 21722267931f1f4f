// Package minimal is the minimal handler of issue 13, shared by the benchmarks'
// servers (internal/benchtool serve, internal/abserve): it reads {"id", "amount"},
// INSERTs one row and answers 201 with it. It uses only the public API of the previous
// release (v0.2.0), so that scripts/bench-ab can build it against that release too.
package minimal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/postgres"
)

// ItemsTable is the handler's table; InsertItem its one write.
const (
	ItemsTable = `CREATE TABLE IF NOT EXISTS bench_items (
	scope  text   NOT NULL,
	id     text   NOT NULL,
	amount bigint NOT NULL,
	PRIMARY KEY (scope, id)
)`
	InsertItem = `INSERT INTO bench_items (scope, id, amount) VALUES ($1, $2, $3)`
)

// Open opens the store at dbURL with a pool of conns connections, migrates it and
// creates the handler's table.
func Open(ctx context.Context, dbURL string, conns int) (*postgres.Store, error) {
	if dbURL == "" {
		return nil, errors.New("--db is required")
	}
	st, err := postgres.Open(ctx, dbURL, postgres.Config{MaxConns: conns})
	if err != nil {
		return nil, err
	}
	if err := st.Migrate(ctx); err == nil {
		_, err = st.Pool().Exec(ctx, ItemsTable)
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

// Item is the minimal handler's object.
type Item struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Amount int64  `json:"amount"`
}

// BearerScope is the principal: hex SHA-256 of the bearer token, as the payments API
// scopes keys (64 bytes of every key in the store's index).
func BearerScope(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", errors.New("no bearer token")
	}
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:]), nil
}

// Read parses the request's item and its principal, or answers 400/401; body is the
// request's body.
func Read(w http.ResponseWriter, r *http.Request) (in Item, scope string, body []byte, ok bool) {
	scope, err := BearerScope(r)
	if err != nil {
		http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
		return Item{}, "", nil, false
	}
	body, err = io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil || in.ID == "" {
		http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
		return Item{}, "", nil, false
	}
	in.Object = "item"
	return in, scope, body, true
}

// WriteItem answers status with it.
func WriteItem(w http.ResponseWriter, status int, it Item) {
	b, _ := json.Marshal(it)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// Respond is the handler through the store's Respond: it returns the 201 instead of
// writing it.
func Respond(st *postgres.Store) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		in, sc, _, ok := Read(w, r)
		if !ok {
			return
		}
		err := st.Respond(w, r, func(b *pgx.Batch) (*idem.Response, error) {
			b.Queue(InsertItem, sc, in.ID, in.Amount)
			return idem.JSONResponse(http.StatusCreated, in)
		})
		if err != nil {
			http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
		}
	}
}

// InTx is the handler through InTx: the INSERT and the 201 inside its function.
func InTx(st *postgres.Store) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		in, sc, _, ok := Read(w, r)
		if !ok {
			return
		}
		err := st.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, InsertItem, sc, in.ID, in.Amount); err != nil {
				return err
			}
			WriteItem(w, http.StatusCreated, in)
			return nil
		})
		if err != nil {
			http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
		}
	}
}

// Serve serves h on addr until ctx ends, then shuts down within 5 s. Its first line on
// stderr, "NAME listening addr=HOST:PORT", says where it listens (benchtool reads it).
func Serve(ctx context.Context, name, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(os.Stderr, "%s listening addr=%s\n", name, ln.Addr())
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
