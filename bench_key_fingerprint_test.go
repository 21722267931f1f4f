package idem

import (
	"net/http"
	"net/url"
	"testing"
)

func BenchmarkParseKey(b *testing.B) {
	for _, bc := range []struct{ name, value string }{
		{"bare UUID", uuidKey},
		{"quoted UUID", `"` + uuidKey + `"`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			values := []string{bc.value}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ParseKey(values, DefaultMinKeyLength); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchmarkFingerprint(b *testing.B, target, contentType, body string) {
	u, err := url.ParseRequestURI(target)
	if err != nil {
		b.Fatal(err)
	}
	r := &http.Request{Method: http.MethodPost, URL: u, Header: http.Header{"Content-Type": {contentType}}}
	data := []byte(body)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		FingerprintRequest(r, data)
	}
}

// The body of SPEC §11's charge, as the issue 5 budget counts it.
func BenchmarkFingerprintChargeJSON(b *testing.B) {
	benchmarkFingerprint(b, "/v1/charges", "application/json", chargeBody)
}

func BenchmarkFingerprintForm(b *testing.B) {
	benchmarkFingerprint(b, "/v1/charges", "application/x-www-form-urlencoded", "currency=usd&amount=2000&customer_id=cust_abc123&metadata%5Border%5D=ord_1")
}

func BenchmarkCanonicalJSON(b *testing.B) {
	for _, bc := range []struct{ name, body string }{
		{"charge", chargeBody},
		{"unsorted nested", `{"z": {"y": [1, 2, {"b": "x", "a": "\u00e9"}], "x": null}, "metadata": {"order": "ord_1", "customer": "cust_1"}, "amount": 2000}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			src := []byte(bc.body)
			var dst []byte
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				var ok bool
				if dst, ok = CanonicalJSON(dst[:0], src); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}
