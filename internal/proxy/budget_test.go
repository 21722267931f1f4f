package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The budget counts the bytes held by every body at once, as they arrive: a client
// that announces a large body holds no more than the first read's buffer, and a body
// that would pass the budget is refused with nothing left charged.
func TestTheBodyBudgetChargesWhatArrivesAndRefusesPastItsLimit(t *testing.T) {
	b := newBodyBudget(128<<10, 128<<10, 1<<20, 0)
	// An announced 1 MiB body of which 3 bytes came (then the client stalls: EOF here).
	announced, _ := http.NewRequest("POST", "/", io.NopCloser(strings.NewReader("abc")))
	announced.ContentLength = -1
	releaseA, ok, _ := b.buffer(nil, announced)
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
	release1, ok, _ := b.buffer(nil, r1)
	if !ok {
		t.Fatalf("40 KiB beside 3 bytes under a 128 KiB budget was refused (used %d)", b.used.Load())
	}
	before := b.used.Load()
	r2, _ := http.NewRequest("POST", "/", bytes.NewReader(big))
	if _, ok, _ := b.buffer(nil, r2); ok {
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
	b := newBodyBudget(1<<30, 1<<30, 1000, 0)
	declared, _ := http.NewRequest("POST", "/", bytes.NewReader(make([]byte, 2000)))
	release, ok, _ := b.buffer(nil, declared)
	if !ok || b.used.Load() != 0 {
		t.Fatalf("a body declared too large was read: used %d", b.used.Load())
	}
	release()
	chunked, _ := http.NewRequest("POST", "/", io.NopCloser(bytes.NewReader(make([]byte, 5000))))
	chunked.ContentLength = -1
	release, ok, _ = b.buffer(nil, chunked)
	defer release()
	if !ok {
		t.Fatal("refused")
	}
	if got, _ := io.ReadAll(io.LimitReader(chunked.Body, 1001)); len(got) != 1001 {
		t.Fatalf("the middleware reads %d bytes first, want 1001 (its limit + 1)", len(got))
	}
}

// Each owner (a principal, an address) holds at most its share of the budget: past it
// its request is refused with nothing charged, while another owner's fits.
func TestAClientPastItsShareIsRefusedWhileOthersFit(t *testing.T) {
	b := newBodyBudget(1<<20, 32<<10, 1<<20, 0)
	body := func() *http.Request {
		r, _ := http.NewRequest("POST", "/", bytes.NewReader(make([]byte, 10<<10)))
		return r
	}
	releaseA, ok, _ := b.buffer(nil, body(), "principal a", "address 1")
	if !ok {
		t.Fatal("a's first body was refused")
	}
	used := b.used.Load()
	if _, ok, _ := b.buffer(nil, body(), "principal a2", "address 1"); ok {
		t.Fatalf("a second body from address 1 fit its 32 KiB share (used %d)", b.used.Load())
	}
	if _, ok, _ := b.buffer(nil, body(), "principal a", "address 2"); ok {
		t.Fatalf("a second body of principal a fit its 32 KiB share (used %d)", b.used.Load())
	}
	if b.used.Load() != used {
		t.Fatalf("the refused bodies left %d bytes charged", b.used.Load()-used)
	}
	releaseB, ok, _ := b.buffer(nil, body(), "principal b", "address 2")
	if !ok {
		t.Fatal("another client's body was refused")
	}
	releaseA()
	releaseB()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used.Load() != 0 || len(b.shares) != 0 {
		t.Fatalf("after every request ended: %d bytes, shares %v", b.used.Load(), b.shares)
	}
}

// A body that arrives slower than the minimum rate is cut off at the end of a window,
// holding nothing; one that keeps the rate is read whole.
func TestABodySlowerThanTheMinimumRateIsCutOff(t *testing.T) {
	b := newBodyBudget(1<<20, 1<<20, 1<<20, 1000)
	b.window = 200 * time.Millisecond // 200 bytes a window
	type result struct {
		ok, slow bool
		n        int
	}
	got := make(chan result, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, ok, slow := b.buffer(http.NewResponseController(w), r, "principal a")
		defer release()
		n := 0
		if ok {
			all, _ := io.ReadAll(r.Body)
			n = len(all)
		}
		got <- result{ok, slow, n}
	}))
	defer srv.Close()
	send := func(chunks int, pause time.Duration) result {
		pr, pw := io.Pipe()
		go func() {
			for range chunks {
				pw.Write(bytes.Repeat([]byte{'x'}, 100))
				time.Sleep(pause)
			}
			pw.Close()
		}()
		req, _ := http.NewRequest("POST", srv.URL, pr)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		pr.CloseWithError(io.ErrClosedPipe)
		return <-got
	}
	start := time.Now()
	if r := send(3, time.Second); !r.slow || r.ok {
		t.Fatalf("100 bytes a second against 1000 B/s: %+v, want it cut off", r)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cut off after %v, want within about a window (200 ms)", d)
	}
	if n := b.used.Load(); n != 0 {
		t.Fatalf("a cut-off body left %d bytes charged", n)
	}
	if r := send(10, 20*time.Millisecond); r.slow || !r.ok || r.n != 1000 {
		t.Fatalf("5000 B/s: %+v, want it read whole", r)
	}
}
