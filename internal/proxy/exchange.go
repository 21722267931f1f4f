package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// exchange is one forwarded request and its response: the ResponseWriter the
// ReverseProxy writes the response to, wrapping the middleware's capture (which
// buffers the response to store it, SPEC §6) for a protected request, or the client's
// writer for an unprotected one. It knows what crossed the network, which is what
// decides between releasing a key and keeping it (SPEC §17, "not knowing is not
// failure"):
//
//   - wrote: the request's headers were written to the upstream (httptrace's
//     WroteHeaders). Until then a failure proves that the upstream never saw the
//     request (a dial failure, a refused connection): the key is released (502). After
//     it, a failure is unknown: the record is kept (Handle.SetOutcomeUnknown).
//   - headers: the upstream's response headers came. When they have not come within
//     UpstreamTimeout, the client gets 504 at once (Middleware.AnswerNow), and the exchange
//     goes on, bounded by UpstreamWaitLimit, so that the upstream's answer is stored for
//     the client's retry.
//   - bodyErr: the upstream broke its body after the status: unknown too.
//
// It decides whether the response can be stored whole: most are buffered whole (the
// exchange withholds the flushes that ReverseProxy makes after every write of a
// response without a Content-Length, which would make the capture stream it); an
// event stream is teed (Middleware.TeeStream: passed through as it comes, stored when it
// ends within MaxStoredBody); one with trailers, or over MaxStoredBody, passes
// through and completes as response_not_stored: never run again, never half stored.
//
// The ReverseProxy writes it from the handler's goroutine (and flushes it from a timer
// of its own under the same lock as the writes); the UpstreamTimeout timer answers the
// client from another goroutine, under mu, before any response header came.
type exchange struct {
	p *Proxy
	h *idem.Handle // nil for an unprotected request
	w http.ResponseWriter
	r *http.Request

	cancel context.CancelCauseFunc // ends the exchange's context (shutdown, timeout)
	timer  *time.Timer             // UpstreamTimeout
	start  time.Time

	wrote atomic.Bool // the request's headers were written to the upstream

	// What send (send.go) watches of a protected request: its body, the transport's
	// attempts (GotConn) and writes (WroteHeaders), whether the last attempt's
	// connection was a kept-alive one, whether an attempt after a write was stopped,
	// and whether the proxy sent it once more itself (nothing was written).
	body             []byte
	attempts, writes atomic.Int32
	reused, refused  atomic.Bool
	resentOnce       bool
	unprocessed      int // re-sends of a request the upstream did not process

	mu        sync.Mutex
	headers   bool // the upstream's response headers came (ModifyResponse)
	early     bool // the client was answered 504 (protected) before they came
	done      bool // the ReverseProxy returned
	streaming bool // the response passes through as it comes

	status  int          // the upstream's status, once known
	written int64        // body bytes written so far
	held    bool         // the status is held with buf (not streaming)
	buf     bytes.Buffer // a buffered response's body, until it ended whole
	bodyErr error        // reading the upstream's body failed
}

type exchangeKey struct{}

// exchangeOf returns the exchange of a request the proxy forwards, or nil.
func exchangeOf(ctx context.Context) *exchange {
	x, _ := ctx.Value(exchangeKey{}).(*exchange)
	return x
}

// Errors that end an exchange's context, as its cause.
var (
	errHeaderTimeout = errors.New("proxy: the upstream's response headers did not come within UpstreamTimeout")
	errWaitLimit     = errors.New("proxy: the upstream did not finish within UpstreamWaitLimit")
	errShutdown      = errors.New("proxy: the proxy shut down while waiting for the upstream")
)

// forward forwards x.r through the ReverseProxy and watches the exchange.
func (x *exchange) forward() {
	p := x.p
	x.start = time.Now()
	ctx, cancel := context.WithCancelCause(x.r.Context())
	x.cancel = cancel
	defer cancel(nil)
	if x.h != nil {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeoutCause(ctx, p.waitLimit, errWaitLimit)
		defer stop()
		p.track(x)
		defer p.untrack(x)
	}
	ctx = httptrace.WithClientTrace(ctx, x.trace())
	ctx = context.WithValue(ctx, exchangeKey{}, x)
	x.timer = time.AfterFunc(p.upstreamTimeout, x.headerTimeout)
	defer func() {
		x.timer.Stop()
		x.mu.Lock()
		x.done = true
		x.mu.Unlock()
	}()
	if x.h == nil {
		p.rp.ServeHTTP(x, x.r.WithContext(ctx))
		return
	}
	defer x.recoverBrokenBody()
	p.rp.ServeHTTP(x, x.r.WithContext(ctx))
	x.checkTrailers()
	x.release()
}

// release writes a buffered response to the capture once it ended whole: until then
// the exchange holds it, so that a body that breaks half way leaves the capture empty
// for the answer that the outcome is unknown.
func (x *exchange) release() {
	if !x.held {
		return
	}
	x.held = false
	x.w.WriteHeader(x.status)
	if x.buf.Len() > 0 {
		_, _ = x.w.Write(x.buf.Bytes())
	}
	x.buf = bytes.Buffer{}
}

// headerTimeout runs when UpstreamTimeout passed: unless the response headers came,
// an unprotected request is cancelled (504), and a protected one's client gets 504
// now while the exchange goes on (the retry gets 409 in flight, then the stored
// answer).
func (x *exchange) headerTimeout() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.headers || x.done {
		return
	}
	if x.h == nil {
		x.cancel(errHeaderTimeout)
		return
	}
	err := x.p.mw.AnswerNow(x.w, func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", "1")
		idem.WriteProblem(w, x.r, x.p.profile, &idem.Problem{Status: http.StatusGatewayTimeout, Code: CodeUpstreamTimeout, Type: "api_error",
			Detail: "The upstream service did not answer in time; it may have acted. The proxy waits on for its answer and stores it: retry with the same key to get it."})
	})
	if err != nil {
		return
	}
	x.early = true
	x.p.upstreamFailedHook(x, "timeout")
	note(x.r.Context(), x, "upstream_timeout")
	x.p.logger.WarnContext(x.r.Context(), "idem proxy: the upstream did not answer within the upstream timeout; the client got 504, and the proxy waits on for the answer to store it",
		x.attrs(slog.Duration("upstream_timeout", x.p.upstreamTimeout), slog.Duration("wait_limit", x.p.waitLimit))...)
	if x.p.closing.Load() {
		x.cancel(errShutdown)
	}
}

// waitingInBackground reports whether the client was answered and the exchange waits
// on for the upstream.
func (x *exchange) waitingInBackground() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.early && !x.done
}

// modifyResponse is the ReverseProxy's ModifyResponse: it looks at the upstream's
// response headers before they are written, watches the body, and chooses how a
// protected response is stored.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	x := exchangeOf(resp.Request.Context())
	if x == nil {
		return nil
	}
	x.mu.Lock()
	x.headers = true
	x.mu.Unlock()
	x.timer.Stop()
	p.observeUpstream(x, resp.StatusCode)
	note(x.r.Context(), x, "forwarded")
	if x.h == nil {
		return nil
	}
	x.status = resp.StatusCode
	if p.notForwarded != "" && resp.Header.Get(p.notForwarded) != "" {
		// Only the gateway that is told to set it sets it; the client never sees it.
		resp.Header.Del(p.notForwarded)
		if resp.StatusCode >= 500 {
			// A trusted gateway says its answer never reached the application: the
			// key is released, as a failure to connect releases it (§6 releases every
			// 5xx the proxy does not keep as unknown).
			p.upstreamFailedHook(x, "not_forwarded")
			note(x.r.Context(), x, "not_forwarded")
			p.logger.WarnContext(x.r.Context(), "idem proxy: a gateway answered "+strconv.Itoa(resp.StatusCode)+" and said it did not forward the request ("+p.notForwarded+"); the key is released",
				x.attrs(slog.Int("status", resp.StatusCode))...)
			resp.Body = &watchedBody{ReadCloser: resp.Body, x: x}
			return nil
		}
	}
	if resp.StatusCode == http.StatusGatewayTimeout {
		if took := time.Since(x.start); took < p.waitLimit {
			// A gateway gave up before the proxy would have: its read timeout is
			// shorter than --upstream-wait-limit, and cuts the wait that stores a slow
			// answer (an answer the application makes after it is unknown).
			p.logger.WarnContext(x.r.Context(), "idem proxy: the upstream answered 504 before --upstream-wait-limit: a gateway in front of the application timed out first; set its read timeout above the wait limit (nginx proxy_read_timeout, HAProxy timeout server), or the wait limit below it",
				slog.Duration("after", took.Round(time.Millisecond)), slog.Duration("upstream_wait_limit", p.waitLimit))
		}
	}
	if resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusGatewayTimeout {
		// A gateway in front of the application lost or timed out its reply: the
		// application may have acted. Not failure but unknown, as the proxy's own
		// timeout: the client gets the answer, the record is kept (SPEC §17).
		x.h.SetOutcomeUnknown()
		p.upstreamFailedHook(x, "gateway")
		note(x.r.Context(), x, "outcome_unknown")
		p.logger.WarnContext(x.r.Context(), "idem proxy: the upstream answered "+strconv.Itoa(resp.StatusCode)+": a gateway in front of it lost or timed out the reply; the outcome is unknown and the record is kept",
			x.attrs(slog.Int("status", resp.StatusCode), slog.String("on_lapse", p.onLapse.String()))...)
	}
	resp.Body = &watchedBody{ReadCloser: resp.Body, x: x}
	switch {
	case isEventStream(resp.Header.Get("Content-Type")):
		x.p.mw.TeeStream(x.w)
		x.stream("event_stream")
	case len(resp.Trailer) > 0:
		x.stream("trailers")
	case resp.ContentLength > p.maxStored:
		x.stream("too_large")
	}
	return nil
}

// watchedBody records a failure to read the upstream's body, which makes the outcome
// unknown (recoverBrokenBody).
type watchedBody struct {
	io.ReadCloser
	x *exchange
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.x.bodyErr = err
	}
	return n, err
}

func isEventStream(contentType string) bool {
	t, _, _ := mime.ParseMediaType(contentType)
	return t == "text/event-stream"
}

// stream makes the response pass through as it comes: an event stream teed, to be
// stored when it ends within the limit, anything else completed as
// response_not_stored, so that a repeat never runs the operation again.
func (x *exchange) stream(reason string) {
	if x.streaming {
		return
	}
	x.streaming = true
	if f := x.p.hooks.PassThrough; f != nil {
		f(x.p.Route(x.r), reason)
	}
	if reason == "event_stream" {
		return // stored if it ends within the limit; said at the end otherwise
	}
	x.p.logger.WarnContext(x.r.Context(), "idem proxy: the upstream's response "+unstorable[reason]+"; it is passed through, and repeats of the key get 409 response_not_stored",
		x.attrs(slog.String("reason", reason), slog.Int("status", x.status), slog.Int64("max_stored_body", x.p.maxStored))...)
}

// unstorable says, by reason, why a response cannot be stored whole; each reason has
// a message of its own, so that repeated warnings are summarised per reason.
var unstorable = map[string]string{
	"trailers":  "has trailers, which cannot be stored",
	"too_large": "is larger than the largest body stored (MaxStoredBody, --max-stored-body)",
}

// checkTrailers makes a buffered response that ended with trailers the upstream did
// not declare pass through (response_not_stored) rather than be stored without them;
// ReverseProxy sets them in the header map once the body was copied.
func (x *exchange) checkTrailers() {
	if x.streaming {
		return
	}
	for k := range x.w.Header() {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			x.stream("trailers")
			x.release()
			x.flush()
			return
		}
	}
}

// recoverBrokenBody handles the ReverseProxy's panic when the upstream's body broke
// after its status (http.ErrAbortHandler): the upstream acted, or may have, so the
// record is kept (SetOutcomeUnknown). A client that got the status already has its
// connection aborted, as a broken upstream body is passed on; one whose response was
// buffered gets the outcome's answer instead of the half response.
func (x *exchange) recoverBrokenBody() {
	v := recover()
	if v == nil {
		return
	}
	if v != http.ErrAbortHandler {
		panic(v)
	}
	x.h.SetOutcomeUnknown()
	note(x.r.Context(), x, "outcome_unknown")
	x.p.logger.WarnContext(x.r.Context(), "idem proxy: the upstream's body broke after its status; the outcome is unknown and the record is kept",
		x.attrs(slog.Int("status", x.status), slog.Any("error", x.bodyErr), slog.String("on_lapse", x.p.onLapse.String()))...)
	if x.streaming && !x.waitingInBackground() {
		panic(v) // the status went to the client: abort its connection
	}
	// The buffered half response was never written to the capture (release): the
	// outcome's answer takes its place.
	x.held, x.buf = false, bytes.Buffer{}
	for k := range x.w.Header() {
		delete(x.w.Header(), k)
	}
	x.writeUnknown(x.w)
}

// leaseLost reports whether the exchange ended because the claim's lease was lost:
// the middleware answers that itself.
func (x *exchange) leaseLost() bool {
	return x.h != nil && errors.Is(context.Cause(x.h.Context()), idem.ErrLeaseLost)
}

// writeUnknown answers a request whose upstream exchange failed after the request was
// written: 500 outcome_unknown under the policy unknown (repeats get the same until
// an operator resolves the key), or, under take_over, 502 upstream_reply_lost with
// Retry-After (the retry is forwarded again under the same derived key).
func (x *exchange) writeUnknown(w http.ResponseWriter) {
	if x.p.onLapse == idem.LapseUnknown {
		idem.WriteProblem(w, x.r, x.p.profile, &idem.Problem{Code: idem.CodeOutcomeUnknown})
		return
	}
	w.Header().Set("Retry-After", "1")
	idem.WriteProblem(w, x.r, x.p.profile, &idem.Problem{Status: http.StatusBadGateway, Code: CodeUpstreamReplyLost, Type: "api_error",
		Detail: "The upstream service received the request, but its reply was lost; retry with the same key: it is forwarded again under the same derived key."})
}

// attrs are the attributes of the exchange's log lines: never the key, a hash.
func (x *exchange) attrs(extra ...any) []any {
	a := []any{slog.String("method", x.r.Method), slog.String("path", x.r.URL.Path)}
	if x.h != nil {
		a = append(a, slog.String("key_hash", keyHash(x.h.Scope(), x.h.Key())))
	}
	return append(a, extra...)
}

// Header returns the capture's header.
func (x *exchange) Header() http.Header { return x.w.Header() }

// WriteHeader writes the status to the capture; a streaming response's headers go to
// the client at once (an event stream's client waits for them), a buffered one's are
// held with its body (release). A 1xx response may come from the transport's
// goroutine while the timer answers: both hold mu.
func (x *exchange) WriteHeader(code int) {
	if code < 200 {
		x.mu.Lock()
		defer x.mu.Unlock()
		if x.early {
			return
		}
		x.w.WriteHeader(code)
		return
	}
	if x.h != nil && !x.streaming {
		x.status, x.held = code, true
		return
	}
	x.w.WriteHeader(code)
	if x.streaming {
		x.flush()
	}
}

// Write writes body bytes, buffered or to the capture when streaming, streaming from
// the first byte over MaxStoredBody. A protected response's client may have gone
// away: the upstream's body is still read to its end, so that its outcome is stored.
func (x *exchange) Write(b []byte) (int, error) {
	if x.h == nil {
		return x.w.Write(b)
	}
	if !x.streaming && x.written+int64(len(b)) > x.p.maxStored {
		x.stream("too_large")
		x.release()
		x.flush()
	}
	x.written += int64(len(b))
	if x.held {
		x.buf.Write(b)
	} else {
		_, _ = x.w.Write(b)
	}
	return len(b), nil
}

// Flush passes a streaming response's bytes on; for a response to store it does
// nothing.
func (x *exchange) Flush() {
	if x.h == nil || x.streaming {
		x.flush()
	}
}

func (x *exchange) flush() { _ = http.NewResponseController(x.w).Flush() }

// Unwrap returns the capture, for http.NewResponseController's deadlines and
// Middleware.AnswerNow.
func (x *exchange) Unwrap() http.ResponseWriter { return x.w }
