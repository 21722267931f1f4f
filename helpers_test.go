package idem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/memory"
)

// countingStore delegates to the in-memory store, counting calls; down makes every
// call fail as an unreachable store would.
type countingStore struct {
	*memory.Store
	claims, completes, releases, renews, gets, deletes atomic.Int64
	down                                               atomic.Bool
	renewDown                                          atomic.Bool
	// renewBlocks, when set, makes renewals signal on it and wait for their context.
	renewBlocks chan struct{}
	// stall, when set, makes claims and reads stall as a store that stopped answering
	// does: each hands its context to the test and waits for it to end.
	stall            chan storeCall
	noBatchedCleanup bool
	// beforeClaim, when set, runs once before the next claim, as another caller
	// that claims first.
	beforeClaim atomic.Pointer[func()]
}

var errStoreDown = errors.New("store down")

func (s *countingStore) err() error {
	if s.down.Load() {
		return errStoreDown
	}
	return nil
}

func (s *countingStore) RecordClaim(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	s.claims.Add(1)
	if f := s.beforeClaim.Swap(nil); f != nil {
		(*f)()
	}
	if s.stall != nil {
		return nil, stalled(ctx, s.stall)
	}
	if err := s.err(); err != nil {
		return nil, err
	}
	return s.Store.RecordClaim(ctx, p)
}

func (s *countingStore) RecordComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	s.completes.Add(1)
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.RecordComplete(ctx, p)
}

func (s *countingStore) RecordRelease(ctx context.Context, p *idemstore.ReleaseParams) error {
	s.releases.Add(1)
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.RecordRelease(ctx, p)
}

func (s *countingStore) RecordRenew(ctx context.Context, p *idemstore.RenewParams) (time.Time, error) {
	s.renews.Add(1)
	if s.renewBlocks != nil {
		s.renewBlocks <- struct{}{}
		<-ctx.Done()
		return time.Time{}, ctx.Err()
	}
	if err := s.err(); err != nil || s.renewDown.Load() {
		return time.Time{}, errStoreDown
	}
	return s.Store.RecordRenew(ctx, p)
}

func (s *countingStore) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	if p.Scope == idemstore.ReservedScope {
		// idem's own records (the store's state, read by every guard at its first
		// claim and every few seconds): not the calls of requests these tests count.
		return s.Store.RecordGet(ctx, p)
	}
	s.gets.Add(1)
	if s.stall != nil {
		return nil, stalled(ctx, s.stall)
	}
	if err := s.err(); err != nil {
		return nil, err
	}
	return s.Store.RecordGet(ctx, p)
}

func (s *countingStore) RecordStep(ctx context.Context, p *idemstore.StepParams) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.RecordStep(ctx, p)
}

func (s *countingStore) RecordDeleteExpired(ctx context.Context, p *idemstore.DeleteExpiredParams) (int, error) {
	s.deletes.Add(1)
	if err := s.err(); err != nil {
		return 0, err
	}
	return s.Store.RecordDeleteExpired(ctx, p)
}

// Capabilities are the memory store's, with Transactions: the tests' inTx stands in
// for a SPEC §7 helper, and ClaimInHandler routes need one.
func (s *countingStore) Capabilities() idemstore.Capabilities {
	c := s.Store.Capabilities()
	c.Transactions = true
	if s.noBatchedCleanup {
		c.BatchedCleanup = false
	}
	return c
}

// stalled hands ctx to the test and waits for it to end, as a call to a store that
// stopped answering would.
func stalled(ctx context.Context, stall chan<- storeCall) error {
	stall <- storeCall{ctx, time.Now()}
	<-ctx.Done()
	return ctx.Err()
}

func (s *countingStore) calls() int64 {
	return s.claims.Load() + s.completes.Load() + s.releases.Load() + s.renews.Load() + s.gets.Load() + s.deletes.Load()
}

// newClock returns a settable clock for Config.Clock, at a fixed start.
func newClock() *testkit.Clock { return testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)) }

type bundle struct {
	logs   *testkit.Buffer
	store  *countingStore
	clock  *testkit.Clock
	mw     *idem.Middleware
	ticker *idem.ManualTicker
}

// setup builds a middleware over a fresh in-memory store with an injected clock and a
// hand-driven heartbeat; mod adjusts the Config first.
func setup(t testing.TB, mod func(*idem.Config)) *bundle {
	t.Helper()
	b := &bundle{logs: &testkit.Buffer{}, store: &countingStore{Store: memory.New()}, clock: newClock()}
	cfg := idem.Config{
		Store:  b.store,
		Scope:  bearerScope,
		Clock:  b.clock.Now,
		Logger: slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	b.mw = idem.New(cfg)
	b.ticker = idem.UseManualTicker(b.mw)
	return b
}

// bearerScope scopes keys by the bearer token, as the payments API does (in the clear
// here for readability).
func bearerScope(r *http.Request) (string, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", errors.New("no bearer token")
	}
	return tok, nil
}

// req builds a request from alice with key (none when empty) and a JSON body.
func req(method, path, key, body string) *http.Request {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, path, rd)
	r.Header.Set("Authorization", "Bearer alice")
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// counter is a handler that counts its executions and answers status with a body
// naming the execution.
type counter struct {
	n      atomic.Int64
	status int
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.n.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/charges/ch_1")
	w.Header().Set("Set-Cookie", "session=1")
	w.Header().Set("X-Request-Note", "not stored")
	status := c.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.WriteHeader(status)
	io.WriteString(w, `{"execution":`+itoa(n)+`}`)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func wantCode(t *testing.T, w *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if code != "" && !strings.Contains(w.Body.String(), `"code":"`+code+`"`) {
		t.Fatalf("body %s lacks code %s", w.Body, code)
	}
}
