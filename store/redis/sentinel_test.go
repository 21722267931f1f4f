package redis_test

import (
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/admin/admintest"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
	"github.com/idem-go/idem/store/storetest"
)

// TestSentinel starts a private Sentinel deployment (a master, a replica, three
// Sentinels) and runs the conformance suites through the failover client that a
// redis+sentinel:// URL opens, with claims that wait for the replica and without.
// The failover itself is TestSentinelFailover's.
func TestSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Sentinel deployment of five processes; skipped with -short")
	}
	t.Parallel()
	d := redistest.StartSentinel(t, redistest.SentinelOptions{})

	t.Run("Conformance", func(t *testing.T) {
		storetest.Run(t, harness(d.URL()))
	})
	t.Run("ConformanceWaitingForTheReplica", func(t *testing.T) {
		storetest.Run(t, harness(d.URL()+"&wait_replicas=1&read_timeout=10s&wait_timeout="+ackTimeout.String()))
	})
	t.Run("AdminConformance", func(t *testing.T) {
		admintest.Run(t, adminHarness(d.URL()))
	})
	t.Run("OpenWarnsThatAFailoverCanLoseRecordsUnlessClaimsWait", func(t *testing.T) {
		s, buf := openLogging(t, d.URL())
		warned := strings.Join(buf.lines(), "\n")
		if !strings.Contains(warned, "replicates asynchronously") || !strings.Contains(warned, "wait_replicas=1") {
			t.Fatalf("Open on a master with a replica logged:\n%s\nwant a warning that a failover can lose records, naming wait_replicas", warned)
		}
		if ws := s.CheckDurability(t.Context()); !strings.Contains(strings.Join(ws, "\n"), `(master "idemtest" of the Sentinels)`) {
			t.Fatalf("CheckDurability = %q, want the node named as the Sentinels' master", ws)
		}
		_, buf = openLogging(t, d.URL()+"&wait_replicas=1")
		if warned := strings.Join(buf.lines(), "\n"); strings.Contains(warned, "replication:") {
			t.Fatalf("Open with wait_replicas=1 on a master with a replica logged:\n%s\nwant no replication warning", warned)
		}
		_, buf = openLogging(t, d.URL()+"&wait_replicas=2")
		if warned := strings.Join(buf.lines(), "\n"); !strings.Contains(warned, "wait for 2 replica(s)") || !strings.Contains(warned, "has 1 connected") {
			t.Fatalf("Open with wait_replicas=2 on a master with one replica logged:\n%s\nwant a warning that every claim fails", warned)
		}
	})
}

// A Sentinel URL opens go-redis's failover client with the database, the master's
// credentials from the userinfo, and TLS (url_internal_test.go checks the Sentinels'
// side: addresses, master name, their credentials).
func TestSentinelURLOpensAFailoverClient(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url       string
		db        int
		user, pw  string
		tls, skip bool
	}{
		{url: "redis+sentinel://10.0.0.1:26379/0?master=orders"},
		{url: "redis+sentinel://s1,s2:26380,[::1],[::1]:26381/3?master=orders", db: 3},
		{url: "redis+sentinel://app:pa%3Ass@s1:1,s2:2?master=orders&sentinel_username=sen&sentinel_password=spw&dial_timeout=2s", user: "app", pw: "pa:ss"},
		{url: "REDISS+SENTINEL://:pw@s1:1/?master=orders", pw: "pw", tls: true},
		{url: "rediss+sentinel://s1:1?master=orders&skip_verify=true&wait_replicas=1", tls: true, skip: true},
	} {
		if !redis.IsURL(tc.url) {
			t.Errorf("IsURL(%q) = false", tc.url)
		}
		c, err := redis.NewClient(tc.url)
		if err != nil {
			t.Errorf("NewClient(%q): %v", tc.url, err)
			continue
		}
		fc, ok := c.(*goredis.Client)
		if !ok {
			t.Errorf("NewClient(%q) is a %T, want go-redis's failover client", tc.url, c)
			continue
		}
		o := fc.Options()
		if o.Addr != "FailoverClient" || o.DB != tc.db || o.Username != tc.user || o.Password != tc.pw || !o.ContextTimeoutEnabled {
			t.Errorf("NewClient(%q): addr %q db %d user %q password %q context timeouts %v", tc.url, o.Addr, o.DB, o.Username, o.Password, o.ContextTimeoutEnabled)
		}
		if (o.TLSConfig != nil) != tc.tls || (tc.tls && (o.TLSConfig.ServerName != "" || o.TLSConfig.InsecureSkipVerify != tc.skip)) {
			t.Errorf("NewClient(%q): TLS %+v, want TLS %v (no fixed ServerName), skip_verify %v", tc.url, o.TLSConfig, tc.tls, tc.skip)
		}
		c.Close()
	}
}

// A malformed Sentinel URL is refused with one line that says what is wrong, and no
// password in it.
func TestMalformedSentinelURLsAreRefusedPrecisely(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"redis+sentinel://:hunter2@s1:26379/0", "no master name: add ?master=NAME"},
		{"redis+sentinel://:hunter2@s1:26379/0?master=", "no master name"},
		{"redis+sentinel://:hunter2@/0?master=m", "no Sentinel address"},
		{"redis+sentinel://:hunter2@s1:26379,,s2/0?master=m", "an empty Sentinel address"},
		{"redis+sentinel://:hunter2@s1:abc/0?master=m", `Sentinel address "s1:abc": port "abc" is not a number`},
		{"redis+sentinel://:hunter2@s1:70000?master=m", "from 1 to 65535"},
		{"redis+sentinel://:hunter2@::1:5/0?master=m", `Sentinel address "::1:5": want host:port`},
		{"redis+sentinel://:hunter2@s1/x?master=m", `database "x": want a number`},
		{"redis+sentinel://:hunter2@s1/0?master=m&master=n", "master is given 2 times"},
		{"redis+sentinel://s1/0?master_name=m", "name the master with master=NAME"},
		{"redis+sentinel://s1/0?master=m&addr=s2:1", "list every Sentinel in the host part"},
		{"redis+sentinel://s1/0?master=m&password=hunter2", "the Redis user and password go in the userinfo"},
		{"redis+sentinel://s1/0?master=m&sentinel_password=hunter2&bogus=1", "unexpected option: bogus"},
		{"redis+sentinel://s1/0?master=m&sentinel_password=hunter2&dial_timeout=x", "dial_timeout"},
		{"redis+sentinel://:hunter2@s1/0?master=m&skip_verify=true", "skip_verify is for TLS: use rediss+sentinel://"},
		{"rediss+sentinel://:hunter2@s1/0?master=m&skip_verify=maybe", "want true or false"},
		{"redis+sentinel://:hunter2@s1/0?master=m&wait_replicas=x", "wait_replicas"},
		{"redis+sentinel://:hun%zzter2@s1/0?master=m", "bad %-escape"},
		{"redis+sentinel://:hunter2@s1/0?master=m&sentinel_password=%zz", "query"},
	} {
		_, err := redis.NewClient(tc.url)
		switch {
		case err == nil:
			t.Errorf("NewClient(%q) succeeded, want an error saying %q", tc.url, tc.want)
		case !strings.Contains(err.Error(), tc.want):
			t.Errorf("NewClient(%q): %v\nwant it to say %q", tc.url, err, tc.want)
		case strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "hun%zzter2"):
			t.Errorf("NewClient(%q): %v reveals the password", tc.url, err)
		case strings.Contains(err.Error(), "\n"):
			t.Errorf("NewClient(%q): %q is more than one line", tc.url, err)
		}
	}
}
