package client

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultproxy"
)

// fault is what the proxy does to one request.
type fault int

const (
	faultNone fault = iota
	// faultReset resets the client's connection (RST) before the request is forwarded:
	// the server never sees it.
	faultReset
	// faultDropReply forwards the request, reads the server's whole response (so the
	// server has committed) and then drops the client's connection without it.
	faultDropReply
	// faultDelay waits a few milliseconds and then forwards normally.
	faultDelay
	numFaults
)

func (f fault) String() string {
	return [...]string{"none", "reset", "drop-reply", "delay"}[f]
}

// faultRates are the probabilities of the faults; the rest is faultNone.
type faultRates struct {
	reset, dropReply, delay float64
}

// faultProxy is an HTTP/1.1-aware proxy that injects faults per request, on the TCP
// plumbing of internal/faultproxy. The fault of a request is drawn from an RNG seeded
// with the proxy's seed and a hash of the request (method, path, body) and of how many
// times the proxy has seen that same request, so the faults of a run reproduce for its
// seed whatever the goroutines' interleaving.
type faultProxy struct {
	t     *testing.T
	seed  uint64
	rates faultRates
	proxy *faultproxy.Proxy

	mu   sync.Mutex
	seen map[uint64]int

	counts [numFaults]atomic.Int64
}

// newFaultProxy listens on a free port and forwards to upstream (host:port). It is
// closed when the test ends.
func newFaultProxy(t *testing.T, upstream string, seed uint64, rates faultRates) *faultProxy {
	t.Helper()
	p := &faultProxy{t: t, seed: seed, rates: rates, seen: map[uint64]int{}}
	p.proxy = faultproxy.NewWithHandler(t, upstream, p.serve)
	return p
}

// URL is the proxy's base URL.
func (p *faultProxy) URL() string { return "http://" + p.proxy.Addr() }

// count returns how many requests got fault f.
func (p *faultProxy) count(f fault) int64 { return p.counts[f].Load() }

// decide draws the fault of the n-th sighting of a request, and for a dropped reply
// whether the connection is reset (or closed cleanly).
func (p *faultProxy) decide(req *http.Request, body []byte) (f fault, hard bool) {
	h := fnv.New64a()
	_, _ = io.WriteString(h, req.Method+" "+req.URL.RequestURI()+"\n")
	_, _ = h.Write(body)
	id := h.Sum64()
	p.mu.Lock()
	n := p.seen[id]
	p.seen[id]++
	p.mu.Unlock()
	var nb [8]byte
	binary.LittleEndian.PutUint64(nb[:], uint64(n))
	_, _ = h.Write(nb[:])
	rng := rand.New(rand.NewPCG(p.seed, h.Sum64()))
	x, hard := rng.Float64(), rng.IntN(2) == 0
	r := p.rates
	switch {
	case x < r.reset:
		return faultReset, hard
	case x < r.reset+r.dropReply:
		return faultDropReply, hard
	case x < r.reset+r.dropReply+r.delay:
		return faultDelay, hard
	}
	return faultNone, hard
}

// serve relays the requests of one client connection over one upstream connection,
// applying a fault to each.
func (p *faultProxy) serve(c net.Conn, dial func() (net.Conn, error)) {
	br := bufio.NewReader(c)
	var up net.Conn
	var ubr *bufio.Reader
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		f, hard := p.decide(req, body)
		p.counts[f].Add(1)
		switch f {
		case faultReset:
			faultproxy.ResetConn(c)
			return
		case faultDelay:
			time.Sleep(5 * time.Millisecond) // the fault itself: latency, not synchronisation
		}
		if up == nil {
			if up, err = dial(); err != nil {
				if !errors.Is(err, faultproxy.ErrClosed) {
					p.t.Errorf("faultProxy: dialing upstream: %v", err)
				}
				return
			}
			ubr = bufio.NewReader(up)
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
		if err := req.Write(up); err != nil {
			return
		}
		resp, err := http.ReadResponse(ubr, req)
		if err != nil {
			return
		}
		rbody, err := io.ReadAll(resp.Body)
		if err != nil {
			return
		}
		if f == faultDropReply {
			// The server has committed and answered; the client never hears of it.
			// Half the drops close cleanly (EOF), half reset.
			if hard {
				faultproxy.ResetConn(c)
			}
			return
		}
		resp.Body = io.NopCloser(bytes.NewReader(rbody))
		resp.ContentLength = int64(len(rbody))
		resp.TransferEncoding = nil
		if err := resp.Write(c); err != nil || resp.Close || req.Close {
			return
		}
	}
}
