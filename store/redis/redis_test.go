package redis_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/admin/admintest"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
	"github.com/idem-go/idem/store/storetest"
)

// openStore opens a store on the Redis at rawURL with a key prefix private to t, and
// deletes the prefix's keys at cleanup.
func openStore(t testing.TB, rawURL string) *redis.Store {
	t.Helper()
	s, _ := openStorePrefix(t, rawURL)
	return s
}

// openStorePrefix is openStore, also returning the key prefix.
func openStorePrefix(t testing.TB, rawURL string) (*redis.Store, string) {
	t.Helper()
	ctx := context.Background()
	prefix := testenv.Name("idemtest") + ":"
	s, err := redis.Open(ctx, rawURL, redis.Config{KeyPrefix: prefix, Logger: discardLogger()})
	if err != nil {
		t.Fatalf("Open(%s): %v", rawURL, err)
	}
	t.Cleanup(func() {
		deletePrefix(t, s.Client(), prefix)
		s.Close()
	})
	return s, prefix
}

// deletePrefix deletes every key that starts with prefix (on every master of a cluster).
func deletePrefix(t testing.TB, c goredis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	del := func(ctx context.Context, c goredis.Cmdable) error {
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	var err error
	if cc, ok := c.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return del(ctx, n) })
	} else {
		err = del(ctx, c)
	}
	if err != nil {
		t.Logf("deleting keys %s*: %v", prefix, err)
	}
}

// scanPrefix returns every key that starts with prefix (on every master of a cluster).
func scanPrefix(t testing.TB, c goredis.UniversalClient, prefix string) []string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, c goredis.Cmdable) error {
		found, err := c.Keys(ctx, prefix+"*").Result()
		mu.Lock()
		keys = append(keys, found...)
		mu.Unlock()
		return err
	}
	var err error
	if cc, ok := c.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return scan(ctx, n) })
	} else {
		err = scan(ctx, c)
	}
	if err != nil {
		t.Fatalf("KEYS %s*: %v", prefix, err)
	}
	return keys
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// harness hands the conformance suite stores on the Redis at rawURL.
func harness(rawURL string) storetest.Harness {
	var prefixes sync.Map // *redis.Store -> its key prefix
	return storetest.Harness{
		NewStore: func(t *testing.T) idemstore.Store {
			s, prefix := openStorePrefix(t, rawURL)
			prefixes.Store(s, prefix)
			return s
		},
		Raw: func(t *testing.T, st idemstore.Store) []byte {
			prefix, _ := prefixes.Load(st)
			return rawValues(t, st.(*redis.Store).Client(), prefix.(string))
		},
		CopyResponse: func(t *testing.T, st idemstore.Store, scope, from, onto string) {
			s := st.(*redis.Store)
			ctx := context.Background()
			src := s.Client().HMGet(ctx, s.RecordKey(scope, from), "status", "hdr", "body").Val()
			if err := s.Client().HSet(ctx, s.RecordKey(scope, onto), "status", src[0], "hdr", src[1], "body", src[2]).Err(); err != nil {
				t.Fatal(err)
			}
		},
	}
}

// rawValues returns what Redis holds under prefix: every key, and every field and
// value of it, byte for byte.
func rawValues(t *testing.T, c goredis.UniversalClient, prefix string) []byte {
	t.Helper()
	ctx := context.Background()
	var raw []byte
	for _, k := range scanPrefix(t, c, prefix) {
		raw = append(raw, k...)
		switch typ := c.Type(ctx, k).Val(); typ {
		case "hash":
			for f, v := range c.HGetAll(ctx, k).Val() {
				raw = append(append(raw, f...), v...)
			}
		case "string":
			raw = append(raw, c.Get(ctx, k).Val()...)
		case "zset":
			for _, m := range c.ZRange(ctx, k, 0, -1).Val() {
				raw = append(raw, m...)
			}
		default:
			t.Fatalf("key %s is a %s, which rawValues does not read", k, typ)
		}
	}
	return raw
}

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, harness(testenv.RedisURL(t)))
}

// adminHarness hands the admin conformance suite stores on the Redis at rawURL.
func adminHarness(rawURL string) admintest.Harness {
	return admintest.Harness{
		NewStore: func(t *testing.T) admintest.Store { return openStore(t, rawURL) },
	}
}

func TestAdminConformance(t *testing.T) {
	t.Parallel()
	admintest.Run(t, adminHarness(testenv.RedisURL(t)))
}

func claimParams(scope, key string, now time.Time) *idemstore.ClaimParams {
	fp := idemstore.Fingerprint{Version: idemstore.FingerprintVersion}
	_, _ = rand.Read(fp.Sum[:])
	return &idemstore.ClaimParams{
		Scope: scope, Key: key, Fingerprint: fp,
		Token: "tok-" + rand.Text(), RecordID: "rec-" + rand.Text(),
		Lease: 10 * time.Second, TTL: time.Hour, Now: now,
	}
}

func TestRecordKeyIsPrefixAndHashTaggedDigest(t *testing.T) {
	t.Parallel()
	s, err := redis.NewFromClient(goredis.NewClient(&goredis.Options{}), redis.Config{})
	if err != nil {
		t.Fatal(err)
	}
	scope, key := "principal-1", "key-0123456789"
	sum := sha256.New()
	_ = binary.Write(sum, binary.BigEndian, uint64(len(scope)))
	sum.Write([]byte(scope + key))
	want := "idem:{" + hex.EncodeToString(sum.Sum(nil)) + "}"
	if got := s.RecordKey(scope, key); got != want {
		t.Fatalf("RecordKey = %q, want %q", got, want)
	}
	if !regexp.MustCompile(`^idem:\{[0-9a-f]{64}\}$`).MatchString(want) {
		t.Fatalf("RecordKey %q does not have the documented layout", want)
	}
}

func TestRecordKeyIsOneToOne(t *testing.T) {
	t.Parallel()
	s, err := redis.NewFromClient(goredis.NewClient(&goredis.Options{}), redis.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Without the length prefix these pairs would hash the same bytes.
	pairs := [][2]string{{"ab", "cdefghij"}, {"abc", "defghij"}, {"", "abcdefghij"}, {"abcdefghij", ""}}
	seen := map[string][2]string{}
	for _, p := range pairs {
		k := s.RecordKey(p[0], p[1])
		if q, dup := seen[k]; dup {
			t.Fatalf("RecordKey(%q, %q) = RecordKey(%q, %q) = %s", p[0], p[1], q[0], q[1], k)
		}
		seen[k] = p
	}
}

func TestConfigRejectsKeyPrefixWithBraces(t *testing.T) {
	t.Parallel()
	_, err := redis.NewFromClient(goredis.NewClient(&goredis.Options{}), redis.Config{KeyPrefix: "app{1}:"})
	if err == nil || !strings.Contains(err.Error(), "Config.KeyPrefix") {
		t.Fatalf("NewFromClient with KeyPrefix app{1}: err = %v, want one naming Config.KeyPrefix", err)
	}
	_, err = redis.NewFromClient(goredis.NewClient(&goredis.Options{}), redis.Config{TTLMargin: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "Config.TTLMargin") {
		t.Fatalf("NewFromClient with TTLMargin -1s: err = %v, want one naming Config.TTLMargin", err)
	}
}

// TestRedisHoldsNeitherRawKeyNorScope claims, completes and claims again, then reads
// every key and every value the store wrote.
func TestRedisHoldsNeitherRawKeyNorScope(t *testing.T) {
	t.Parallel()
	s, prefix := openStorePrefix(t, testenv.RedisURL(t))
	ctx := t.Context()
	scope, key := "scope-"+rand.Text(), "key-"+rand.Text()
	p := claimParams(scope, key, time.Time{})
	if _, err := s.RecordClaim(ctx, p); err != nil {
		t.Fatal(err)
	}
	resp := &idemstore.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"ch_1"}`)}
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: scope, Key: key, Token: p.Token, Response: resp, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// A second, in-flight record too.
	if _, err := s.RecordClaim(ctx, claimParams(scope, key+"-2", time.Time{})); err != nil {
		t.Fatal(err)
	}
	keys := scanPrefix(t, s.Client(), prefix)
	if len(keys) != 2 {
		t.Fatalf("Redis holds %d keys under the store's prefix, want 2: %q", len(keys), keys)
	}
	for _, k := range keys {
		if strings.Contains(k, scope) || strings.Contains(k, key) {
			t.Errorf("Redis key %q contains the raw scope or key", k)
		}
		fields, err := s.Client().HGetAll(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range fields {
			if strings.Contains(f+v, scope) || strings.Contains(f+v, key) {
				t.Errorf("Redis hash %s field %s = %q contains the raw scope or key", k, f, v)
			}
		}
	}
	rec, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: scope, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Scope != scope || rec.Key != key || !rec.Response.Equal(resp) {
		t.Fatalf("RecordGet = scope %q key %q response %+v, want %q %q %+v", rec.Scope, rec.Key, rec.Response, scope, key, resp)
	}
}

// TestScriptsRunAgainAfterScriptFlush checks the EVAL fallback: after SCRIPT FLUSH
// (as after a restart or failover) EVALSHA fails with NOSCRIPT, and the store's calls
// must still succeed, loading the scripts again.
func TestScriptsRunAgainAfterScriptFlush(t *testing.T) {
	t.Parallel()
	// A private server, so that flushing its script cache disturbs no other test.
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL())
	ctx := t.Context()
	scope, key := "scope", "key-"+rand.Text()
	p := claimParams(scope, key, time.Time{})
	if _, err := s.RecordClaim(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := s.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Client().Info(ctx, "memory").Result(); !strings.Contains(n, "number_of_cached_scripts:0") {
		t.Fatalf("SCRIPT FLUSH left scripts cached:\n%s", n)
	}
	if _, err := s.RecordRenew(ctx, &idemstore.RenewParams{Scope: scope, Key: key, Token: p.Token, Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatalf("RecordRenew after SCRIPT FLUSH: %v", err)
	}
	dup := claimParams(scope, key, time.Time{})
	dup.Fingerprint = p.Fingerprint
	res, err := s.RecordClaim(ctx, dup)
	if err != nil {
		t.Fatalf("RecordClaim after SCRIPT FLUSH: %v", err)
	}
	if res.Outcome != idemstore.ClaimInFlight {
		t.Fatalf("RecordClaim after SCRIPT FLUSH = %v, want in_flight", res.Outcome)
	}
	if _, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: scope, Key: key}); err != nil {
		t.Fatalf("RecordGet after SCRIPT FLUSH: %v", err)
	}
}

// TestClaimUsesRedisClock: without an injected Now, the scripts read Redis's TIME.
func TestClaimUsesRedisClock(t *testing.T) {
	t.Parallel()
	s := openStore(t, testenv.RedisURL(t))
	ctx := t.Context()
	before, err := s.Client().Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	p := claimParams("scope", "key-"+rand.Text(), time.Time{})
	res, err := s.RecordClaim(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	after, err := s.Client().Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if res.Now.Before(before.Truncate(time.Microsecond)) || res.Now.After(after) {
		t.Fatalf("claim's Now = %v, want Redis TIME between %v and %v", res.Now, before, after)
	}
	if !res.Record.CreatedAt.Equal(res.Now) || !res.Record.LeaseEnd.Equal(res.Now.Add(p.Lease)) {
		t.Fatalf("record created %v lease end %v, want %v and %v", res.Record.CreatedAt, res.Record.LeaseEnd, res.Now, res.Now.Add(p.Lease))
	}
}

// TestKeyTTLRunsMarginPastExpiry: Redis drops a record's key only TTLMargin after the
// record's expires_at, so the stored field, not the key TTL, decides expiry.
func TestKeyTTLRunsMarginPastExpiry(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	margin := 5 * time.Minute
	prefix := testenv.Name("idemtest") + ":"
	s, err := redis.Open(t.Context(), url, redis.Config{KeyPrefix: prefix, TTLMargin: margin, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePrefix(t, s.Client(), prefix); s.Close() })
	ctx := t.Context()
	// An injected clock far from Redis's: the TTL is relative to it.
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	p := claimParams("scope", "key-"+rand.Text(), now)
	p.TTL = time.Hour
	if _, err := s.RecordClaim(ctx, p); err != nil {
		t.Fatal(err)
	}
	rk := s.RecordKey(p.Scope, p.Key)
	checkTTL := func(what string, want time.Duration) {
		t.Helper()
		ttl, err := s.Client().PTTL(ctx, rk).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl > want || ttl < want-5*time.Second {
			t.Fatalf("%s: key TTL = %v, want about %v (expires_at − now + margin)", what, ttl, want)
		}
	}
	checkTTL("in flight", time.Hour+margin)
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
		Response: &idemstore.Response{Status: 200}, TTL: 2 * time.Hour, Now: now.Add(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	checkTTL("completed", 2*time.Hour-10*time.Minute+margin)
	// Past expires_at the record is absent, though its key is still there.
	if _, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: p.Scope, Key: p.Key, Now: now.Add(2 * time.Hour)}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordGet at expires_at: err = %v, want ErrNotFound", err)
	}
	if n, _ := s.Client().Exists(ctx, rk).Result(); n != 1 {
		t.Fatalf("key gone at expires_at; want it kept for the margin")
	}
}

// TestLeaseLostIsNormalised: fenced failures are idem.ErrLeaseLost, a missing record
// idem.ErrNotFound.
func TestLeaseLostIsNormalised(t *testing.T) {
	t.Parallel()
	s := openStore(t, testenv.RedisURL(t))
	ctx := t.Context()
	scope, key := "scope", "key-"+rand.Text()
	if _, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: scope, Key: key}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordGet of an absent record: err = %v, want ErrNotFound", err)
	}
	if err := s.RecordRelease(ctx, &idemstore.ReleaseParams{Scope: scope, Key: key, Token: "tok"}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("RecordRelease of an absent record: err = %v, want ErrLeaseLost", err)
	}
	if _, err := s.RecordRenew(ctx, &idemstore.RenewParams{Scope: scope, Key: key, Token: "tok", Lease: time.Second, TTL: time.Hour}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("RecordRenew of an absent record: err = %v, want ErrLeaseLost", err)
	}
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: scope, Key: key, Token: "tok", Response: &idemstore.Response{Status: 200}, TTL: time.Hour}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("RecordComplete of an absent record: err = %v, want ErrLeaseLost", err)
	}
}

// TestLargeBodyRoundTrips: a 1 MiB binary body comes back byte for byte.
func TestLargeBodyRoundTrips(t *testing.T) {
	t.Parallel()
	s := openStore(t, testenv.RedisURL(t))
	ctx := t.Context()
	body := make([]byte, 1<<20)
	_, _ = rand.Read(body)
	p := claimParams("scope", "key-"+rand.Text(), time.Time{})
	if _, err := s.RecordClaim(ctx, p); err != nil {
		t.Fatal(err)
	}
	resp := &idemstore.Response{Status: 200, Body: body}
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	res, err := s.RecordClaim(ctx, &idemstore.ClaimParams{Scope: p.Scope, Key: p.Key, Fingerprint: p.Fingerprint, Token: "t2", RecordID: "r2", Lease: time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != idemstore.ClaimCompleted || !bytes.Equal(res.Record.Response.Body, body) {
		t.Fatalf("replay: outcome %v, body equal %v", res.Outcome, bytes.Equal(res.Record.Response.Body, body))
	}
}

func TestNewClientAcceptsURLForms(t *testing.T) {
	t.Parallel()
	cases := []struct {
		url     string
		cluster bool
		addrs   []string
	}{
		{"redis://127.0.0.1:6379/0", false, []string{"127.0.0.1:6379"}},
		{"redis://user:secret@127.0.0.1:6380/2", false, []string{"127.0.0.1:6380"}},
		{"rediss://127.0.0.1:6379", false, []string{"127.0.0.1:6379"}},
		{"redis+cluster://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002", true, []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}},
		{"rediss+cluster://u:p@10.0.0.1:7000?dial_timeout=3s", true, []string{"10.0.0.1:7000"}},
	}
	for _, c := range cases {
		client, err := redis.NewClient(c.url)
		if err != nil {
			t.Errorf("NewClient(%q): %v", c.url, err)
			continue
		}
		switch cl := client.(type) {
		case *goredis.ClusterClient:
			if !c.cluster {
				t.Errorf("NewClient(%q) is a cluster client", c.url)
			} else if got := cl.Options().Addrs; strings.Join(got, ",") != strings.Join(c.addrs, ",") {
				t.Errorf("NewClient(%q) addrs = %v, want %v", c.url, got, c.addrs)
			}
		case *goredis.Client:
			if c.cluster {
				t.Errorf("NewClient(%q) is not a cluster client", c.url)
			} else if got := cl.Options().Addr; got != c.addrs[0] {
				t.Errorf("NewClient(%q) addr = %v, want %v", c.url, got, c.addrs[0])
			}
		}
		client.Close()
		if !redis.IsURL(c.url) {
			t.Errorf("IsURL(%q) = false", c.url)
		}
	}
}

func TestNewClientRejectsBadURLsWithoutLeakingPasswords(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"postgres://127.0.0.1/db",
		"127.0.0.1:6379",
		"redis://u:hunter2@127.0.0.1:6379/0?bogus=1",
		"redis+cluster://u:hunter2@127.0.0.1:7000?addr=nonsense",
		"redis+cluster://u:hunter2@127.0.0.1:7000/3?unknown=1",
		"redis://:hunter2@127.0.0.1:abc/0",                // url.Parse's error quotes the URL
		"rediss+cluster://:hunter2@127.0.0.1:abc",         // the same, through ParseClusterURL
		"redis://127.0.0.1:6379/0?password=hunter2&bogus", // a password in the query
		"redis+cluster://127.0.0.1:7000?password=hunter2&addr=nonsense",
	} {
		_, err := redis.NewClient(u)
		if err == nil {
			t.Errorf("NewClient(%q) succeeded, want an error", u)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("NewClient(%q) error %q reveals the password", u, err)
		}
	}
	if redis.IsURL("postgres://x") || redis.IsURL("sqlite:idem.db") {
		t.Error("IsURL accepts a non-Redis URL")
	}
}

func TestOpenFailsWhenRedisIsUnreachable(t *testing.T) {
	t.Parallel()
	port := redistest.FreePort(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := redis.Open(ctx, "redis://127.0.0.1:"+itoa(port)+"/0?max_retries=-1", redis.Config{Logger: discardLogger()})
	if err == nil {
		t.Fatal("Open of a closed port succeeded")
	}
}

// TestResentClaimRecognisesItsOwnToken: go-redis re-sends a command after a network
// error, so a claim script may run twice; the second run must not report the
// caller's own record as another request's.
func TestResentClaimRecognisesItsOwnToken(t *testing.T) {
	t.Parallel()
	s := openStore(t, testenv.RedisURL(t))
	ctx := t.Context()
	p := claimParams("scope", "key-"+rand.Text(), time.Time{})
	first, err := s.RecordClaim(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.RecordClaim(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if again.Outcome != idemstore.ClaimAcquired || again.Record.Token != p.Token || !again.Record.LeaseEnd.Equal(first.Record.LeaseEnd) {
		t.Fatalf("re-sent claim = %v token %q lease %v, want acquired with the same token and lease %v",
			again.Outcome, again.Record.Token, again.Record.LeaseEnd, first.Record.LeaseEnd)
	}
}
