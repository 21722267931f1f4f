package redis

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/store/redis/redistest"
)

// The Sentinels' side of a Sentinel URL: every address in the host part (a missing
// port is 26379), the master's name, the Sentinels' own credentials, and go-redis's
// options, which reach the failover options.
func TestSentinelURLNamesTheSentinelsAndTheirCredentials(t *testing.T) {
	for _, tc := range []struct {
		rest        string
		addrs       []string
		user, pw    string
		dialTimeout time.Duration
	}{
		{rest: "10.0.0.1:26379/0?master=orders", addrs: []string{"10.0.0.1:26379"}},
		{rest: "s1,s2:26380,[::1],[::1]:26381/3?master=orders", addrs: []string{"s1:26379", "s2:26380", "[::1]:26379", "[::1]:26381"}},
		{rest: "app:pw@s1:1,s2:2?master=orders&sentinel_username=sen&sentinel_password=s%26pw&dial_timeout=2s",
			addrs: []string{"s1:1", "s2:2"}, user: "sen", pw: "s&pw", dialTimeout: 2 * time.Second},
	} {
		o, err := parseSentinelURL(false, tc.rest)
		if err != nil {
			t.Errorf("parseSentinelURL(%q): %v", tc.rest, err)
			continue
		}
		if o.MasterName != "orders" || !slices.Equal(o.SentinelAddrs, tc.addrs) || o.SentinelUsername != tc.user || o.SentinelPassword != tc.pw || o.DialTimeout != tc.dialTimeout {
			t.Errorf("parseSentinelURL(%q): master %q sentinels %v user %q password %q dial_timeout %v; want orders %v %q %q %v",
				tc.rest, o.MasterName, o.SentinelAddrs, o.SentinelUsername, o.SentinelPassword, o.DialTimeout, tc.addrs, tc.user, tc.pw, tc.dialTimeout)
		}
	}
}

// The store's own parameters are taken out of every URL form, the rest kept as given.
func TestConfigParamsAreCutFromTheQuery(t *testing.T) {
	for _, tc := range []struct {
		rest, left string
		cfg        urlConfig
	}{
		{"h:1/0", "h:1/0", urlConfig{}},
		{"h:1/0?wait_replicas=2&dial_timeout=1s&wait_timeout=50ms", "h:1/0?dial_timeout=1s",
			urlConfig{waitReplicas: 2, hasWaitReplicas: true, waitTimeout: 50 * time.Millisecond, hasWaitTimeout: true}},
		{"h:1?wait_replicas=0", "h:1", urlConfig{hasWaitReplicas: true}},
		{"h:1?a=1&wait%5Freplicas=1&b=2#frag", "h:1?a=1&b=2#frag", urlConfig{waitReplicas: 1, hasWaitReplicas: true}},
	} {
		left, cfg, err := cutConfigParams(tc.rest)
		if err != nil || left != tc.left || cfg != tc.cfg {
			t.Errorf("cutConfigParams(%q) = %q, %+v, %v; want %q, %+v", tc.rest, left, cfg, err, tc.left, tc.cfg)
		}
	}
	if _, _, err := cutConfigParams("h:1?wait_timeout=soon"); err == nil || !strings.Contains(err.Error(), "positive duration") {
		t.Errorf("a bad wait_timeout: %v", err)
	}
}

// A rediss+sentinel:// URL reaches the Sentinels and the master over TLS, and its TLS
// configuration names no server: given the test's authority (which a URL cannot name),
// the client verifies each Sentinel and the master against the host it dials.
func TestSentinelURLOverTLSVerifiesEachHostItDials(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment of five processes; skipped with -short")
	}
	t.Parallel()
	ca := redistest.NewTLS(t)
	d := redistest.StartSentinel(t, redistest.SentinelOptions{TLS: ca, Password: "pw"})
	rest := strings.TrimPrefix(strings.Replace(d.URL(), "&skip_verify=true", "", 1), SchemeSentinelTLS+"://")
	o, err := parseSentinelURL(true, rest)
	if err != nil {
		t.Fatal(err)
	}
	if o.TLSConfig == nil || o.TLSConfig.ServerName != "" || o.TLSConfig.InsecureSkipVerify {
		t.Fatalf("TLS configuration %+v; want one that verifies, naming no server", o.TLSConfig)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	o.TLSConfig.RootCAs = ca.Roots
	o.MaxRetries = -1
	c := goredis.NewFailoverClient(o)
	defer c.Close()
	if err := c.Set(ctx, "tls-probe", "1", time.Minute).Err(); err != nil {
		t.Fatalf("a write through the Sentinels over TLS, verified: %v", err)
	}
	// The URL as given (skip_verify=true) opens a store that works over TLS.
	s, err := Open(ctx, d.URL(), Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("Open(%s): %v", d.URL(), err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping over TLS: %v", err)
	}
	// Without the authority, the same URL is refused: the client does verify.
	o2, _ := parseSentinelURL(true, rest)
	o2.MaxRetries = -1
	c2 := goredis.NewFailoverClient(o2)
	defer c2.Close()
	if err := c2.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client that does not trust the test's authority: %v; want a certificate error", err)
	}
}
