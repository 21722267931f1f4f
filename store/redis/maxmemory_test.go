package redis_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
)

// These tests back docs/redis.md's "When Redis is full": what a Redis at maxmemory does
// to claims, completions and replays under each maxmemory-policy. Each starts a
// private Redis, since they change its memory settings.

// fillBody is the response body of the records that fill Redis: large enough that a
// few hundred of them cross the headroom the tests give.
var fillBody = bytes.Repeat([]byte("x"), 4<<10)

// limitedRedis is a private Redis with a maxmemory-policy and a store on it.
type limitedRedis struct {
	t      *testing.T
	srv    *redistest.Server
	s      *redis.Store
	client goredis.UniversalClient
}

func startLimitedRedis(t *testing.T, policy string) *limitedRedis {
	t.Helper()
	srv := redistest.StartServer(t, "--maxmemory-policy", policy)
	s := openStore(t, srv.URL())
	return &limitedRedis{t: t, srv: srv, s: s, client: s.Client()}
}

// memory returns Redis's used_memory, as INFO memory reports it.
func (r *limitedRedis) memory() int64 {
	r.t.Helper()
	info, err := r.client.Info(r.t.Context(), "memory").Result()
	if err != nil {
		r.t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				r.t.Fatal(err)
			}
			return n
		}
	}
	r.t.Fatalf("INFO memory has no used_memory: %q", info)
	return 0
}

// setMaxmemory sets maxmemory to n bytes; 0 lifts the limit ("memory freed").
func (r *limitedRedis) setMaxmemory(n int64) {
	r.t.Helper()
	if err := r.client.ConfigSet(r.t.Context(), "maxmemory", strconv.FormatInt(n, 10)).Err(); err != nil {
		r.t.Fatal(err)
	}
}

// limitHeadroom sets maxmemory to what Redis uses now plus headroom bytes.
func (r *limitedRedis) limitHeadroom(headroom int64) {
	r.t.Helper()
	r.setMaxmemory(r.memory() + headroom)
}

// claim claims (scope, key) under a fresh token; p.Now zero, so Redis's clock decides.
func (r *limitedRedis) claim(key string) (*idemstore.ClaimParams, *idemstore.ClaimResult, error) {
	p := claimParams("scope", key, time.Time{})
	res, err := r.s.RecordClaim(r.t.Context(), p)
	return p, res, err
}

func (r *limitedRedis) complete(p *idemstore.ClaimParams, body []byte) error {
	return r.s.RecordComplete(r.t.Context(), &idemstore.CompleteParams{
		Scope: p.Scope, Key: p.Key, Token: p.Token, TTL: p.TTL, Now: p.Now,
		Response: &idemstore.Response{Status: 201, Body: body},
	})
}

// retry claims p's key again with p's fingerprint under a fresh token, as a client's
// retry of the same request would.
func (r *limitedRedis) retry(p *idemstore.ClaimParams, now time.Time) (*idemstore.ClaimResult, error) {
	again := *p
	again.Token, again.RecordID, again.Now = "tok-"+rand.Text(), "rec-"+rand.Text(), now
	return r.s.RecordClaim(r.t.Context(), &again)
}

func (r *limitedRedis) exists(p *idemstore.ClaimParams) bool {
	r.t.Helper()
	n, err := r.client.Exists(r.t.Context(), r.s.RecordKey(p.Scope, p.Key)).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return n == 1
}

// fillUntilClaimRefused claims and completes records with 4 KiB bodies until Redis
// refuses a claim, and returns that claim's params and error. A completion of a
// record claimed while Redis had room must always succeed.
func (r *limitedRedis) fillUntilClaimRefused() (*idemstore.ClaimParams, error) {
	r.t.Helper()
	const most = 2000 // 8 MiB of bodies, far past the tests' headroom
	for i := range most {
		p, _, err := r.claim(fmt.Sprintf("fill-%d", i))
		if err != nil {
			return p, err
		}
		if err := r.complete(p, fillBody); err != nil {
			r.t.Fatalf("completing fill record %d, claimed while Redis had room: %v", i, err)
		}
	}
	r.t.Fatalf("Redis took %d records of %d bytes past its maxmemory and never refused a claim (used_memory now %d)",
		most, len(fillBody), r.memory())
	return nil, nil
}

// requireRefusedForMemory fails unless err is the store's refusal of a write because
// Redis is at maxmemory: a plain store error (the middleware answers 503), not
// ErrNotFound or ErrLeaseLost, that says what happened.
func requireRefusedForMemory(t *testing.T, what string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("%s succeeded on a full Redis; want it refused", what)
	case errors.Is(err, idemstore.ErrNotFound), errors.Is(err, idemstore.ErrLeaseLost):
		t.Fatalf("%s: err = %v; want a store error (503), not %v", what, err, errors.Unwrap(err))
	case !goredis.IsOOMError(err), !strings.Contains(err.Error(), "maxmemory"):
		t.Fatalf("%s: err = %v; want Redis's OOM refusal, naming maxmemory", what, err)
	}
}

// TestFullRedisRefusesNewClaimsWhileRunningWorkFinishes: under noeviction, once Redis
// reaches maxmemory a claim that would write (a new key, a takeover) is refused before
// anything runs, while work that holds a key can still renew, complete or release it,
// and replays, in-flight answers and mismatches are still served.
func TestFullRedisRefusesNewClaimsWhileRunningWorkFinishes(t *testing.T) {
	t.Parallel()
	r := startLimitedRedis(t, "noeviction")
	ctx := t.Context()

	// Work that started while Redis had room.
	completing, _, err := r.claim("completing")
	if err != nil {
		t.Fatal(err)
	}
	renewing, _, err := r.claim("renewing")
	if err != nil {
		t.Fatal(err)
	}
	releasing, _, err := r.claim("releasing")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	lapsing := claimParams("scope", "lapsing", start)
	if _, err := r.s.RecordClaim(ctx, lapsing); err != nil {
		t.Fatal(err)
	}

	r.limitHeadroom(256 << 10)
	refused, err := r.fillUntilClaimRefused()
	requireRefusedForMemory(t, "a claim of a new key at maxmemory", err)
	if r.exists(refused) {
		t.Fatal("the refused claim wrote its record")
	}

	// Replays, in-flight answers and mismatches need no write.
	fill0 := claimParams("scope", "fill-0", time.Time{})
	if res, err := r.s.RecordClaim(ctx, fill0); err != nil || res.Outcome != idemstore.ClaimMismatch {
		t.Fatalf("claim of a completed key with another fingerprint: %v, %v; want mismatch", res, err)
	}
	if res, err := r.retry(renewing, time.Time{}); err != nil || res.Outcome != idemstore.ClaimInFlight {
		t.Fatalf("duplicate of a key in flight: %v, %v; want in flight", res, err)
	}
	if res, err := r.s.RecordClaim(ctx, renewing); err != nil || res.Outcome != idemstore.ClaimAcquired || res.Record.Token != renewing.Token {
		t.Fatalf("a claim re-sent by its holder (same token): %v, %v; want acquired, as claim.lua answers", res, err)
	}
	_, err = r.retry(lapsing, start.Add(time.Minute))
	requireRefusedForMemory(t, "a takeover at maxmemory", err)
	if rec, err := r.s.RecordGet(ctx, &idemstore.GetParams{Scope: lapsing.Scope, Key: lapsing.Key}); err != nil || rec.Token != lapsing.Token {
		t.Fatalf("after the refused takeover the record is %+v, %v; want it still held by its first token", rec, err)
	}

	// The holders finish.
	if _, err := r.s.RecordRenew(ctx, &idemstore.RenewParams{Scope: renewing.Scope, Key: renewing.Key, Token: renewing.Token, Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatalf("renewing a held key at maxmemory: %v", err)
	}
	body := bytes.Repeat([]byte("c"), 64<<10) // grows Redis further past maxmemory
	if err := r.complete(completing, body); err != nil {
		t.Fatalf("completing a held key at maxmemory: %v", err)
	}
	if err := r.complete(lapsing, []byte("late")); err != nil {
		t.Fatalf("completing a key whose lease lapsed but that nobody took over, at maxmemory: %v", err)
	}
	if err := r.s.RecordRelease(ctx, &idemstore.ReleaseParams{Scope: releasing.Scope, Key: releasing.Key, Token: releasing.Token}); err != nil {
		t.Fatalf("releasing a held key at maxmemory: %v", err)
	}
	if r.exists(releasing) {
		t.Fatal("the released record is still there")
	}
	res, err := r.retry(completing, time.Time{})
	if err != nil || res.Outcome != idemstore.ClaimCompleted || !bytes.Equal(res.Record.Response.Body, body) {
		t.Fatalf("retry of the key completed at maxmemory: %v, %v; want its replay", res, err)
	}
	_, err = r.retry(releasing, time.Time{})
	requireRefusedForMemory(t, "a claim of the released key at maxmemory", err)

	// Memory frees: claims go through again.
	r.setMaxmemory(0)
	if res, err := r.retry(refused, time.Time{}); err != nil || res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("claim of the refused key once memory freed: %v, %v; want acquired", res, err)
	}
}

// chargesApp is a payments-like API behind the middleware on a limited Redis: every
// execution creates the next charge, ch_1, ch_2, ….
type chargesApp struct {
	t          *testing.T
	clock      *testkit.Clock
	handler    http.Handler
	executions atomic.Int64
	gates      testkit.Gates
}

const appLease = 10 * time.Second

func newChargesApp(t *testing.T, s *redis.Store) *chargesApp {
	app := &chargesApp{t: t, clock: testkit.NewClock(time.Now())}
	m := idem.New(idem.Config{
		Store:  s,
		Scope:  func(*http.Request) (string, error) { return "user-1", nil },
		Lease:  appLease,
		Clock:  app.clock.Now,
		Logger: discardLogger(),
	})
	app.handler = m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := app.executions.Add(1)
		app.gates.Pass(strconv.FormatInt(n, 10)) // a test may hold execution n
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d","object":"charge"}`, n)
	}))
	return app
}

func (app *chargesApp) post(key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":2000,"currency":"usd"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	rec := httptest.NewRecorder()
	app.handler.ServeHTTP(rec, req)
	return rec
}

// requireOneCharge fails unless the key executed once and every 201 among answers
// carries that execution's charge.
func (app *chargesApp) requireOneCharge(answers ...*httptest.ResponseRecorder) {
	app.t.Helper()
	var first string
	for i, a := range answers {
		if a.Code != http.StatusCreated {
			continue
		}
		if first == "" {
			first = a.Body.String()
		} else if a.Body.String() != first {
			app.t.Errorf("answer %d is 201 %s, but an earlier one was 201 %s: the key executed twice", i+1, a.Body, first)
		}
	}
	if n := app.executions.Load(); n != 1 {
		app.t.Errorf("the handler ran %d times for one key; want exactly once", n)
	}
}

// TestFullRedisNeverExecutesAKeyTwiceThroughTheMiddleware is the reproduction of a
// full Redis under noeviction running a key twice: a POST that reaches a full Redis
// gets 503 and nothing runs; once memory frees (and any lease would have lapsed) the
// retry executes once, and later retries replay it.
func TestFullRedisNeverExecutesAKeyTwiceThroughTheMiddleware(t *testing.T) {
	t.Parallel()
	r := startLimitedRedis(t, "noeviction")
	app := newChargesApp(t, r.s)
	key := "key-" + rand.Text()

	r.setMaxmemory(1) // Redis is full
	first := app.post(key)
	if first.Code != http.StatusServiceUnavailable || !strings.Contains(first.Body.String(), "store_unavailable") {
		t.Errorf("POST on a full Redis = %d %s; want 503 store_unavailable", first.Code, first.Body)
	}
	if n := app.executions.Load(); n != 0 {
		t.Errorf("the handler ran %d times on a full Redis; want it refused before running", n)
	}

	r.setMaxmemory(0) // memory freed
	app.clock.Advance(appLease + time.Second)
	second := app.post(key)
	third := app.post(key)
	if second.Code != http.StatusCreated {
		t.Errorf("retry once memory freed = %d %s; want 201", second.Code, second.Body)
	}
	if third.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("second retry = %d %s; want the first charge replayed", third.Code, third.Body)
	}
	app.requireOneCharge(first, second, third)
}

// TestFullRedisStoresTheOutcomeOfWorkAlreadyRunning: a request claimed while Redis had
// room, whose handler finishes after Redis filled up, stores its response; a duplicate
// on the full Redis is replayed, and so is a retry after memory frees and the lease
// would have lapsed.
func TestFullRedisStoresTheOutcomeOfWorkAlreadyRunning(t *testing.T) {
	t.Parallel()
	r := startLimitedRedis(t, "noeviction")
	app := newChargesApp(t, r.s)
	key := "key-" + rand.Text()
	gate := app.gates.Add("1")

	answer := make(chan *httptest.ResponseRecorder, 1)
	go func() { answer <- app.post(key) }()
	<-gate.Entered
	r.setMaxmemory(1) // Redis fills while the handler runs
	close(gate.Proceed)
	first := <-answer
	if first.Code != http.StatusCreated {
		t.Fatalf("the running request = %d %s; want its 201", first.Code, first.Body)
	}
	duplicate := app.post(key)
	if duplicate.Code != http.StatusCreated || duplicate.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("duplicate on the full Redis = %d %s; want the stored 201 replayed", duplicate.Code, duplicate.Body)
	}

	r.setMaxmemory(0)
	app.clock.Advance(appLease + time.Second)
	retry := app.post(key)
	if retry.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry once memory freed = %d %s; want the stored 201 replayed", retry.Code, retry.Body)
	}
	app.requireOneCharge(first, duplicate, retry)
}

// evictionPolicies are the maxmemory-policy values under which Redis evicts keys at
// maxmemory rather than refusing writes.
var evictionPolicies = []string{
	"allkeys-lru", "allkeys-lfu", "allkeys-random",
	"volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl",
}

// TestEvictingRedisLosesRecordsAndTheirRetriesExecuteAgain: under every evicting
// policy (the volatile-* ones too, since every record has a TTL) a Redis at maxmemory
// never refuses a claim; it evicts records instead. A retry of an evicted completed
// record executes again, and a handler whose in-flight record was evicted can neither
// complete nor renew it (ErrLeaseLost) while a duplicate claims the key afresh.
func TestEvictingRedisLosesRecordsAndTheirRetriesExecuteAgain(t *testing.T) {
	t.Parallel()
	for _, policy := range evictionPolicies {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			r := startLimitedRedis(t, policy)
			ctx := t.Context()

			// Requests in flight, with a TTL shorter than the fill records' so that
			// volatile-ttl, which evicts the nearest expiry first, reaches them.
			var held []*idemstore.ClaimParams
			for i := range 8 {
				p := claimParams("scope", fmt.Sprintf("held-%d", i), time.Time{})
				p.TTL = 10 * time.Minute
				if _, err := r.s.RecordClaim(ctx, p); err != nil {
					t.Fatal(err)
				}
				held = append(held, p)
			}

			r.limitHeadroom(256 << 10)
			var completed []*idemstore.ClaimParams
			var lostCompleted, lostHeld *idemstore.ClaimParams
			for i := 0; lostCompleted == nil || lostHeld == nil; i++ {
				if i == 3000 {
					t.Fatalf("after %d records of %d bytes past maxmemory, evicted: a completed record %v, an in-flight one %v",
						i, len(fillBody), lostCompleted != nil, lostHeld != nil)
				}
				p, _, err := r.claim(fmt.Sprintf("fill-%d", i))
				if err != nil {
					t.Fatalf("claim %d at maxmemory under %s: %v; want eviction to make room", i, policy, err)
				}
				switch err := r.complete(p, fillBody); {
				case err == nil:
					completed = append(completed, p)
				case errors.Is(err, idemstore.ErrLeaseLost): // evicted while in flight
				default:
					t.Fatalf("completing fill record %d: %v", i, err)
				}
				if lostCompleted == nil && i%25 == 24 {
					lostCompleted = r.firstMissing(completed)
				}
				if lostHeld == nil {
					lostHeld = r.firstMissing(held)
				}
			}

			res, err := r.retry(lostCompleted, time.Time{})
			if err != nil || res.Outcome != idemstore.ClaimAcquired {
				t.Fatalf("retry of an evicted completed record: %v, %v; want acquired (it executes again)", res, err)
			}
			if err := r.complete(lostHeld, []byte("done")); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("completing an evicted in-flight record: %v, want ErrLeaseLost", err)
			}
			if _, err := r.s.RecordRenew(ctx, &idemstore.RenewParams{Scope: lostHeld.Scope, Key: lostHeld.Key, Token: lostHeld.Token, Lease: time.Minute, TTL: time.Hour}); !errors.Is(err, idemstore.ErrLeaseLost) {
				t.Fatalf("renewing an evicted in-flight record: %v, want ErrLeaseLost", err)
			}
			res, err = r.retry(lostHeld, time.Time{})
			if err != nil || res.Outcome != idemstore.ClaimAcquired {
				t.Fatalf("duplicate of an evicted in-flight record: %v, %v; want acquired (a second execution beside the first)", res, err)
			}
		})
	}
}

// firstMissing returns the first of ps whose record's key Redis no longer has.
func (r *limitedRedis) firstMissing(ps []*idemstore.ClaimParams) *idemstore.ClaimParams {
	r.t.Helper()
	cmds, err := r.client.Pipelined(r.t.Context(), func(pipe goredis.Pipeliner) error {
		for _, p := range ps {
			pipe.Exists(r.t.Context(), r.s.RecordKey(p.Scope, p.Key))
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	for i, c := range cmds {
		if c.(*goredis.IntCmd).Val() == 0 {
			return ps[i]
		}
	}
	return nil
}

// TestVolatilePolicyWithNoKeyLeftToEvictRefusesClaims: a volatile-* policy evicts only
// keys with a TTL. Records have one, so they go first when the rest of the data has
// none; once none is left, Redis refuses writes as under noeviction, and claims are
// refused before anything runs.
func TestVolatilePolicyWithNoKeyLeftToEvictRefusesClaims(t *testing.T) {
	t.Parallel()
	r := startLimitedRedis(t, "volatile-lru")
	ctx := t.Context()
	p, _, err := r.claim("completed")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.complete(p, []byte("charge")); err != nil {
		t.Fatal(err)
	}

	// The application's own data, without TTLs, fills Redis.
	r.limitHeadroom(128 << 10)
	for i := 0; ; i++ {
		if i == 2000 {
			t.Fatalf("Redis took %d keys of %d bytes without a TTL past maxmemory", i, len(fillBody))
		}
		err := r.client.Set(ctx, fmt.Sprintf("app-%d", i), fillBody, 0).Err()
		if goredis.IsOOMError(err) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if r.exists(p) {
		t.Fatal("the record, the only key with a TTL, survived; want it evicted first")
	}
	_, err = r.retry(p, time.Time{})
	requireRefusedForMemory(t, "a retry of the evicted record, with nothing left to evict", err)
	_, _, err = r.claim("new")
	requireRefusedForMemory(t, "a claim of a new key, with nothing left to evict", err)
}
