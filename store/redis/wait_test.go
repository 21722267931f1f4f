package redis_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
)

// replicated is a private master whose one replica replicates through a fault proxy,
// so that a test can hold replication back (Stall) while the master answers.
type replicated struct {
	master *redistest.Server
	link   *faultproxy.Proxy
}

func startReplicated(t *testing.T) *replicated {
	t.Helper()
	master := redistest.StartServer(t, "--repl-diskless-sync-delay", "0")
	link := faultproxy.New(t, master.Addr())
	redistest.StartReplica(t, master, link.Addr())
	return &replicated{master: master, link: link}
}

// The WAIT bounds of these tests: one for writes that the replica must acknowledge,
// long enough for a machine so busy that a redis-server waits long for a CPU; one for
// writes that it cannot acknowledge (its link stalls), short, since each costs it.
const (
	ackTimeout  = 5 * time.Second
	waitTimeout = 200 * time.Millisecond
)

// waitingStores opens two stores on the same records of the Redis at rawURL whose
// claims wait for one replica: one with ackTimeout, for the writes the replica must
// acknowledge, and one with waitTimeout, for those it cannot.
func waitingStores(t *testing.T, rawURL string) (acked, stalled *redis.Store, logs *logBuffer) {
	t.Helper()
	acked, prefix := openStorePrefix(t, rawURL+"?wait_replicas=1&read_timeout=10s&wait_timeout="+ackTimeout.String())
	logs = &logBuffer{}
	stalled, err := redis.Open(t.Context(), rawURL+"?wait_replicas=1&wait_timeout="+waitTimeout.String(),
		redis.Config{KeyPrefix: prefix, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stalled.Close() })
	return acked, stalled, logs
}

// requireNotReplicated fails t unless err is a store error (503), wrapping
// redis.ErrNotReplicated, that came back within a bound of the WAIT timeout.
func requireNotReplicated(t *testing.T, what string, err error, took time.Duration) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("%s succeeded while no replica could acknowledge it", what)
	case !errors.Is(err, redis.ErrNotReplicated):
		t.Fatalf("%s: err = %v, want redis.ErrNotReplicated", what, err)
	case errors.Is(err, idemstore.ErrNotFound), errors.Is(err, idemstore.ErrLeaseLost):
		t.Fatalf("%s: err = %v; want a store error (503), not ErrNotFound or ErrLeaseLost", what, err)
	case took > 10*waitTimeout:
		t.Fatalf("%s failed after %v, want about its WAIT timeout %v", what, took, waitTimeout)
	}
}

// TestClaimsThatWaitForAReplicaAreGivenBackWhenItDoesNotAcknowledge holds replication
// back (the replica's link stalls) under a store whose claims wait for one replica:
// a new claim fails with ErrNotReplicated and leaves no record; a takeover fails and
// leaves the record as a holder that died does, its record id kept and its lease
// ended; a renewal fails, so the holder keeps its old lease end; a completion stands
// and is logged. Once replication resumes, claims are granted again.
func TestClaimsThatWaitForAReplicaAreGivenBackWhenItDoesNotAcknowledge(t *testing.T) {
	t.Parallel()
	r := startReplicated(t)
	acked, s, logs := waitingStores(t, r.master.URL())
	ctx := t.Context()

	start := time.Now()
	lapsing := claimParams("scope", "lapsing", start)
	lapsing.Lease = time.Second
	renewing := claimParams("scope", "renewing", time.Time{})
	completing := claimParams("scope", "completing", time.Time{})
	for _, p := range []*idemstore.ClaimParams{lapsing, renewing, completing} {
		if res, err := acked.RecordClaim(ctx, p); err != nil || res.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("claim of %s while the replica acknowledges: %v, %v", p.Key, res, err)
		}
	}

	r.link.Stall()
	fresh := claimParams("scope", "fresh", time.Time{})
	began := time.Now()
	_, err := s.RecordClaim(ctx, fresh)
	requireNotReplicated(t, "a new claim", err, time.Since(began))
	if _, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: fresh.Scope, Key: fresh.Key}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("after the claim that no replica acknowledged, RecordGet = %v; want no record", err)
	}

	takeover := claimParams("scope", "lapsing", start.Add(time.Minute))
	takeover.Fingerprint = lapsing.Fingerprint
	began = time.Now()
	_, err = s.RecordClaim(ctx, takeover)
	requireNotReplicated(t, "a takeover", err, time.Since(began))
	rec, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: lapsing.Scope, Key: lapsing.Key, Now: takeover.Now})
	if err != nil || rec.ID != lapsing.RecordID || rec.State != idemstore.StateInFlight || rec.LeaseEnd.After(takeover.Now) {
		t.Fatalf("after the takeover that no replica acknowledged, the record is %+v, %v; want it in flight under record id %s with its lease ended", rec, err, lapsing.RecordID)
	}

	began = time.Now()
	_, err = s.RecordRenew(ctx, &idemstore.RenewParams{Scope: renewing.Scope, Key: renewing.Key, Token: renewing.Token, Lease: time.Minute, TTL: time.Hour})
	requireNotReplicated(t, "a renewal", err, time.Since(began))

	err = s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: completing.Scope, Key: completing.Key, Token: completing.Token,
		Response: &idemstore.Response{Status: 201, Body: []byte("done")}, TTL: time.Hour})
	if err != nil {
		t.Fatalf("a completion that no replica acknowledged: %v; want it to stand (the operation ran)", err)
	}
	if l := strings.Join(logs.lines(), "\n"); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "completion was stored on the master") {
		t.Fatalf("the unacknowledged completion logged:\n%s\nwant a warning", l)
	}
	if res, err := s.RecordClaim(ctx, claimParams("scope", "completing", time.Time{})); err == nil && res.Outcome == idemstore.ClaimAcquired {
		t.Fatal("a claim of the completed key acquired it")
	}

	r.link.Resume()
	if res, err := acked.RecordClaim(ctx, fresh); err != nil || res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("the new claim once replication resumed: %v, %v; want acquired", res, err)
	}
	takeover.Token = "tok-after-resume"
	res, err := acked.RecordClaim(ctx, takeover)
	if err != nil || res.Outcome != idemstore.ClaimAcquired || !res.TookOver || res.Record.ID != lapsing.RecordID {
		t.Fatalf("the takeover once replication resumed: %+v, %v; want the record %s taken over", res, err, lapsing.RecordID)
	}
}

// TestHandlerNeverRunsOnAClaimNoReplicaAcknowledged: through the middleware, a request
// whose claim no replica acknowledges gets 503 store_unavailable with Retry-After in
// about the WAIT timeout, and its handler does not run; its retry once replication
// resumes runs the handler once.
func TestHandlerNeverRunsOnAClaimNoReplicaAcknowledged(t *testing.T) {
	t.Parallel()
	r := startReplicated(t)
	acked, stalled, _ := waitingStores(t, r.master.URL())
	var runs atomic.Int64
	handler := func(s *redis.Store) http.Handler {
		return idem.New(idem.Config{Store: s, Logger: discardLogger(),
			Scope: func(*http.Request) (string, error) { return "user-1", nil }}).
			Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, `{"id":"ch_1"}`)
			}))
	}
	h := handler(stalled)
	post := func() *http.Response {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "key-not-replicated")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result()
	}

	r.link.Stall()
	began := time.Now()
	res := post()
	body, _ := io.ReadAll(res.Body)
	if took := time.Since(began); res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(body), idem.CodeStoreUnavailable) || took > 10*waitTimeout {
		t.Fatalf("POST while no replica acknowledges: %d %q Retry-After %q after %v; want 503 store_unavailable with Retry-After, soon",
			res.StatusCode, body, res.Header.Get("Retry-After"), took)
	}
	if n := runs.Load(); n != 0 {
		t.Fatalf("the handler ran %d times on a claim no replica acknowledged", n)
	}

	r.link.Resume()
	h = handler(acked)
	if res := post(); res.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("the retry once replication resumed: %d %s, want 201", res.StatusCode, b)
	}
	if res := post(); res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the next retry: %d replayed %q, want the replayed 201", res.StatusCode, res.Header.Get("Idempotent-Replayed"))
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// A WAIT timeout that the client's read timeout would cut short, or one without
// replicas to wait for, or a URL that contradicts the Config, is refused when the
// store is built.
func TestWaitSettingsThatCannotWorkAreRefused(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	url := redistest.StartServer(t).URL()
	for _, tc := range []struct {
		url  string
		cfg  redis.Config
		want string
	}{
		{url + "?wait_replicas=1&wait_timeout=3s&read_timeout=2s", redis.Config{}, "shorter than the client's read timeout"},
		{url + "?wait_timeout=100ms", redis.Config{}, "nothing waits"},
		{url + "?wait_replicas=1", redis.Config{WaitReplicas: 2}, "the URL says wait_replicas=1"},
		{url + "?wait_replicas=1&wait_timeout=1s", redis.Config{WaitTimeout: time.Second / 2}, "the URL says wait_timeout=1s"},
		{url, redis.Config{WaitReplicas: -1}, "must not be negative"},
		{url + "?wait_replicas=-1", redis.Config{}, "want a number of replicas"},
		{url + "?wait_replicas=1&wait_timeout=0", redis.Config{}, "want a positive duration"},
		{url + "?wait_replicas=1&wait_replicas=1", redis.Config{}, "given twice"},
	} {
		tc.cfg.Logger = discardLogger()
		s, err := redis.Open(ctx, tc.url, tc.cfg)
		if err == nil {
			s.Close()
			t.Errorf("Open(%s, %+v) succeeded, want an error saying %q", tc.url, tc.cfg, tc.want)
		} else if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s, %+v): %v, want it to say %q", tc.url, tc.cfg, err, tc.want)
		}
	}
}
