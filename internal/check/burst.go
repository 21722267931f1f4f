package check

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// burst sends rs at once, as closely together as a client can: it opens a connection
// for each request first (a TCP connection, and the TLS session of an https URL),
// writes all of each request but its last byte, and then releases the last bytes
// together, so that every request is complete at the server within microseconds of
// the others and none begins with a handshake. (Go's transport dials lazily: N
// requests started at once through one client arrive spread over their connects, and
// a check-then-insert race goes unseen most of the time.) A request that cannot be
// sent that way (its connection cannot be opened, or a proxy is configured) is sent
// through the configuration's client once the others are released. It returns the
// exchanges in the order of rs.
func (e *env) burst(ctx context.Context, rs []request) []*Exchange {
	xs := make([]*Exchange, len(rs))
	held := make([]*heldRequest, len(rs))
	reqs := make([]*http.Request, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			x, req := e.newRequest(ctx, r)
			xs[i], reqs[i] = x, req
			if req != nil {
				held[i], _ = e.hold(ctx, req)
			}
		})
	}
	wg.Wait()
	// One goroutine writes every last byte, in a loop of one write per connection:
	// goroutines of their own would be scheduled over the machine's cores one after
	// another, and the server would see the first request alone.
	start := time.Now()
	written := make([]error, len(rs))
	for i, h := range held {
		if h != nil {
			e.requests.Add(1)
			_, written[i] = h.conn.Write(h.last)
		}
	}
	for i := range rs {
		if reqs[i] == nil {
			continue
		}
		wg.Go(func() {
			h := held[i]
			if h == nil {
				e.do(xs[i], reqs[i], nil)
				return
			}
			defer h.conn.Close()
			if written[i] != nil {
				e.answer(xs[i], start, nil, written[i])
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(h.conn), h.req)
			e.answer(xs[i], start, resp, err)
		})
	}
	wg.Wait()
	return xs
}

// heldRequest is a request written to its own connection but for its last byte.
type heldRequest struct {
	req  *http.Request
	conn net.Conn
	last []byte
}

// errProxy says that the burst's requests go through a proxy, which they cannot hold.
var errProxy = errors.New("through a proxy")

// hold opens a connection to req's server and writes all of req but its last byte.
func (e *env) hold(ctx context.Context, req *http.Request) (*heldRequest, error) {
	u := req.URL
	t, _ := e.cfg.Client.Transport.(*http.Transport)
	if t == nil {
		return nil, errProxy // a client of the caller's: send through it
	}
	if t.Proxy != nil {
		if p, err := t.Proxy(req); err != nil || p != nil {
			return nil, errProxy
		}
	}
	conn, err := dial(ctx, t, u, e.cfg.Timeout)
	if err != nil {
		return nil, err
	}
	// The answer is read until the connection closes, within the timeout.
	_ = conn.SetDeadline(time.Now().Add(e.cfg.Timeout))
	req.Close = true
	var b bytes.Buffer
	if err := req.Write(&b); err != nil {
		conn.Close()
		return nil, err
	}
	wire := b.Bytes()
	if _, err := conn.Write(wire[:len(wire)-1]); err != nil {
		conn.Close()
		return nil, err
	}
	return &heldRequest{req: req, conn: conn, last: wire[len(wire)-1:]}, nil
}

// dial opens a connection to u's host, with its TLS session for https (HTTP/1.1,
// the transport's TLS configuration).
func dial(ctx context.Context, t *http.Transport, u *url.URL, timeout time.Duration) (net.Conn, error) {
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil || u.Scheme != "https" {
		return conn, err
	}
	cfg := &tls.Config{}
	if t.TLSClientConfig != nil {
		cfg = t.TLSClientConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = u.Hostname()
	}
	cfg.NextProtos = []string{"http/1.1"}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return tc, nil
}
