package headercodec

import (
	"net/http"
	"testing"
)

func TestHeadersRoundTripByteForByte(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]http.Header{
		"nil":       nil,
		"odd bytes": {"X-Obs-Text": {"\x80\xa0\xfe\xff"}, "X-Empty": {""}, "Link": {"<a>", "<b>"}},
		"no values": {"X-None": {}},
	} {
		got, err := Decode(Encode(h))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(got) != len(h) {
			t.Fatalf("%s: decoded %q, want %q", name, got, h)
		}
		for k, vs := range h {
			if len(got[k]) != len(vs) {
				t.Fatalf("%s: %s = %q, want %q", name, k, got[k], vs)
			}
			for i := range vs {
				if got[k][i] != vs[i] {
					t.Fatalf("%s: %s = %q, want %q", name, k, got[k], vs)
				}
			}
		}
	}
}

func TestMalformedHeadersAreAnError(t *testing.T) {
	t.Parallel()
	for _, b := range [][]byte{{0x05, 'a'}, {0x01, 'a', 0x09}, {0x80}} {
		if _, err := Decode(b); err == nil {
			t.Errorf("Decode(%q) succeeded", b)
		}
	}
}
