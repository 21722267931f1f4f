package proxy

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"strings"
	"time"
)

// A protected request reaches the upstream at most once per forwarding decision of the
// proxy's own (SPEC §17, "nothing below the proxy re-sends"). Go's HTTP clients re-send
// a request by themselves in three ways, each closed here for a protected request:
//
//   - http.Transport re-sends a request it takes for replayable (Request.isReplayable:
//     no body, or a body with GetBody, and a GET, HEAD, OPTIONS or TRACE, or an
//     Idempotency-Key or X-Idempotency-Key header) when a kept-alive connection breaks
//     after the request was written (shouldRetryRequest), rewinding its body with
//     GetBody (rewindBody). A protected request therefore never has GetBody; a GET,
//     HEAD or OPTIONS without a body gets an empty body object, which the transport
//     drops before writing (it probes a body-less method's body) but which makes it
//     not replayable; the derived key goes under its header name in lower case
//     (rewrite), which the transport does not see as that header.
//   - the HTTP/2 client retries a stream that the peer reset with REFUSED_STREAM or
//     PROTOCOL_ERROR, or that a GOAWAY cut (http2canRetryError), when the request has
//     no body or GetBody rewinds it (http2shouldRetryRequest). A protected request to
//     an https upstream (which may speak HTTP/2) therefore always has a body object
//     and never GetBody: the retry fails instead of writing.
//   - what is left, and what a custom Transport or a future Go might do: every attempt
//     the transport makes is seen (httptrace's GotConn, once per attempt on both
//     protocols), and an attempt after a write of the request is stopped before it
//     writes (its context is cancelled: the HTTP/2 client checks it under the write
//     lock before it writes the headers) and settles the exchange as unknown; a second
//     write that happens anyway (WroteHeaders twice) is reported as an error and
//     settles it as unknown too. Both are logged at error level: they are defects.
//
// The re-sends the proxy makes are its own decisions, each logged (debug) and counted
// (Hooks.Resent):
//
//   - a request nothing of which was written (its headers never reached the
//     connection) on a kept-alive connection that turned out to be closed is sent once
//     more, on another connection, as Go would do with GetBody ("not_written");
//   - a request the upstream provably did not process is sent again, up to
//     Config.UpstreamResends times ("not_processed"): an HTTP/2 stream refused with
//     REFUSED_STREAM (RFC 9113 §8.7) or above a GOAWAY's last stream id (§6.8). Go's
//     errors for these are not exported, and the request's GetBody is what tells them
//     apart without reading an error's text: with the default Transport, a protected
//     request of a method Go never takes for replayable (not GET, HEAD, OPTIONS or
//     TRACE; its key field is in lower case) gets a GetBody that rewinds nothing and
//     returns errNotProcessed, and the transports call it only to re-send a request
//     that was not processed: golang.org/x/net/http2's client for exactly those two
//     cases and a connection it could not use (canRetryError: not PROTOCOL_ERROR,
//     which the upstream may send after acting, and which net/http's own HTTP/2
//     client would re-send), net/http's HTTP/1.1 client for a request nothing of
//     which was written or that found no connection (shouldRetryRequest, which
//     re-sends a request Go does not take for replayable for nothing else). The
//     transport then returns errNotProcessed instead of re-sending it itself, and
//     send sends it again, on the connection the transport picks (a GOAWAY closed
//     the old one), under the same derived key. Past the bound, the request is
//     settled as never sent: the key is released (502 upstream_unavailable).
//     TestProxyNeverResendsAStreamResetAfterActing pins that a stream reset with
//     PROTOCOL_ERROR is not among them (Go 1.27's x/net wraps net/http's client,
//     whose set includes it: that test fails first).

// errResent ends an exchange whose request the transport tried to send a second time
// after it was written.
var errResent = errors.New("proxy: the HTTP transport tried to send the request a second time after it was written")

// errNotProcessed is what a protected request's GetBody returns (notProcessed): the
// transport found that the upstream did not process the request and would re-send it;
// send re-sends it itself, bounded.
var errNotProcessed = errors.New("proxy: the upstream did not process the request (an HTTP/2 stream refused or left out by a GOAWAY, or nothing written)")

// notProcessed is a protected request's GetBody (send.go's comment above): called
// only by a transport that found the request not processed, it rewinds nothing.
func notProcessed() (io.ReadCloser, error) { return nil, errNotProcessed }

// replayableMethod reports whether Go's transports take a request of method for
// replayable whatever its header fields (Request.isReplayable): such a request gets
// no GetBody.
func replayableMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// onceTransport is the ReverseProxy's Transport: unprotected requests go to the
// transport as they are; protected ones through their exchange's send.
type onceTransport struct{ p *Proxy }

func (t onceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	x := exchangeOf(req.Context())
	if x == nil || x.h == nil {
		return t.p.transport.RoundTrip(req)
	}
	return x.send(req)
}

// trace is the exchange's httptrace: it records the writes of the request and, for a
// protected request, watches every attempt the transport makes.
func (x *exchange) trace() *httptrace.ClientTrace {
	t := &httptrace.ClientTrace{WroteHeaders: func() {
		x.writes.Add(1)
		x.wrote.Store(true)
	}}
	if x.h != nil {
		t.GotConn = x.gotConn
	}
	return t
}

// gotConn runs as each attempt of the transport got its connection, before it writes:
// a second attempt after a write is stopped; one after no write is allowed, and said.
func (x *exchange) gotConn(info httptrace.GotConnInfo) {
	x.reused.Store(info.Reused)
	if x.attempts.Add(1) == 1 {
		return
	}
	if x.writes.Load() > 0 {
		x.refused.Store(true)
		x.cancel(errResent)
		x.p.logger.ErrorContext(x.r.Context(), "idem proxy: the HTTP transport tried to send a protected request again after it was written; stopped before it wrote, and the outcome is unknown (this is a defect: please report it)",
			x.attrs()...)
		x.p.upstreamFailedHook(x, "resend_refused")
		return
	}
	x.p.logger.DebugContext(x.r.Context(), "idem proxy: sending a protected request again on another connection: nothing of it was written on a kept-alive connection that was closed",
		x.attrs()...)
	if f := x.p.hooks.Resent; f != nil {
		f(x.p.Route(x.r), "not_written")
	}
}

// outBody returns a fresh body of the protected request for one attempt: its bytes, an
// empty body object for a body-less request the transport would otherwise take for
// replayable (a GET, HEAD or OPTIONS; any method to an https upstream, which may speak
// HTTP/2), or nil (a body-less POST, PATCH, PUT… over HTTP/1.1, which the transport
// never re-sends after a write and sends with Content-Length: 0).
func (x *exchange) outBody(method string) io.ReadCloser {
	switch {
	case len(x.body) > 0:
		return io.NopCloser(bytes.NewReader(x.body))
	case x.p.upstream.Scheme == "https", method == http.MethodGet, method == http.MethodHead, method == http.MethodOptions:
		return io.NopCloser(strings.NewReader(""))
	}
	return nil
}

// send sends a protected request for the ReverseProxy: one attempt, one more when
// nothing of the first was written on a kept-alive connection, and up to
// Config.UpstreamResends more while the upstream provably did not process it.
func (x *exchange) send(req *http.Request) (*http.Response, error) {
	for {
		out := *req
		out.Body, out.GetBody = x.outBody(req.Method), nil
		if x.p.ownTransport && !replayableMethod(req.Method) {
			out.GetBody = notProcessed
		}
		out.ContentLength = int64(len(x.body))
		resp, err := x.p.transport.RoundTrip(&out)
		if err != nil && errors.Is(err, errNotProcessed) {
			if !x.resendUnprocessed(req) {
				return nil, err
			}
			continue
		}
		if x.writes.Load() > 1 || x.refused.Load() {
			if resp != nil {
				_ = resp.Body.Close()
			}
			if !x.refused.Load() {
				x.p.logger.ErrorContext(x.r.Context(), "idem proxy: the HTTP transport sent a protected request twice; the outcome is unknown (this is a defect: please report it)",
					x.attrs()...)
				x.p.upstreamFailedHook(x, "resent")
			}
			return nil, errResent
		}
		if err == nil {
			return resp, nil
		}
		if x.writes.Load() == 0 && x.reused.Load() && !x.resentOnce && req.Context().Err() == nil {
			x.resentOnce = true
			continue
		}
		return nil, err
	}
}

// resendUnprocessed decides on a request the transport found not processed: it is
// sent again (true), after a pause that grows with each re-send (none before the first,
// 20 ms before the second, 40 ms…), while Config.UpstreamResends allows and the
// exchange goes on; otherwise it is settled as never sent (false: the key is released).
// Either way the attempt is forgotten, as it never reached the upstream.
func (x *exchange) resendUnprocessed(req *http.Request) bool {
	reason := "not_processed"
	if x.writes.Load() == 0 {
		reason = "not_written"
	}
	x.attempts.Store(0)
	x.writes.Store(0)
	x.wrote.Store(false)
	x.reused.Store(false)
	if x.unprocessed >= x.p.resends || req.Context().Err() != nil {
		x.p.logger.WarnContext(x.r.Context(), "idem proxy: the upstream did not process a protected request, as often as it may be sent again (--upstream-resends); the key is released",
			x.attrs(slog.Int("resends", x.unprocessed))...)
		return false
	}
	if x.unprocessed > 0 {
		t := time.NewTimer(time.Duration(x.unprocessed) * 20 * time.Millisecond)
		select {
		case <-t.C:
		case <-req.Context().Done():
			t.Stop()
			return false
		}
	}
	x.unprocessed++
	x.p.logger.DebugContext(x.r.Context(), "idem proxy: sending a protected request again: the upstream did not process it (an HTTP/2 stream refused or left out by a GOAWAY, or nothing written)",
		x.attrs(slog.String("reason", reason), slog.Int("resend", x.unprocessed))...)
	if f := x.p.hooks.Resent; f != nil {
		f(x.p.Route(x.r), reason)
	}
	noteResend(x.r.Context())
	return true
}
