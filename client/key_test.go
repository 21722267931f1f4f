package client

import (
	"testing"

	"github.com/idem-go/idem"
)

// NewKey makes UUID v4 keys (version nibble 4, variant bits 10) that idem accepts,
// and never the same one twice.
func TestNewKeyIsRandomUUIDv4(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 10000 {
		k := NewKey()
		if !uuidV4.MatchString(k) {
			t.Fatalf("NewKey() = %q, not a lower-case UUID v4", k)
		}
		if seen[k] {
			t.Fatalf("NewKey() repeated %q", k)
		}
		seen[k] = true
		if _, err := idem.ParseKey([]string{k}, 8); err != nil {
			t.Fatalf("idem.ParseKey(%q): %v", k, err)
		}
	}
}
