package proxy

import (
	"mime"
	"net/http"

	"github.com/idem-go/idem"
)

// exchange is the ResponseWriter the ReverseProxy writes a protected request's
// response to; it wraps the middleware's capture, which buffers the response to store
// it (SPEC §6). It decides whether the response can be stored whole:
//
//   - one that can (most: a body within MaxStoredBody) is buffered whole. ReverseProxy
//     flushes after every write when the upstream's response has no Content-Length
//     (a chunked one, as Node.js and many Python servers send) and the capture would
//     take a Flush for a stream and not store the response: the exchange withholds
//     those flushes.
//   - one that cannot (an event stream, trailers, a Content-Length over MaxStoredBody,
//     or a body that grows over it) streams: the exchange tells the handle not to store
//     it (the key is released, [idem.Handle.SetStore]) and forwards the flushes, so
//     that the capture passes the response through as it comes. A warning says so.
//
// The ReverseProxy writes it from the handler's goroutine, and flushes it from a timer
// of its own under the same lock as the writes.
type exchange struct {
	p *Proxy
	h *idem.Handle
	w http.ResponseWriter // the middleware's capture
	r *http.Request

	status    int   // the upstream's status, once known
	written   int64 // body bytes written so far
	streaming bool  // the response passes through; the key is released
}

type exchangeKey struct{}

// modifyResponse is the ReverseProxy's ModifyResponse: it looks at the upstream's
// response headers before they are written, and makes the exchange of a response that
// cannot be stored whole stream.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	x, _ := resp.Request.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return nil
	}
	x.status = resp.StatusCode
	switch {
	case isEventStream(resp.Header.Get("Content-Type")):
		x.stream("event_stream")
	case len(resp.Trailer) > 0:
		x.stream("trailers")
	case resp.ContentLength > p.maxStored:
		x.stream("too_large")
	}
	return nil
}

func isEventStream(contentType string) bool {
	t, _, _ := mime.ParseMediaType(contentType)
	return t == "text/event-stream"
}

// stream makes the response pass through, and the key be released once it ends.
func (x *exchange) stream(reason string) {
	if x.streaming {
		return
	}
	x.streaming = true
	x.h.SetStore(false)
	x.p.logger.WarnContext(x.r.Context(), "idem proxy: the upstream's response "+unstorable[reason]+"; it is passed through and the key released, so a retry executes again",
		"reason", reason, "status", x.status, "key_hash", keyHash(x.h.Scope(), x.h.Key()),
		"method", x.r.Method, "path", x.r.URL.Path, "max_stored_body", x.p.maxStored)
}

// unstorable says, by reason, why a response cannot be stored whole; each reason has
// a message of its own, so that repeated warnings are summarised per reason.
var unstorable = map[string]string{
	"event_stream": "is an event stream, which cannot be stored",
	"trailers":     "has trailers, which cannot be stored",
	"too_large":    "is larger than the largest body stored (MaxStoredBody, --max-stored-body)",
}

// Header returns the capture's header.
func (x *exchange) Header() http.Header { return x.w.Header() }

// WriteHeader writes the status to the capture; a streaming response's headers go to
// the client at once (an event stream's client waits for them).
func (x *exchange) WriteHeader(code int) {
	x.w.WriteHeader(code)
	if x.streaming && code >= 200 {
		x.flush()
	}
}

// Write writes body bytes to the capture, streaming from the first byte over
// MaxStoredBody.
func (x *exchange) Write(b []byte) (int, error) {
	if !x.streaming && x.written+int64(len(b)) > x.p.maxStored {
		x.stream("too_large")
	}
	x.written += int64(len(b))
	return x.w.Write(b)
}

// Flush passes a streaming response's bytes on; for a response to store it does
// nothing.
func (x *exchange) Flush() {
	if x.streaming {
		x.flush()
	}
}

func (x *exchange) flush() { _ = http.NewResponseController(x.w).Flush() }

// Unwrap returns the capture, for http.NewResponseController's deadlines.
func (x *exchange) Unwrap() http.ResponseWriter { return x.w }
