package postgres_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/postgres"

	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
)

// bouncerPoolSize is the server connections of the tests' PgBouncer: more than a
// conformance case holds at once (a transaction holding a lock, another waiting for
// it), few enough for the shared server's stock max_connections.
const bouncerPoolSize = 8

// eachConnection runs test once for each way to reach PostgreSQL that the store must
// work through, in parallel subtests: each of pgx's exec modes (pgx's own convention,
// pgxtest.AllQueryExecModes), those that a transaction pooler allows
// (pgtest.PoolerModes) behind a private PgBouncer in transaction mode, the others
// straight to the server, and a URL that names no mode behind that PgBouncer (the
// pool finds it and switches, ConfigurePool). Every mode runs once: a mode that works
// through the pooler works without it. via makes the store's URL of a database URL.
func eachConnection(t *testing.T, test func(t *testing.T, via func(dbURL string) string)) {
	t.Run("pgbouncer_no_mode", func(t *testing.T) {
		t.Parallel()
		bounced := pgtest.Bouncer(t, testenv.PostgresURL(t), bouncerPoolSize)
		test(t, func(string) string { return bounced })
	})
	for _, mode := range pgtest.ExecModes {
		if slices.Contains(pgtest.PoolerModes, mode) {
			t.Run("pgbouncer_"+mode, func(t *testing.T) {
				t.Parallel()
				bounced := pgtest.Bouncer(t, testenv.PostgresURL(t), bouncerPoolSize)
				test(t, func(string) string { return pgtest.WithExecMode(t, bounced, mode) })
			})
			continue
		}
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			test(t, func(dbURL string) string { return pgtest.WithExecMode(t, dbURL, mode) })
		})
	}
}

// TestRespondBehindATransactionPooler sends concurrent requests through Respond (a
// ClaimInHandler route and a lease route) and InTx behind a PgBouncer in transaction
// mode with two server connections, in each exec mode a pooler allows: new keys,
// replays that another process's route sends through the handler (the transaction that
// stops at the record, then the claim), and duplicates. Every request is answered 201,
// once per key. Respond used to prepare statements by name on its connections, which
// a transaction pooler does not keep: 503s and 500s ("prepared statement … does not
// exist", "… already exists").
func TestRespondBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	for _, mode := range pgtest.PoolerModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			bounced := pgtest.WithExecMode(t, pgtest.Bouncer(t, testenv.PostgresURL(t), 2), mode)
			s := newStoreVia(t, postgres.Config{MaxConns: 6, DisableCleaner: true}, func(string) string { return bounced })
			table := s.table("rows")
			if _, err := s.Pool().Exec(t.Context(), `CREATE TABLE `+table+` (key text PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			route := func() (inHandler, lease, inTx http.Handler) {
				m := idem.New(idem.Config{Store: s.Store, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
				return m.Route(idem.RouteOptions{ClaimInHandler: true})(rowHandler(s.Store, table)),
					m.Handler(rowHandler(s.Store, table)),
					m.Handler(insertingHandler(s.Store, txHelpers[0], table))
			}
			inHandler, lease, inTx := route()
			otherInHandler, _, _ := route() // another process's: it does not know the keys
			const rounds, perRound = 4, 8
			var keys []string
			for round := range rounds {
				var wg sync.WaitGroup
				errs := make(chan string, 4*perRound)
				for i := range perRound {
					key := fmt.Sprintf("key-pooled-%d-%d", round, i)
					keys = append(keys, key)
					h := []http.Handler{inHandler, lease, inTx}[i%3]
					for _, send := range []http.Handler{h, h, otherInHandler} { // two duplicates, then a replay through the handler
						wg.Add(1)
						go func() {
							defer wg.Done()
							for deadline := time.Now().Add(10 * time.Second); ; {
								rec := postKey(send, key)
								if rec.Code == http.StatusConflict && strings.Contains(rec.Body.String(), "request_in_progress") && time.Now().Before(deadline) {
									continue // a duplicate while the first runs: retry it
								}
								if rec.Code != http.StatusCreated {
									errs <- fmt.Sprintf("POST %s = %d %s", key, rec.Code, rec.Body)
								}
								return
							}
						}()
					}
				}
				wg.Wait()
				close(errs)
				for e := range errs {
					t.Error(e)
				}
				if t.Failed() {
					t.FailNow()
				}
			}
			if n := countRows(t, s, table); n != len(keys) {
				t.Fatalf("%d rows for %d keys, want one each", n, len(keys))
			}
		})
	}
}

// TestCacheStatementBehindAPoolerFailsWithAHint runs pgx's default exec mode,
// cache_statement, named in the URL (so obeyed: a URL without a mode switches,
// TestAPoolerInFrontFromTheStartWithThePlainURL), behind a PgBouncer that keeps no
// prepared statements (1.18) and has one server connection: two processes' stores
// (two pools) migrate one schema, and the second one's prepare of a migration
// statement meets the first one's on that server connection, as the first try
// behind PgBouncer did. It fails as the store being unavailable (nothing happened),
// and its error says what to change.
func TestCacheStatementBehindAPoolerFailsWithAHint(t *testing.T) {
	t.Parallel()
	dbURL, schema := pgtest.Schema(t)
	bounced := pgtest.WithExecMode(t, pgtest.Bouncer(t, dbURL, 1), "cache_statement")
	var err error
	for range 2 {
		s, openErr := postgres.Open(t.Context(), bounced, postgres.Config{Schema: schema, MaxConns: 1, DisableCleaner: true})
		if openErr != nil {
			t.Fatal(openErr)
		}
		t.Cleanup(s.Close)
		if err = s.Migrate(t.Context()); err != nil {
			break
		}
	}
	if err == nil {
		t.Fatal("two pools prepared the same statements on one server connection, and neither failed: is this PgBouncer 1.21 or later with max_prepared_statements?")
	}
	if !errors.Is(err, postgres.ErrUnavailable) || !strings.Contains(err.Error(), "default_query_exec_mode=cache_describe") {
		t.Fatalf("Migrate = %v, want ErrUnavailable that names default_query_exec_mode=cache_describe", err)
	}
	t.Logf("Migrate: %v", err)
}

// TestMigrateRefusesDescribeExecBehindAPooler: describe_exec binds, in a round trip of
// its own, the unnamed statement that the round trip before it prepared, which a
// transaction pooler may have given another client meanwhile. Migrate finds the
// pooler (the server process that answers is not the one the connection was opened
// with) and refuses the mode; straight to the server it migrates.
func TestMigrateRefusesDescribeExecBehindAPooler(t *testing.T) {
	t.Parallel()
	dbURL, schema := pgtest.Schema(t)
	open := func(u string) *postgres.Store {
		s, err := postgres.Open(t.Context(), pgtest.WithExecMode(t, u, "describe_exec"), postgres.Config{Schema: schema, MaxConns: 1, DisableCleaner: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	if err := open(pgtest.Bouncer(t, dbURL, 1)).Migrate(t.Context()); !errors.Is(err, postgres.ErrModeUnsafeBehindPooler) {
		t.Fatalf("Migrate behind PgBouncer in describe_exec = %v, want ErrModeUnsafeBehindPooler", err)
	}
	if err := open(dbURL).Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate straight to the server in describe_exec = %v", err)
	}
}
