package idem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// errCaptureFrozen is returned by writes that come after the response was frozen for a
// SPEC §7 completion: the stored response is already fixed, and the client must get
// exactly that.
var errCaptureFrozen = errors.New("idem: response already stored; write after the completing transaction ignored")

// capture is the http.ResponseWriter the handler writes to (SPEC §6). It buffers the
// status, headers and body until the handler returns, as http.TimeoutHandler does, so
// that the response can be stored before the client sees it. A Flush, or a body over
// the limit, switches it to pass-through: what was buffered and everything after goes
// to the client as written, and the response is not stored.
//
// It deliberately implements Flush and Hijack (refused) itself and has no ReadFrom, so
// that nothing reaches the underlying writer around it; Unwrap lets
// http.NewResponseController reach the underlying writer's deadlines.
//
// A capture is used by the handler's goroutine only, like any ResponseWriter.
type capture struct {
	w         http.ResponseWriter
	keyHeader string   // the name of the key header (canonical)
	key       []string // its values as received, set on the response
	limit     int64

	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
	passThrough bool // the response went (or is going) to the client as written
	frozen      bool // a §7 completion fixed the stored response
	// early: the client got its answer from AnswerNow, and w discards from then on:
	// what the handler writes is for the store only. tee: a pass-through response is
	// also kept, to be stored whole when it ends within the limit (TeeStream), unless
	// teeOver: it grew past the limit, and is not stored.
	early, tee, teeOver bool

	// stored and resp are the response as the store keeps it, set by freeze.
	stored http.Header
	resp   Response

	// bodyReader reads the request body for the handler (request.handlerRequest):
	// it lives as long as the capture, and is pooled with it.
	bodyReader bodyReader

	// lateWrite records a write refused because the response was frozen (logged once
	// the handler returned), unless answered: the middleware answers the request
	// itself (pending: with pendingResp or pendingErr, request.answerLater).
	lateWrite, answered, pending bool
	pendingResp                  *Response
	pendingErr                   error
}

// capturePool holds captures between requests, with their maps and body buffer. The
// response they freeze aliases them: stores copy what they store (see [idemstore.Store]), and
// the replay cache keeps a copy of its own.
var capturePool = sync.Pool{New: func() any {
	return &capture{header: make(http.Header), stored: make(http.Header)}
}}

// maxPooledResponse bounds the body buffer a pooled capture keeps.
const maxPooledResponse = 64 << 10

// getCapture returns a capture for w from the pool; give it back with putCapture
// once the response was sent and nothing refers to it any more.
func getCapture(w http.ResponseWriter, keyHeader string, key []string, limit int64) *capture {
	c := capturePool.Get().(*capture)
	c.w, c.keyHeader, c.key, c.limit = w, keyHeader, key, limit
	return c
}

func putCapture(c *capture) {
	if c.body.Cap() > maxPooledResponse {
		return
	}
	clear(c.header)
	clear(c.stored)
	c.body.Reset()
	*c = capture{header: c.header, stored: c.stored, body: c.body}
	capturePool.Put(c)
}

// Header returns the handler's header map.
func (c *capture) Header() http.Header { return c.header }

// WriteHeader records the status. 1xx informational responses go straight to the
// client and are not recorded, except 101 Switching Protocols, which is refused like
// Hijack: an upgraded connection has no response to store.
func (c *capture) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	if c.frozen && !c.passThrough {
		// Ignored without a word: a status line alone after the response was fixed
		// changes nothing the client gets, and frameworks write one once the handler
		// returned whatever it wrote (gin's WriteHeaderNow). Late body bytes are
		// refused and reported (beforeWrite).
		return
	}
	if c.wroteHeader {
		return
	}
	if code < 200 {
		if code != http.StatusSwitchingProtocols {
			c.writeInformational(code)
		}
		return
	}
	c.status = code
	c.wroteHeader = true
	if c.passThrough {
		c.sendHeader()
	}
}

// writeInformational sends a 1xx response with the handler's header as it is now,
// then gives the client's header map back what it held, so that the 1xx's fields reach
// the final response (and its record) only when the handler's header still has them
// then: net/http leaves them in the map it wrote them from (RFC 8297), and a handler
// that clears its header after a 103, as httputil.ReverseProxy does, would see them
// sent on its final response but not stored.
func (c *capture) writeInformational(code int) {
	dst := c.w.Header()
	saved := make(map[string][]string, len(c.header))
	for k, v := range c.header {
		old, had := dst[k]
		if had {
			saved[k] = old
		} else {
			saved[k] = nil
		}
		dst[k] = v
	}
	c.w.WriteHeader(code)
	for k, old := range saved {
		if old == nil {
			delete(dst, k)
		} else {
			dst[k] = old
		}
	}
}

// Write buffers p, or passes it through once the capture switched to pass-through.
func (c *capture) Write(p []byte) (int, error) {
	if err := c.beforeWrite(len(p)); err != nil {
		return 0, err
	}
	if c.passThrough {
		c.keep(p)
		return c.w.Write(p)
	}
	return c.body.Write(p)
}

// keep keeps p of a pass-through response that is teed (TeeStream) while the whole
// stays within the limit.
func (c *capture) keep(p []byte) {
	if !c.tee || c.teeOver {
		return
	}
	if int64(c.body.Len()+len(p)) > c.limit {
		c.teeOver = true
		c.body = bytes.Buffer{}
		return
	}
	c.body.Write(p)
}

// WriteString is Write without a conversion, as http.ResponseWriter's own does.
func (c *capture) WriteString(s string) (int, error) {
	if err := c.beforeWrite(len(s)); err != nil {
		return 0, err
	}
	if c.passThrough {
		if c.tee && !c.teeOver {
			c.keep([]byte(s))
		}
		return io.WriteString(c.w, s)
	}
	return c.body.WriteString(s)
}

// beforeWrite readies the capture for n more body bytes: it writes the implicit 200,
// refuses a body the status forbids or a write after the response was frozen, and
// switches to pass-through when the body would pass the storage limit.
func (c *capture) beforeWrite(n int) error {
	if c.frozen && !c.passThrough {
		if n > 0 {
			c.refused()
		}
		return errCaptureFrozen
	}
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(c.status) {
		return http.ErrBodyNotAllowed
	}
	if !c.passThrough && int64(c.body.Len()+n) > c.limit {
		c.teeOver = true // a teed stream over the limit is not stored either
		c.startPassThrough()
	}
	return nil
}

// refused notes a write after the response was frozen.
func (c *capture) refused() {
	if !c.answered {
		c.lateWrite = true
	}
}

// empty reports whether the handler has written nothing yet: no status, no byte.
func (c *capture) empty() bool { return !c.wroteHeader && !c.passThrough }

// Flush sends what was written so far and switches to pass-through: a handler that
// flushes streams its response, which is then not stored.
func (c *capture) Flush() {
	if c.frozen && !c.passThrough {
		return
	}
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	c.startPassThrough()
	_ = http.NewResponseController(c.w).Flush()
}

// Hijack is refused: a hijacked connection has no response to store or replay.
func (c *capture) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, http.ErrNotSupported
}

// Unwrap returns the underlying writer, for http.NewResponseController.
func (c *capture) Unwrap() http.ResponseWriter { return c.w }

// startPassThrough sends the status, headers and buffered body, after which writes go
// to the client directly.
func (c *capture) startPassThrough() {
	if c.passThrough {
		return
	}
	c.passThrough = true
	if c.wroteHeader {
		c.sendHeader()
	}
	if c.body.Len() > 0 {
		_, _ = c.w.Write(c.body.Bytes())
	}
	if !c.tee || c.teeOver {
		c.body = bytes.Buffer{}
	}
}

func (c *capture) sendHeader() {
	dst := c.w.Header()
	for k, v := range c.header {
		dst[k] = v
	}
	if c.key != nil {
		dst[c.keyHeader] = c.key
	}
	c.w.WriteHeader(c.status)
}

// finish completes the captured response after the handler returned: the status
// defaults to 200 and the Content-Type is sniffed as net/http would, so that the
// stored response and the one the client gets are the same.
func (c *capture) finish() {
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	if c.passThrough {
		c.sendTrailers()
		return
	}
	_, haveType := c.header["Content-Type"]
	if !haveType && c.body.Len() > 0 && bodyAllowed(c.status) && c.header.Get("Transfer-Encoding") == "" {
		c.header.Set("Content-Type", http.DetectContentType(c.body.Bytes()))
	}
}

// freeze finishes the response and returns it as the store keeps it (headers
// filtered by allow); later writes are refused. A pass-through response is
// NotStored. The response aliases the capture: it is valid until the capture goes
// back to the pool.
func (c *capture) freeze(allow map[string]bool) *Response {
	c.finish()
	c.frozen = true
	if c.passThrough && (!c.tee || c.teeOver || hasTrailers(c.header)) {
		// A teed stream with trailers is not stored either: a replay without them
		// would not be the same response.
		c.resp = Response{Status: c.status, Header: c.stored, NotStored: true}
		return &c.resp
	}
	for k, v := range c.header {
		if allow[k] && len(v) > 0 {
			c.stored[k] = v
		} else if ck := http.CanonicalHeaderKey(k); ck != k && allow[ck] && len(v) > 0 {
			c.stored[ck] = v
		}
	}
	c.resp = Response{Status: c.status, Header: c.stored, Body: c.body.Bytes()}
	return &c.resp
}

// send writes the buffered response to the client. Nothing is left to send after
// pass-through.
func (c *capture) send() {
	c.finish()
	if c.passThrough {
		return
	}
	c.passThrough = true
	c.sendHeader()
	if c.body.Len() > 0 {
		_, _ = c.w.Write(c.body.Bytes())
	}
}

// sendTrailers passes the trailers of a pass-through response on to the client: the
// values of the trailers it declared (Trailer) and those it set under
// http.TrailerPrefix, which the handler sets in its header map once the body is
// written, after the header went to the client.
func (c *capture) sendTrailers() {
	if c.early {
		return
	}
	dst := c.w.Header()
	for k, v := range c.header {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			dst[k] = v
		}
	}
	for _, declared := range c.header["Trailer"] {
		for name := range strings.SplitSeq(declared, ",") {
			if name = http.CanonicalHeaderKey(strings.TrimSpace(name)); name != "" {
				if v, ok := c.header[name]; ok {
					dst[name] = v
				}
			}
		}
	}
}

// hasTrailers reports whether h declares or sets trailers.
func hasTrailers(h http.Header) bool {
	if len(h["Trailer"]) > 0 {
		return true
	}
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// AnswerNow sends the client an answer now, written by write, while the handler runs
// on (SPEC §17: a proxy that answers 504 and goes on waiting for its upstream). From
// then on the client gets nothing more of this request: what the handler writes is
// only what the middleware stores (or releases) when the handler returns, as for any
// response, and the repeats of the key get that. w is the ResponseWriter the handler
// got from the middleware (or one that unwraps to it); write gets the client's
// writer, with the Idempotency-Key header set, and what it writes is flushed. It
// returns an error, and writes nothing, when w is not the middleware's or a response
// already went to the client. It may be called from another goroutine than the
// handler's only while the handler does not write (the caller synchronises).
func (m *Middleware) AnswerNow(w http.ResponseWriter, write func(http.ResponseWriter)) error {
	c := captureOf(w)
	switch {
	case c == nil:
		return errors.New("idem: Middleware.AnswerNow: the ResponseWriter is not the middleware's")
	case c.passThrough || c.early || c.frozen:
		return errors.New("idem: Middleware.AnswerNow: a response already went to the client")
	}
	dst := c.w
	if c.key != nil {
		dst.Header()[c.keyHeader] = c.key
	}
	// The answer is written whole, with its Content-Length, so that the client knows
	// it ended although the handler runs on, and with Connection: close, so that the
	// client sends its next request on another connection rather than behind it.
	a := &early{header: dst.Header(), status: http.StatusOK}
	write(a)
	dst.Header().Set("Content-Length", strconv.Itoa(a.body.Len()))
	dst.Header().Set("Connection", "close")
	dst.WriteHeader(a.status)
	_, _ = dst.Write(a.body.Bytes())
	_ = http.NewResponseController(dst).Flush()
	c.early = true
	c.w = discard{header: make(http.Header)}
	return nil
}

// TeeStream makes the response that the handler streams (it flushes) reach the client
// as it is written and still be stored whole when it ends within the storage limit
// (Config.MaxResponseBytes), instead of being completed as response_not_stored: the
// repeats of the key get the same stream replayed in one piece. One that grows past
// the limit, or has trailers, is not stored (response_not_stored). It reports whether
// w is the middleware's (or unwraps to it).
func (m *Middleware) TeeStream(w http.ResponseWriter) bool {
	c := captureOf(w)
	if c == nil {
		return false
	}
	c.tee = true
	return true
}

// captureOf finds the middleware's capture under w, or nil.
func captureOf(w http.ResponseWriter) *capture {
	for w != nil {
		switch t := w.(type) {
		case *capture:
			return t
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return nil
		}
	}
	return nil
}

// early buffers the answer of AnswerNow.
type early struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (e *early) Header() http.Header         { return e.header }
func (e *early) Write(p []byte) (int, error) { return e.body.Write(p) }
func (e *early) WriteHeader(code int)        { e.status = code }

// discard is the client's writer once AnswerNow answered it: nothing more is sent.
type discard struct{ header http.Header }

func (d discard) Header() http.Header       { return d.header }
func (discard) Write(p []byte) (int, error) { return len(p), nil }
func (discard) WriteHeader(int)             {}

// bodyAllowed reports whether a response with status may have a body, as net/http's
// rule.
func bodyAllowed(status int) bool {
	return (status < 100 || status > 199) && status != http.StatusNoContent && status != http.StatusNotModified
}
