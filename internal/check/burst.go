package check

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/url"
	"sync"
)

// burst sends rs at once: it opens a connection for each request first (a TCP
// connection, and the TLS session of an https URL), then releases them together, so
// that the requests reach the server within a few microseconds of each other and
// none begins with a handshake. Go's transport dials lazily, so N requests started at
// once through one client arrive spread over their connects; a check-then-insert race
// then goes unseen most of the time. A request whose connection cannot be opened is
// sent through the configuration's client instead (a proxy, say). It returns the
// exchanges in the order of rs.
func (e *env) burst(ctx context.Context, rs []request) []*Exchange {
	xs := make([]*Exchange, len(rs))
	reqs := make([]*http.Request, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Go(func() {
			x, req := e.newRequest(ctx, r)
			xs[i], reqs[i] = x, req
			if req == nil {
				return
			}
			if c, err := e.preopened(ctx, req.URL); err == nil {
				rs[i].client = c
			}
		})
	}
	wg.Wait()
	start := make(chan struct{})
	for i := range rs {
		if reqs[i] == nil {
			continue
		}
		wg.Go(func() {
			<-start
			e.do(xs[i], reqs[i], rs[i].client)
		})
	}
	close(start)
	wg.Wait()
	for _, r := range rs {
		if r.client != nil {
			r.client.CloseIdleConnections()
		}
	}
	return xs
}

// errUsed is the dial error of a pre-opened connection asked for a second time.
var errUsed = errors.New("idem check: the pre-opened connection was used already")

// preopened returns a client of one request over a connection to u opened now.
func (e *env) preopened(ctx context.Context, u *url.URL) (*http.Client, error) {
	if t, ok := e.cfg.Client.Transport.(*http.Transport); ok && t.Proxy != nil {
		if p, err := t.Proxy(&http.Request{URL: u}); err != nil || p != nil {
			return nil, errors.New("through a proxy")
		}
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	d := net.Dialer{Timeout: e.cfg.Timeout}
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "https" {
		cfg := &tls.Config{}
		if t, ok := e.cfg.Client.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
			cfg = t.TLSClientConfig.Clone()
		}
		cfg.ServerName = u.Hostname()
		cfg.NextProtos = []string{"http/1.1"}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, err
		}
		conn = tc
	}
	var mu sync.Mutex
	take := func(context.Context, string, string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if conn == nil {
			return nil, errUsed
		}
		c := conn
		conn = nil
		return c, nil
	}
	return &http.Client{
		Transport: &http.Transport{
			DialContext: take, DialTLSContext: take,
			DisableCompression: true, MaxIdleConnsPerHost: 1,
		},
		Timeout:       e.cfg.Timeout,
		CheckRedirect: e.cfg.Client.CheckRedirect,
	}, nil
}
