package proxy

import (
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// bodyBudget bounds the bytes of request bodies that protected requests hold at once,
// all connections together (Config.MaxBufferedBodies): each body is bounded by the
// middleware's MaxBodyBytes and grows with the bytes received, but without a bound in
// total a thousand connections each holding a body just under the limit would pin a
// gigabyte. A request reads its body through the budget before the middleware sees
// it; the bytes stay charged until the request ends.
//
// Within it, each client holds at most its share (Config.MaxBufferedBodiesPerClient):
// a request is charged to its owners, its principal and its address, and refused when
// any of them would pass its share, so that one principal, or one source sending under
// many made-up credentials, cannot take the budget from the others. And a body must
// keep arriving (Config.MinUploadRate): one that stalls is cut off, so that a
// slow-upload flood holds its bytes for one window at most.
type bodyBudget struct {
	limit     int64 // bytes, all requests together
	perClient int64 // bytes, one owner's requests together
	maxBody   int64 // the middleware's MaxBodyBytes: what one body may reach
	minRate   int64 // bytes per second over uploadWindow; <= 0: none
	window    time.Duration
	used      atomic.Int64

	mu     sync.Mutex
	shares map[string]int64 // by owner, while it holds bytes
}

func newBodyBudget(limit, perClient, maxBody, minRate int64) *bodyBudget {
	return &bodyBudget{limit: limit, perClient: perClient, maxBody: maxBody, minRate: minRate, window: UploadRateWindow,
		shares: map[string]int64{}}
}

// firstRead is the buffer a body starts with: a client that announces a large body
// and sends nothing holds no more than this.
const firstRead = 4 << 10

// errTooSlow is a body read cut off for arriving slower than the minimum rate.
var errTooSlow = errors.New("proxy: the request body arrived slower than the minimum upload rate")

// charge takes n bytes of the budget and of each owner's share, or reports that they
// are not there (and takes nothing).
func (b *bodyBudget) charge(n int64, owners []string) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	if len(owners) == 0 {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range owners {
		if b.shares[o]+n > b.perClient {
			b.used.Add(-n)
			return false
		}
	}
	for _, o := range owners {
		b.shares[o] += n
	}
	return true
}

// uncharge gives back n bytes of the budget and of each owner's share.
func (b *bodyBudget) uncharge(n int64, owners []string) {
	if n == 0 {
		return
	}
	b.used.Add(-n)
	if len(owners) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range owners {
		if left := b.shares[o] - n; left > 0 {
			b.shares[o] = left
		} else {
			delete(b.shares, o)
		}
	}
}

// buffer reads r's body into memory charged to the budget and to owners' shares, and
// gives r a body that reads it again, for the middleware (which copies it into its own
// buffer: that copy is charged too). A body declared over MaxBodyBytes is left unread,
// for the middleware to refuse with 413 before reading it; one that grows over it is
// read to one byte past it, which the middleware refuses in the same way; a read error
// is passed on to the middleware after the bytes read. A body that arrives slower than
// the minimum rate is cut off through rc (its read deadline): buffer reports it with
// slow, holding nothing. It returns the release of what it charged, and false when the
// budget, or an owner's share, is spent (nothing is held then).
func (b *bodyBudget) buffer(rc *http.ResponseController, r *http.Request, owners ...string) (release func(), ok, slow bool) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength > b.maxBody {
		return func() {}, true, false
	}
	var charged int64
	release = func() { b.uncharge(charged, owners) }
	take := func(n int64) bool {
		if !b.charge(n, owners) {
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
		return release, false, false
	}
	watch := b.watchRate(rc)
	defer watch.stop()
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
				return func() {}, false, false
			}
			buf = append(make([]byte, 0, int64(cap(buf))+grow), buf...)
		}
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		watch.got(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = err
			break
		}
	}
	if watch.cut() {
		release()
		return func() {}, false, true
	}
	// The middleware's copy of the body, as large as what was read.
	if !take(int64(len(buf))) {
		release()
		return func() {}, false, false
	}
	r.Body = &heldBody{all: buf, b: buf, err: readErr, rest: r.Body}
	return release, true, false
}

// rateWatch cuts off a body read that brings less than the minimum rate over a window:
// a timer checks the bytes of each window, and ends the read through the connection's
// read deadline when too few came.
type rateWatch struct {
	b      *bodyBudget
	rc     *http.ResponseController
	timer  *time.Timer
	bytes  atomic.Int64 // this window's
	slow   atomic.Bool
	stopMu sync.Mutex
	done   bool
}

func (b *bodyBudget) watchRate(rc *http.ResponseController) *rateWatch {
	w := &rateWatch{b: b, rc: rc}
	if b.minRate > 0 && rc != nil {
		w.timer = time.AfterFunc(b.window, w.check)
	}
	return w
}

func (w *rateWatch) got(n int) { w.bytes.Add(int64(n)) }

// check ends a window: enough bytes came, and another window begins; or too few, and
// the read is cut off.
func (w *rateWatch) check() {
	w.stopMu.Lock()
	defer w.stopMu.Unlock()
	if w.done {
		return
	}
	if w.bytes.Swap(0) >= w.b.minRate*int64(w.b.window)/int64(time.Second) {
		w.timer.Reset(w.b.window)
		return
	}
	w.slow.Store(true)
	_ = w.rc.SetReadDeadline(time.Now())
}

func (w *rateWatch) stop() {
	w.stopMu.Lock()
	defer w.stopMu.Unlock()
	w.done = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// cut reports whether the read was cut off for being too slow.
func (w *rateWatch) cut() bool { return w.slow.Load() }

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
