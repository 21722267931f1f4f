package proxy

import (
	"io"
	"net/http"
	"sync/atomic"
)

// bodyBudget bounds the bytes of request bodies that protected requests hold at once,
// all connections together (Config.MaxBufferedBodies): each body is bounded by the
// middleware's MaxBodyBytes and grows with the bytes received, but without a bound in
// total a thousand connections each holding a body just under the limit would pin a
// gigabyte. A request reads its body through the budget before the middleware sees
// it; the bytes stay charged until the request ends.
type bodyBudget struct {
	limit   int64 // bytes, all requests together
	maxBody int64 // the middleware's MaxBodyBytes: what one body may reach
	used    atomic.Int64
}

// firstRead is the buffer a body starts with: a client that announces a large body
// and sends nothing holds no more than this.
const firstRead = 4 << 10

// charge takes n bytes of the budget, or reports that they are not there.
func (b *bodyBudget) charge(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

// buffer reads r's body into memory charged to the budget, and gives r a body that
// reads it again, for the middleware (which copies it into its own buffer: that copy
// is charged too). A body declared over MaxBodyBytes is left unread, for the
// middleware to refuse with 413 before reading it; one that grows over it is read to
// one byte past it, which the middleware refuses in the same way; a read error is
// passed on to the middleware after the bytes read. It returns the release of what it
// charged, and false when the budget is spent (nothing is held then).
func (b *bodyBudget) buffer(r *http.Request) (release func(), ok bool) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength > b.maxBody {
		return func() {}, true
	}
	var charged int64
	release = func() { b.used.Add(-charged) }
	take := func(n int64) bool {
		if !b.charge(n) {
			return false
		}
		charged += n
		return true
	}
	size := int64(firstRead)
	if r.ContentLength >= 0 && r.ContentLength+1 < size {
		size = r.ContentLength + 1 // +1: reading EOF needs no growth
	}
	if !take(size) {
		return release, false
	}
	buf := make([]byte, 0, size)
	var readErr error
	for int64(len(buf)) <= b.maxBody {
		if len(buf) == cap(buf) {
			grow := min(int64(cap(buf)), b.maxBody+1-int64(cap(buf)))
			if r.ContentLength >= 0 && int64(cap(buf)) < r.ContentLength+1 {
				grow = min(grow, r.ContentLength+1-int64(cap(buf)))
			}
			if !take(grow) {
				release()
				return func() {}, false
			}
			buf = append(make([]byte, 0, int64(cap(buf))+grow), buf...)
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = err
			break
		}
	}
	// The middleware's copy of the body, as large as what was read.
	if !take(int64(len(buf))) {
		release()
		return func() {}, false
	}
	r.Body = &heldBody{all: buf, b: buf, err: readErr, rest: r.Body}
	return release, true
}

// heldBody reads a body that the budget read, then its read error (or, past
// MaxBodyBytes, the rest of the body, which the middleware never reads). all stays
// the body's bytes for the request's whole life: the upstream is sent them (rewrite),
// never the middleware's pooled copy, which the transport's writing goroutine could
// still be reading after the handler returned and the copy went back to the pool.
type heldBody struct {
	all  []byte
	b    []byte
	err  error
	rest io.ReadCloser
}

// forwardable returns the body to send the upstream: all of it, read whole within
// MaxBodyBytes, or false.
func (h *heldBody) forwardable(maxBody int64) ([]byte, bool) {
	return h.all, h.err == nil && int64(len(h.all)) <= maxBody
}

func (h *heldBody) Read(p []byte) (int, error) {
	if len(h.b) == 0 {
		if h.err != nil {
			return 0, h.err
		}
		return h.rest.Read(p)
	}
	n := copy(p, h.b)
	h.b = h.b[n:]
	return n, nil
}

func (h *heldBody) Close() error { return h.rest.Close() }
