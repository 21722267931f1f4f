package redis

import (
	"slices"
	"strings"
	"testing"
	"time"
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
