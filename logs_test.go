package idem_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// The middleware (through its guard) logs a store outage once per interval, whatever
// the number of requests that fail on it.
func TestAStoreOutageIsLoggedOncePerInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.store.down.Store(true)
	h := b.mw.Handler(&counter{})
	for i := range 20 {
		wantCode(t, serve(h, req("POST", "/x", key+itoa(int64(i)), "{}")), 503, idem.CodeStoreUnavailable)
	}
	if n := strings.Count(b.logs.String(), "idem: store claim failed"); n != 1 {
		t.Fatalf("%d lines for 20 failed claims in one interval, want 1:\n%s", n, b.logs)
	}
}
