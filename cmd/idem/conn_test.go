package main

import (
	"testing"
	"time"

	"github.com/idem-go/idem/store/redis"
)

func TestPostgresConnectionsAreBoundedUnlessTheURLSaysOtherwise(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url     string
		timeout time.Duration
		conns   int32
	}{
		{"postgres://u@db/app", 3 * time.Second, 7},
		{"postgres://u@db/app?connect_timeout=9&pool_max_conns=2", 9 * time.Second, 2},
	} {
		cfg, err := postgresPoolConfig(tc.url, 7, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ConnConfig.ConnectTimeout != tc.timeout || cfg.MaxConns != tc.conns {
			t.Errorf("%s: connect timeout %v, %d connections; want %v, %d", tc.url,
				cfg.ConnConfig.ConnectTimeout, cfg.MaxConns, tc.timeout, tc.conns)
		}
		if cfg.ConnConfig.DialFunc == nil {
			t.Errorf("%s: no dialer with keepalives and a user timeout", tc.url)
		}
	}
}

func TestRedisURLsGetTimeoutsUnlessTheySetThem(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://127.0.0.1:6379/0":                                      "redis://127.0.0.1:6379/0?dial_timeout=2s&read_timeout=2s&write_timeout=2s",
		"redis://h:1/0?read_timeout=9s":                                 "redis://h:1/0?read_timeout=9s&dial_timeout=2s&write_timeout=2s",
		"redis+cluster://n1:7000?addr=n2:7000":                          "redis+cluster://n1:7000?addr=n2:7000&dial_timeout=2s&read_timeout=2s&write_timeout=2s",
		"rediss://h:1?dial_timeout=1s&read_timeout=1s&write_timeout=1s": "rediss://h:1?dial_timeout=1s&read_timeout=1s&write_timeout=1s",
		// Sentinels without a port each, which url.Parse refuses: the URL's own
		// read_timeout is still seen, and kept.
		"redis+sentinel://s1,s2,[::1]/0?master=m&read_timeout=9s&wait_replicas=1": "redis+sentinel://s1,s2,[::1]/0?master=m&read_timeout=9s&wait_replicas=1&dial_timeout=2s&write_timeout=2s",
	} {
		got := redisURLWithTimeouts(in, 2*time.Second)
		if got != want {
			t.Errorf("redisURLWithTimeouts(%q) = %q, want %q", in, got, want)
		}
		c, err := redis.NewClient(got)
		if err != nil {
			t.Errorf("go-redis refuses %q: %v", got, err)
			continue
		}
		_ = c.Close()
	}
}
