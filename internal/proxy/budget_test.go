package proxy

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// The budget counts the bytes held by every body at once, as they arrive: a client
// that announces a large body holds no more than the first read's buffer, and a body
// that would pass the budget is refused with nothing left charged.
func TestTheBodyBudgetChargesWhatArrivesAndRefusesPastItsLimit(t *testing.T) {
	b := &bodyBudget{limit: 128 << 10, maxBody: 1 << 20}
	// An announced 1 MiB body of which 3 bytes came (then the client stalls: EOF here).
	announced, _ := http.NewRequest("POST", "/", io.NopCloser(strings.NewReader("abc")))
	announced.ContentLength = -1
	releaseA, ok := b.buffer(announced)
	if !ok || b.used.Load() > firstRead+3 {
		t.Fatalf("a 3-byte body charged %d bytes (ok=%v), want at most %d", b.used.Load(), ok, firstRead+3)
	}
	if got, _ := io.ReadAll(announced.Body); string(got) != "abc" {
		t.Fatalf("the middleware reads %q, want abc", got)
	}
	// 40 KiB (twice: the budget counts the middleware's copy too) fits beside it; a
	// second 40 KiB does not, and charges nothing.
	big := bytes.Repeat([]byte{'x'}, 40<<10)
	r1, _ := http.NewRequest("POST", "/", bytes.NewReader(big))
	release1, ok := b.buffer(r1)
	if !ok {
		t.Fatalf("40 KiB beside 3 bytes under a 128 KiB budget was refused (used %d)", b.used.Load())
	}
	before := b.used.Load()
	r2, _ := http.NewRequest("POST", "/", bytes.NewReader(big))
	if _, ok := b.buffer(r2); ok {
		t.Fatalf("a second 40 KiB body fit in a 128 KiB budget (used %d)", b.used.Load())
	}
	if b.used.Load() != before {
		t.Fatalf("a refused body left %d bytes charged", b.used.Load()-before)
	}
	if got, _ := io.ReadAll(r1.Body); !bytes.Equal(got, big) {
		t.Fatalf("the middleware reads %d bytes, want %d", len(got), len(big))
	}
	release1()
	releaseA()
	if n := b.used.Load(); n != 0 {
		t.Fatalf("%d bytes stay charged after every request ended", n)
	}
}

// A body declared over MaxBodyBytes is not read (the middleware refuses it 413 before
// reading); one that grows over it is read one byte past it, for the same 413.
func TestTheBodyBudgetLeavesTooLargeBodiesToTheMiddleware(t *testing.T) {
	b := &bodyBudget{limit: 1 << 30, maxBody: 1000}
	declared, _ := http.NewRequest("POST", "/", bytes.NewReader(make([]byte, 2000)))
	release, ok := b.buffer(declared)
	if !ok || b.used.Load() != 0 {
		t.Fatalf("a body declared too large was read: used %d", b.used.Load())
	}
	release()
	chunked, _ := http.NewRequest("POST", "/", io.NopCloser(bytes.NewReader(make([]byte, 5000))))
	chunked.ContentLength = -1
	release, ok = b.buffer(chunked)
	defer release()
	if !ok {
		t.Fatal("refused")
	}
	if got, _ := io.ReadAll(io.LimitReader(chunked.Body, 1001)); len(got) != 1001 {
		t.Fatalf("the middleware reads %d bytes first, want 1001 (its limit + 1)", len(got))
	}
}
