package main

import (
	"context"
	"errors"
	"flag"
	"log/slog"
	"net/http"
	"net/http/pprof"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/minimal"
	"github.com/idem-go/idem/store/postgres"
)

// The minimal handler of issue 13 (internal/minimal): it reads {"id", "amount"}, INSERTs
// one row and answers 201 with it. One server serves it on every path, all on one pgxpool, so that a run
// compares them side by side:
//
//	POST /plain         no idempotency
//	POST /respond       the README's path: ClaimInHandler + Respond (one round trip)
//	POST /lease         the lease path: the middleware claims, then Respond (two)
//	POST /intx          the lease path with InTx, the writes interactive (four)
//	POST /cached        /respond with the replay cache
//	GET  /items/{id}    the baseline of replays: a read by primary key
//	POST /admin/reset   closes the pool's connections (benchtool minimal's cost meter)
//
// getItem is the read of GET /items/{id}.
const getItem = `SELECT amount FROM bench_items WHERE scope = $1 AND id = $2`

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
	st, err := minimal.Open(ctx, *dbURL, *conns)
	if err != nil {
		return err
	}
	defer st.Close()
	s := &server{st: st}
	quiet := slog.New(slog.DiscardHandler)
	cfg := idem.Config{Store: st, Scope: minimal.BearerScope, Logger: quiet}
	mw := idem.New(cfg)
	cfg.ReplayCacheSize = *cache
	cached := idem.New(cfg)
	inHandler := idem.RouteOptions{ClaimInHandler: true}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /plain", s.plain)
	mux.Handle("POST /respond", mw.Route(inHandler)(minimal.Respond(st)))
	mux.Handle("POST /lease", mw.Handler(minimal.Respond(st)))
	mux.Handle("POST /intx", mw.Handler(minimal.InTx(st)))
	mux.Handle("POST /cached", cached.Route(inHandler)(minimal.Respond(st)))
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

	return minimal.Serve(ctx, "benchtool serve", *addr, mux)
}

// plain is the handler without idempotency: the INSERT on its own, then 201.
func (s *server) plain(w http.ResponseWriter, r *http.Request) {
	in, sc, _, ok := minimal.Read(w, r)
	if !ok {
		return
	}
	if _, err := s.st.Pool().Exec(r.Context(), minimal.InsertItem, sc, in.ID, in.Amount); err != nil {
		http.Error(w, `{"error":"conflict"}`, http.StatusConflict)
		return
	}
	minimal.WriteItem(w, http.StatusCreated, in)
}

// get reads an item by its primary key.
func (s *server) get(w http.ResponseWriter, r *http.Request) {
	sc, err := minimal.BearerScope(r)
	if err != nil {
		http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
		return
	}
	it := minimal.Item{ID: r.PathValue("id"), Object: "item"}
	switch err := s.st.Pool().QueryRow(r.Context(), getItem, sc, it.ID).Scan(&it.Amount); {
	case errors.Is(err, pgx.ErrNoRows):
		http.Error(w, `{"error":"not found"}`, http.StatusNotFound)
	case err != nil:
		http.Error(w, `{"error":"unavailable"}`, http.StatusServiceUnavailable)
	default:
		minimal.WriteItem(w, http.StatusOK, it)
	}
}
