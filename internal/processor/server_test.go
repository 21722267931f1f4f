package processor

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// eachDB runs test on a processor over SQLite and over PostgreSQL (its own schema).
func eachDB(t *testing.T, test func(t *testing.T, db *DB)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		ctx := testenv.Context(t)
		st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "processor.db"), sqlite.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		test(t, migrated(t, st.Migrate, SQLite(st)))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		ctx := testenv.Context(t)
		dbURL, schema := pgtest.Schema(t)
		st, err := postgres.Open(ctx, pgtest.SearchPathURL(t, dbURL, schema), postgres.Config{MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		test(t, migrated(t, st.Migrate, Postgres(st)))
	})
}

func migrated(t *testing.T, migrateStore func(context.Context) error, db *DB) *DB {
	t.Helper()
	ctx := testenv.Context(t)
	if err := migrateStore(ctx); err != nil {
		t.Fatal(err)
	}
	// Twice: a second start finds the table there.
	for range 2 {
		if err := db.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	return db
}

// rolls returns a Rand that answers the given numbers in turn, then 0.5.
func rolls(v ...float64) func() float64 {
	var mu sync.Mutex
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		if len(v) == 0 {
			return 0.5
		}
		r := v[0]
		v = v[1:]
		return r
	}
}

func newServer(t *testing.T, cfg Config) *httptest.Server {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(New(cfg).Handler())
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	status int
	header http.Header
	body   []byte
}

func (a *answer) charge(t *testing.T) charge {
	t.Helper()
	var c charge
	if err := json.Unmarshal(a.body, &c); err != nil {
		t.Fatalf("not a charge: %v: %s", err, a.body)
	}
	return c
}

func send(t *testing.T, method, url, key, body string) (*answer, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	// A connection of its own each time: a dropped one is never reused.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	res, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	return &answer{status: res.StatusCode, header: res.Header, body: b}, nil
}

func mustSend(t *testing.T, method, url, key, body string) *answer {
	t.Helper()
	a, err := send(t, method, url, key, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return a
}

func postCharge(t *testing.T, srv *httptest.Server, key string, amount int) *answer {
	t.Helper()
	return mustSend(t, "POST", srv.URL+"/v1/processor/charges", key, `{"amount": `+itoa(amount)+`, "currency": "usd"}`)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func list(t *testing.T, srv *httptest.Server, query string) (data []charge, hasMore bool) {
	t.Helper()
	a := mustSend(t, "GET", srv.URL+"/v1/processor/charges"+query, "", "")
	if a.status != http.StatusOK {
		t.Fatalf("GET /v1/processor/charges%s: %d %s", query, a.status, a.body)
	}
	var l listJSON
	if err := json.Unmarshal(a.body, &l); err != nil || l.Object != "list" {
		t.Fatalf("not a list: %v: %s", err, a.body)
	}
	return l.Data, l.HasMore
}

func TestChargeIsMadeOnceAndReplayedToItsRetries(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *DB) {
		srv := newServer(t, Config{DB: db})
		first := postCharge(t, srv, "key_first_charge", 2000)
		if first.status != http.StatusCreated {
			t.Fatalf("want 201, got %d %s", first.status, first.body)
		}
		c := first.charge(t)
		if !strings.HasPrefix(c.ID, "pch_") || c.Object != "processor_charge" || c.Amount != 2000 ||
			c.Currency != "usd" || c.IdempotencyKey != "key_first_charge" || c.Created == 0 {
			t.Fatalf("unexpected charge %s", first.body)
		}
		again := postCharge(t, srv, "key_first_charge", 2000)
		if again.status != http.StatusCreated || string(again.body) != string(first.body) || again.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the retry was not a replay of the first charge: %d %v %s", again.status, again.header, again.body)
		}
		if data, _ := list(t, srv, ""); len(data) != 1 || data[0].ID != c.ID {
			t.Fatalf("the processor holds %v, want the one charge %s", data, c.ID)
		}
	})
}

func TestChargeWithoutKeyOrWithABadBodyIsRefused(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *DB) {
		srv := newServer(t, Config{DB: db})
		url := srv.URL + "/v1/processor/charges"
		for _, tc := range []struct{ key, body string }{
			{"", `{"amount": 100, "currency": "usd"}`},
			{"key_bad_amount", `{"amount": 0, "currency": "usd"}`},
			{"key_bad_amount2", `{"amount": 1.5, "currency": "usd"}`},
			{"key_bad_currency", `{"amount": 100, "currency": "dollars"}`},
			{"key_unknown_member", `{"amount": 100, "currency": "usd", "card": "4242"}`},
			{"key_not_json", `amount=100`},
		} {
			if a := mustSend(t, "POST", url, tc.key, tc.body); a.status != http.StatusBadRequest {
				t.Errorf("key %q body %s: want 400, got %d %s", tc.key, tc.body, a.status, a.body)
			}
		}
		if data, _ := list(t, srv, ""); len(data) != 0 {
			t.Fatalf("refused charges were made: %v", data)
		}
	})
}

func TestListIsNewestFirstAndPages(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *DB) {
		srv := newServer(t, Config{DB: db})
		var ids []string
		for i := range 3 {
			ids = append(ids, postCharge(t, srv, "key_list_"+itoa(i), 100+i).charge(t).ID)
		}
		page, more := list(t, srv, "?limit=2")
		if len(page) != 2 || page[0].ID != ids[2] || page[1].ID != ids[1] || !more {
			t.Fatalf("first page %v (has_more %v), want %s, %s and more", page, more, ids[2], ids[1])
		}
		page, more = list(t, srv, "?limit=2&starting_after="+ids[1])
		if len(page) != 1 || page[0].ID != ids[0] || more {
			t.Fatalf("second page %v (has_more %v), want %s alone", page, more, ids[0])
		}
		for _, q := range []string{"?limit=0", "?limit=1001", "?limit=x", "?starting_after=pch_none"} {
			if a := mustSend(t, "GET", srv.URL+"/v1/processor/charges"+q, "", ""); a.status != http.StatusBadRequest {
				t.Errorf("GET %s: want 400, got %d %s", q, a.status, a.body)
			}
		}
	})
}

func TestFailRateAnswers503BeforeAnythingIsDone(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *DB) {
		// The first request fails; the next ones pass.
		srv := newServer(t, Config{DB: db, FailRate: 0.1, Rand: rolls(0.05)})
		failed := postCharge(t, srv, "key_fail_rate", 700)
		if failed.status != http.StatusServiceUnavailable || !strings.Contains(string(failed.body), "processor_unavailable") {
			t.Fatalf("want 503 processor_unavailable, got %d %s", failed.status, failed.body)
		}
		if data, _ := list(t, srv, ""); len(data) != 0 {
			t.Fatalf("a failed request charged: %v", data)
		}
		// Nothing was claimed: the retry executes at once (not 409 in progress).
		retry := postCharge(t, srv, "key_fail_rate", 700)
		if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("want a fresh 201, got %d %v %s", retry.status, retry.header, retry.body)
		}
	})
}

func TestLostReplyCommitsTheChargeThenDropsTheConnection(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *DB) {
		// The first charge's reply is lost; the next ones arrive.
		srv := newServer(t, Config{DB: db, LostReplyRate: 0.2, Rand: rolls(0.1)})
		if a, err := send(t, "POST", srv.URL+"/v1/processor/charges", "key_lost_reply", `{"amount": 900, "currency": "eur"}`); err == nil {
			t.Fatalf("the lost reply arrived: %d %s", a.status, a.body)
		}
		data, _ := list(t, srv, "")
		if len(data) != 1 || data[0].IdempotencyKey != "key_lost_reply" {
			t.Fatalf("the charge whose reply was lost is not there: %v", data)
		}
		retry := mustSend(t, "POST", srv.URL+"/v1/processor/charges", "key_lost_reply", `{"currency": "eur", "amount": 900}`)
		if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "true" || retry.charge(t).ID != data[0].ID {
			t.Fatalf("the retry was not a replay of charge %s: %d %v %s", data[0].ID, retry.status, retry.header, retry.body)
		}
		if data, _ := list(t, srv, ""); len(data) != 1 {
			t.Fatalf("the retry charged again: %v", data)
		}
	})
}

func TestLatencyIsSpentHoldingTheKey(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *DB) {
		srv := newServer(t, Config{DB: db, Latency: 2 * time.Second})
		first := make(chan *answer, 1)
		go func() { first <- postCharge(t, srv, "key_latency", 300) }()
		waitInFlight(t, db, "key_latency")
		// A duplicate meets the key held while the charge spends its latency.
		if a := postCharge(t, srv, "key_latency", 300); a.status != http.StatusConflict || !strings.Contains(string(a.body), "request_in_progress") {
			t.Fatalf("the duplicate: want 409 request_in_progress, got %d %s", a.status, a.body)
		}
		if a := <-first; a.status != http.StatusCreated {
			t.Fatalf("want 201, got %d %s", a.status, a.body)
		}
	})
}

// waitInFlight waits, within 10 s, until the store holds key in flight.
func waitInFlight(t *testing.T, db *DB, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := db.Store().RecordGet(testenv.Context(t), &idemstore.GetParams{Scope: Scope, Key: key})
		if err == nil && rec.State == idemstore.StateInFlight {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the charge never held its key in flight: %v %v", rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
