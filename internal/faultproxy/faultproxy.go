// Package faultproxy is a TCP proxy for tests, placed between a client (an idem
// payments process, a store's client) and a server (PostgreSQL, Redis, an HTTP API), that
// injects the faults of a network or a server that misbehaves, switched at the moments a
// test chooses:
//
//   - [Proxy.Stall] holds every byte and keeps every connection open, as a partition or
//     a frozen server does; [Proxy.Resume] delivers what was held and forwards again;
//   - [Proxy.SetDelay] adds latency to every chunk of bytes, in both directions;
//   - [Proxy.Reset] resets every open connection (RST) on both sides;
//   - [Proxy.CutAfter] cuts the server's replies midway: each connection is reset after
//     it has forwarded a given number of bytes more;
//   - [Proxy.SetUpstream] relays the connections opened from then on to another server
//     (a pooler put in between).
//
// New connections are accepted in every state. A test that needs to decide per message
// (per HTTP request, say) supplies its own [Handler] and keeps the listener, the tracking
// of connections and the clean-up.
package faultproxy

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

// ErrClosed is what a [Handler]'s dial returns once its connection was reset or the
// proxy closed.
var ErrClosed = errors.New("faultproxy: connection ended")

// Handler serves one client connection in place of the byte relay. dial opens a
// connection to the upstream server that the proxy tracks (reset by [Proxy.Reset],
// closed by [Proxy.Close]); client is closed when Handler returns.
type Handler func(client net.Conn, dial func() (net.Conn, error))

// Proxy is a fault-injecting TCP proxy. Its methods are safe for concurrent use.
type Proxy struct {
	t        testing.TB
	upstream string // host:port of the server that new connections relay to (mu)
	ln       net.Listener
	handler  Handler

	mu      sync.Mutex
	links   map[*link]struct{} // every open connection
	gate    chan struct{}      // closed while forwarding; open (blocking) while stalled
	delay   time.Duration
	cut     int64 // bytes each new link may forward from upstream before it is reset; < 0: never
	closed  bool
	stopped chan struct{} // closed by Close
	wg      sync.WaitGroup
}

// link is one proxied connection: the client's side and the upstream side(s).
type link struct {
	client net.Conn
	done   chan struct{} // closed when the link ends
	budget int64         // bytes from upstream left before the cut; < 0: no cut (Proxy.mu)

	mu    sync.Mutex
	ups   []net.Conn
	ended bool
}

// New starts a proxy on a free loopback port that relays to upstream (host:port). It
// is closed when the test ends.
func New(t testing.TB, upstream string) *Proxy {
	return start(t, upstream, nil)
}

// NewWithHandler starts a proxy whose client connections are served by h instead of the
// byte relay; Stall, SetDelay and CutAfter do not apply to them, Reset and Close do.
func NewWithHandler(t testing.TB, upstream string, h Handler) *Proxy {
	return start(t, upstream, h)
}

func start(t testing.TB, upstream string, h Handler) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	forwarding := make(chan struct{})
	close(forwarding)
	p := &Proxy{t: t, upstream: upstream, ln: ln, handler: h, links: map[*link]struct{}{},
		gate: forwarding, cut: -1, stopped: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port, to put in the client's URL in place of the server's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Stall stops forwarding: bytes that arrive are held, connections stay open, and new
// connections are accepted but not forwarded (not even dialled upstream) until Resume.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already stalled
	}
}

// Resume forwards again, the held bytes first.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// SetDelay makes every chunk of bytes read from now on wait d before it is forwarded, in
// both directions (a round trip gains 2d); 0 removes the latency. Chunks keep their
// order.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Reset resets (RST) both sides of every open connection and returns how many
// connections it reset. New connections are proxied as before.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.end(true)
	}
	return len(links)
}

// CutAfter resets every connection, open now or opened later, once it has forwarded n
// more bytes from the server to the client: a reply is cut midway. A negative n
// disarms the cut.
func (p *Proxy) CutAfter(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = n
	for l := range p.links {
		l.budget = n
	}
}

// SetUpstream makes the connections opened from now on relay to upstream (host:port)
// instead: a server moved behind another address, or something put in between (a
// connection pooler). Open connections keep their server; [Proxy.Reset] ends them, as
// a restart of the network path does.
func (p *Proxy) SetUpstream(upstream string) {
	p.mu.Lock()
	p.upstream = upstream
	p.mu.Unlock()
}

// Conns returns how many client connections are open through the proxy.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops the proxy: it stops accepting, resets every connection and waits for its
// goroutines. The test's clean-up calls it; calling it again does nothing.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.stopped)
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Reset()
	p.wg.Wait()
}

// ResetConn closes c with an RST instead of a FIN.
func ResetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		l := &link{client: c, done: make(chan struct{})}
		p.mu.Lock()
		closed := p.closed
		if !closed {
			l.budget = p.cut
			p.links[l] = struct{}{}
			p.wg.Add(1)
		}
		p.mu.Unlock()
		if closed {
			_ = c.Close()
			return
		}
		go func() {
			defer p.wg.Done()
			defer p.untrack(l)
			if p.handler != nil {
				p.handler(c, func() (net.Conn, error) { return p.dial(l) })
				return
			}
			p.relay(l)
		}()
	}
}

func (p *Proxy) untrack(l *link) {
	l.end(false)
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// dial connects l to the upstream server.
func (p *Proxy) dial(l *link) (net.Conn, error) {
	p.mu.Lock()
	upstream := p.upstream
	p.mu.Unlock()
	up, err := net.Dial("tcp", upstream)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		_ = up.Close()
		return nil, ErrClosed
	}
	l.ups = append(l.ups, up)
	return up, nil
}

// relay forwards l's bytes both ways until either side ends or the link is ended.
func (p *Proxy) relay(l *link) {
	if !p.wait(l) {
		return
	}
	up, err := p.dial(l)
	if err != nil {
		return // the client sees its connection closed, as with a server that is down
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(l, l.client, up, false) }()
	go func() { defer wg.Done(); p.pump(l, up, l.client, true) }()
	wg.Wait()
}

// chunk is bytes read from one side, due to be written to the other.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst through a queue, so that latency delays each chunk without
// slowing the reading of the next. fromServer marks the direction that CutAfter cuts.
func (p *Proxy) pump(l *link, src, dst net.Conn, fromServer bool) {
	queue := make(chan chunk, 64)
	go func() {
		defer close(queue)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				d := p.delay
				p.mu.Unlock()
				select {
				case queue <- chunk{buf[:n], time.Now().Add(d)}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer l.end(false) // one side ended: end the other (cleanly, as a relay does)
	for c := range queue {
		if wait := time.Until(c.due); wait > 0 {
			// The fault itself: latency, not synchronisation.
			select {
			case <-time.After(wait):
			case <-l.done:
				return
			}
		}
		if !p.wait(l) {
			return
		}
		b, cut := c.b, false
		if fromServer {
			b, cut = p.spend(l, b)
		}
		if _, err := dst.Write(b); err != nil {
			return
		}
		if cut {
			l.end(true)
			return
		}
	}
}

// wait blocks while the proxy is stalled; it reports false when the link or the proxy
// ended meanwhile.
func (p *Proxy) wait(l *link) bool {
	p.mu.Lock()
	gate := p.gate
	p.mu.Unlock()
	select {
	case <-gate:
		return true
	case <-l.done:
		return false
	case <-p.stopped:
		return false
	}
}

// spend takes b from l's budget before the cut and returns what may be written, and
// whether the link must be cut after it.
func (p *Proxy) spend(l *link, b []byte) ([]byte, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l.budget < 0 {
		return b, false
	}
	if int64(len(b)) < l.budget {
		l.budget -= int64(len(b))
		return b, false
	}
	b = b[:l.budget]
	l.budget = 0
	return b, true
}

// end ends l on both sides, with an RST when reset, else cleanly (FIN). Only the
// first call acts.
func (l *link) end(reset bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.ended = true
	close(l.done)
	for _, c := range append([]net.Conn{l.client}, l.ups...) {
		if reset {
			ResetConn(c)
		} else {
			_ = c.Close()
		}
	}
}
