package idem

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
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
				if dst, ok = canonicalJSON(dst[:0], src); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
}

// BenchmarkCanonicalJSONDeepVsFlat canonicalises, side by side, a 1 MiB body nested 999
// deep (every object's members out of order, the bulk innermost) and a flat 1 MiB body
// (one object out of order around the same bulk), and reports deep/flat: the cost of
// canonicalisation is linear in the body's size at any depth (issue 9: 14× before).
func BenchmarkCanonicalJSONDeepVsFlat(b *testing.B) {
	const size = 1 << 20
	deep := []byte(deepUnsortedJSON(998, bulkJSONArray(size-998*len(`{"z":,"a":0}`))))
	flat := []byte(deepUnsortedJSON(1, bulkJSONArray(size-len(`{"z":,"a":0}`))))
	var dst []byte
	var deepTime, flatTime time.Duration
	run := func(src []byte, total *time.Duration) {
		start := time.Now()
		var ok bool
		if dst, ok = canonicalJSON(dst[:0], src); !ok {
			b.Fatal("refused")
		}
		*total += time.Since(start)
	}
	b.SetBytes(int64(len(deep) + len(flat)))
	for b.Loop() {
		run(deep, &deepTime)
		run(flat, &flatTime)
	}
	b.ReportMetric(float64(deepTime.Nanoseconds())/float64(b.N), "deep-ns/op")
	b.ReportMetric(float64(flatTime.Nanoseconds())/float64(b.N), "flat-ns/op")
	b.ReportMetric(float64(deepTime)/float64(flatTime), "deep/flat")
}

// bulkJSONArray is a JSON array of n bytes of short strings and numbers.
func bulkJSONArray(n int) string {
	var s strings.Builder
	s.WriteByte('[')
	for i := 0; s.Len() < n-16; i++ {
		if i > 0 {
			s.WriteByte(',')
		}
		fmt.Fprintf(&s, `"sku-%06d",%d`, i, i%1000)
	}
	s.WriteString(strings.Repeat(" ", n-1-s.Len()))
	s.WriteByte(']')
	return s.String()
}
