package redis

import (
	"net/http"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// Header values may hold any byte (obs-text is not UTF-8); the encoding keeps them all.
func TestHeaderEncodingRoundTripsAnyBytes(t *testing.T) {
	t.Parallel()
	bytesString := rapid.Custom(func(t *rapid.T) string { return string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes")) })
	rapid.Check(t, func(t *rapid.T) {
		h := http.Header{}
		for _, name := range rapid.SliceOfN(bytesString, 1, 5).Draw(t, "names") {
			h[name] = rapid.SliceOf(bytesString).Draw(t, "values")
		}
		got, err := decodeHeader(encodeHeader(h))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(h) {
			t.Fatalf("decoded %d names, want %d", len(got), len(h))
		}
		for k, v := range h {
			if !slices.Equal(got[k], v) && len(v)+len(got[k]) > 0 {
				t.Fatalf("%q: %q, want %q", k, got[k], v)
			}
		}
	})
}

// A truncated encoding is an error, never a panic or a silently shorter header.
func TestHeaderDecodingRejectsTruncatedInput(t *testing.T) {
	t.Parallel()
	enc := encodeHeader(http.Header{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}})
	for n := 1; n < len(enc); n++ {
		if h, err := decodeHeader(enc[:n]); err == nil {
			// A cut exactly between two names decodes to fewer names: still detectable.
			if len(h) >= 2 {
				t.Fatalf("decodeHeader of %d of %d bytes = %q, want an error", n, len(enc), h)
			}
		}
	}
}
