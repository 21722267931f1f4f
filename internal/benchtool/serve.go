package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/postgres"
)

// The minimal handler of issue 13: it reads {"id", "amount"}, INSERTs one row and answers
// 201 with it. One server serves it on every path, all on one pgxpool, so that a run
// compares them side by side:
//
//	POST /plain         no idempotency
//	POST /respond       the README's path: ClaimInHandler + Respond (one round trip)
//	POST /lease         the lease path: the middleware claims, then Respond (two)
//	POST /intx          the lease path with InTx, the writes interactive (four)
//	POST /cached        /respond with the replay cache
//	GET  /items/{id}    the baseline of replays: a read by primary key
//	POST /admin/reset   closes the pool's connections (benchtool minimal's cost meter)
const itemsTable = `CREATE TABLE IF NOT EXISTS bench_items (
	scope  text   NOT NULL,
	id     text   NOT NULL,
	amount bigint NOT NULL,
	PRIMARY KEY (scope, id)
)`

const (
	insertItem = `INSERT INTO bench_items (scope, id, amount) VALUES ($1, $2, $3)`
	getItem    = `SELECT amount FROM bench_items WHERE scope = $1 AND id = $2`
)

// item is the minimal handler's object.
type item struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Amount int64  `json:"amount"`
}

type server struct {
	st *postgres.Store
}

func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	dbURL := fs.String("db", "", "PostgreSQL URL of the store and the items (required)")
	addr := fs.String("addr", "127.0.0.1:0", "where to listen; the start line on stderr names the real address")
	conns := fs.Int("pool", 32, "connections in the pool that every path shares")
	cache := fs.Int("replay-cache", 10000, "entries of the replay cache of /cached")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("--db is required")
	}
	st, err := postgres.Open(ctx, *dbURL, postgres.Config{MaxConns: *conns})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		return err
	}
	if _, err := st.Pool().Exec(ctx, itemsTable); err != nil {
		return err
	}
	s := &server{st: st}
	quiet := slog.New(slog.DiscardHandler)
	cfg := idem.Config{Store: st, Scope: bearerScope, Logger: quiet}
	mw := idem.New(cfg)
	cfg.ReplayCacheSize = *cache
	cached := idem.New(cfg)
	inHandler := idem.RouteOptions{ClaimInHandler: true}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /plain", s.plain)
	mux.Handle("POST /respond", mw.Route(inHandler)(http.HandlerFunc(s.respond)))
	mux.Handle("POST /lease", mw.Handler(http.HandlerFunc(s.respond)))
	mux.Handle("POST /intx", mw.Handler(http.HandlerFunc(s.inTx)))
	mux.Handle("POST /cached", cached.Route(inHandler)(http.HandlerFunc(s.respond)))
	mux.HandleFunc("GET /items/{id}", s.get)
	// Closes every connection of the pool, so that their backends exit and report their
	// counts (benchtool minimal's cost meter); the next requests open new ones.
	// The profiles of the server, to see where a path's time goes (go tool pprof).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("POST /admin/reset", func(w http.ResponseWriter, r *http.Request) {
		st.Pool().Reset()
		w.WriteHeader(http.StatusNoContent)
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(os.Stderr, "benchtool serve listening addr=%s\n", ln.Addr())
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

// bearerScope is the principal: hex SHA-256 of the bearer token, as the payments API
// scopes keys (64 bytes of every key in the store's index).
func bearerScope(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", errors.New("no bearer token")
	}
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:]), nil
}

// read parses the request's item and its principal, or answers 400/401.
func read(w http.ResponseWriter, r *http.Request) (item, string, bool) {
	sc, err := bearerScope(r)
	if err != nil {
		http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
		return item{}, "", false
	}
	var in item
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err == nil {
		err = json.Unmarshal(body, &in)
	}
	if err != nil || in.ID == "" {
		http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
		return item{}, "", false
	}
	in.Object = "item"
	return in, sc, true
}

func writeItem(w http.ResponseWriter, status int, it item) {
	b, _ := json.Marshal(it)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// plain is the handler without idempotency: the INSERT on its own, then 201.
func (s *server) plain(w http.ResponseWriter, r *http.Request) {
	in, sc, ok := read(w, r)
	if !ok {
		return
	}
	if _, err := s.st.Pool().Exec(r.Context(), insertItem, sc, in.ID, in.Amount); err != nil {
		http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
		return
	}
	writeItem(w, http.StatusCreated, in)
}

// respond is the handler through the store's Respond: it returns the 201 instead of
// writing it.
func (s *server) respond(w http.ResponseWriter, r *http.Request) {
	in, sc, ok := read(w, r)
	if !ok {
		return
	}
	err := s.st.Respond(w, r, func(b *pgx.Batch) (*idem.Response, error) {
		b.Queue(insertItem, sc, in.ID, in.Amount)
		return idem.JSONResponse(http.StatusCreated, in)
	})
	if err != nil {
		http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
	}
}

// inTx is the handler through InTx: the INSERT and the 201 inside its function.
func (s *server) inTx(w http.ResponseWriter, r *http.Request) {
	in, sc, ok := read(w, r)
	if !ok {
		return
	}
	err := s.st.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertItem, sc, in.ID, in.Amount); err != nil {
			return err
		}
		writeItem(w, http.StatusCreated, in)
		return nil
	})
	if err != nil {
		http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
	}
}

// get reads an item by its primary key.
func (s *server) get(w http.ResponseWriter, r *http.Request) {
	sc, err := bearerScope(r)
	if err != nil {
		http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
		return
	}
	it := item{ID: r.PathValue("id"), Object: "item"}
	switch err := s.st.Pool().QueryRow(r.Context(), getItem, sc, it.ID).Scan(&it.Amount); {
	case errors.Is(err, pgx.ErrNoRows):
		http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
	case err != nil:
		http.Error(w, `{"error":"unavailable"}`, http.StatusServiceUnavailable)
	default:
		writeItem(w, http.StatusOK, it)
	}
}
