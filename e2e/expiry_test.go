package e2e

import (
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// ttl is the short record lifetime of the expiry tests; waiting it out is the product's
// behaviour under test, not synchronisation. purgeTTL is longer: the purge test first
// checks that live records survive a purge, which takes a process start or two.
const (
	ttl      = 2 * time.Second
	purgeTTL = 4 * time.Second
)

func TestExpiredKeyStartsNewOperation(t *testing.T) {
	t.Parallel()
	s, c := setup(t, "--ttl", ttl.String(), "--lock-timeout", "1s") // the TTL must outlive the lease
	key := newKey()
	first := c.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "first POST", first)
	wantReplayOf(t, "replay within the TTL", first, c.postCharge(t, s.URL(), key, chargeJSON(2000)), key)

	time.Sleep(ttl + 300*time.Millisecond)
	again := c.postCharge(t, s.URL(), key, chargeJSON(2000))
	want201(t, "POST after the TTL", again)
	if again.replayed() || again.id(t) == first.id(t) {
		t.Fatalf("after the TTL the key was replayed instead of charging anew:\nfirst %s\nagain %s", first, again)
	}
	if n := len(c.listCharges(t, s.URL())); n != 2 {
		t.Fatalf("after the TTL the principal has %d charges, want 2", n)
	}
}

var purgedRe = regexp.MustCompile(`purged (\d+) records?`)

// purge runs `idem purge --store store flags...` and returns the number it reports.
func purge(t *testing.T, store string, flags ...string) int {
	t.Helper()
	res := mustRunIdem(t, append([]string{"purge", "--store", store}, flags...)...)
	m := purgedRe.FindStringSubmatch(res.stdout + res.stderr)
	if m == nil {
		t.Fatalf("idem purge printed no \"purged N records\" line; stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestPurgeReportsHowManyRecordsItRemoved completes three keys with a short TTL, stops
// the server (so that no background cleaner races the purge), and purges.
func TestPurgeReportsHowManyRecordsItRemoved(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			store := newStore(t, kind)
			s := startServer(t, "--store", store, "--ttl", purgeTTL.String(), "--lock-timeout", "1s")
			c := newClient()
			for i := range 3 {
				want201(t, "POST", c.postCharge(t, s.URL(), newKey(), chargeJSON(2000+i)))
			}
			if n := purge(t, store); n != 0 {
				t.Fatalf("purge of live records removed %d, want 0", n)
			}
			s.stop(syscall.SIGTERM)

			time.Sleep(purgeTTL + 300*time.Millisecond)
			if n := purge(t, store, "--older-than", "1h"); n != 0 {
				t.Fatalf("purge --older-than 1h of records expired a moment ago removed %d, want 0", n)
			}
			if n := purge(t, store); n != 3 {
				t.Fatalf("purge of 3 expired records removed %d, want 3", n)
			}
			if n := purge(t, store); n != 0 {
				t.Fatalf("second purge removed %d, want 0", n)
			}
		})
	}
}
