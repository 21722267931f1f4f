package redis

import (
	"strings"
	"testing"
)

func TestDurabilityWarningsJudgeEachSetting(t *testing.T) {
	t.Parallel()
	safe := map[string]string{"appendonly": "yes", "appendfsync": "always", "save": "3600 1", "maxmemory-policy": "noeviction"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for a, b := range safe {
			m[a] = b
		}
		m[k] = v
		return m
	}
	cases := []struct {
		name string
		conf map[string]string
		want []string // substrings, one per expected warning, in order
	}{
		{"aof always noeviction is durable", safe, nil},
		{"no persistence at all", with("appendonly", "no"), []string{"appendonly is no"}},
		{"persistence off", map[string]string{"appendonly": "no", "appendfsync": "everysec", "save": "", "maxmemory-policy": "noeviction"}, []string{"persistence is off"}},
		{"fsync everysec", with("appendfsync", "everysec"), []string{"appendfsync is everysec"}},
		{"fsync no", with("appendfsync", "no"), []string{"appendfsync is no"}},
		{"volatile eviction", with("maxmemory-policy", "volatile-ttl"), []string{"maxmemory-policy is volatile-ttl"}},
		{"lru eviction", with("maxmemory-policy", "allkeys-lru"), []string{"maxmemory-policy is allkeys-lru"}},
		{"everything wrong", map[string]string{"appendonly": "no", "appendfsync": "no", "save": "", "maxmemory-policy": "allkeys-random"}, []string{"persistence is off", "maxmemory-policy is allkeys-random"}},
	}
	for _, c := range cases {
		got := durabilityWarnings(c.conf)
		if len(got) != len(c.want) {
			t.Errorf("%s: %d warnings %q, want %d", c.name, len(got), got, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: warning %q does not say %q", c.name, got[i], w)
			}
			if !strings.Contains(got[i], "executes it again") {
				t.Errorf("%s: warning %q does not say what it means for idempotency", c.name, got[i])
			}
		}
	}
}
