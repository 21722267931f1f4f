package postgres

import (
	"net/http"
	"testing"

	"pgregory.net/rapid"
)

// anyString draws a string of arbitrary bytes (obs-text, NUL, invalid UTF-8).
var anyString = rapid.Custom(func(t *rapid.T) string {
	return string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes"))
})

func TestHeadersRoundTripByteForByte(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		h := http.Header{}
		for _, name := range rapid.SliceOfDistinct(anyString, func(s string) string { return s }).Draw(t, "names") {
			h[name] = rapid.SliceOf(anyString).Draw(t, "values")
		}
		got, err := decodeHeaders(encodeHeaders(h))
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if len(got) != len(h) {
			t.Fatalf("decoded %d names, want %d", len(got), len(h))
		}
		for name, want := range h {
			g := got[name]
			if len(g) != len(want) {
				t.Fatalf("%q: %d values, want %d", name, len(g), len(want))
			}
			for i := range want {
				if g[i] != want[i] {
					t.Fatalf("%q[%d] = %q, want %q", name, i, g[i], want[i])
				}
			}
		}
	})
}

func TestTruncatedHeadersAreAnErrorNotAPanic(t *testing.T) {
	enc := encodeHeaders(http.Header{"Content-Type": {"application/json"}, "X-Obs": {"\x80\xff", ""}})
	for n := 1; n < len(enc); n++ {
		if _, err := decodeHeaders(enc[:n]); err == nil {
			t.Errorf("decoding the first %d of %d bytes succeeded", n, len(enc))
		}
	}
	if _, err := decodeHeaders(append(enc, 0)); err == nil {
		t.Error("decoding with a trailing byte succeeded")
	}
}
