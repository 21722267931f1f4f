package check

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/internal/secret"
)

// Bounds of what the checker reads and shows.
const (
	// maxBody is the most of a response body the checker reads; a longer body is
	// compared by its first maxBody bytes.
	maxBody = 1 << 20
	// shownBody is the most of a body the report shows.
	shownBody = 4 << 10
)

// HeaderReplayed is the header with which idem (and others) mark a replayed answer.
const HeaderReplayed = "Idempotent-Replayed"

// env is what the checks share: the configuration, the client and the fixture, a key
// whose first request (Body) completed with 2xx.
type env struct {
	cfg      *Config
	requests atomic.Int64
	// urls are the endpoint's instances: cfg.URL, then cfg.Instances.
	urls []string
	// body and bodyAlt are this run's Body and BodyAlt: their first numbers drawn
	// afresh for the run (see [RunBodies]), so that no earlier run sent them.
	body, bodyAlt []byte
	// fixture is the first answer of fixtureKey, sent by prepare.
	fixtureKey string
	fixture    *Exchange
	// replays is set by the replay check when the endpoint answered a retry with its
	// first answer, by its content (body, Location, resource), whatever the status:
	// without it, a fresh execution proves nothing in the checks that judge one.
	replays bool
	// replayKnown is set once replays is known: by the replay check, or by
	// knowReplays when that check did not run (--only, --skip).
	replayKnown bool
	// noReplay, when nothing replays, says what the retry of the first request got
	// instead ("422 {…}"), for the checks that then cannot judge.
	noReplay string
	// naive, set by the replay check, says why the endpoint looks as if it ignored the
	// key; the checks after it are then skipped with that reason.
	naive string
	// keyless are the answers of the bad-keys check's requests without a key and with
	// an empty one, by form ("missing", "empty"), which the keyless check reuses.
	keyless map[string]*Exchange

	freshOnce sync.Once
	// fresh sends a request on a connection of its own, closed after it: the restart
	// check's first request, and a request sent again after the server closed the
	// connection it was written on (nil: the configuration's client).
	fresh *http.Client

	mu sync.Mutex
	// resources are the resources that the unsafe requests' 2xx answers named (an id
	// or a Location), each once.
	resources map[string]bool
	// unidentified counts the 2xx answers to unsafe requests that named no resource
	// and were not marked replayed.
	unidentified int
}

// record counts the resource of x, a 2xx answer to an unsafe request: by its id or
// its Location, once however many answers name it. A replay (Idempotent-Replayed) to
// a request without a real key (none, or an empty one) is not counted: its resource
// may be older than the run, as every key the run sends is fresh.
func (e *env) record(x *Exchange) {
	if safeMethod(x.Request.Method) || x.Request.Method == hookMethod || !x.ok() {
		return
	}
	keys := x.Request.Header[e.cfg.KeyHeader]
	keyed := len(keys) > 0 && keys[0] != ""
	r := resourceOf(x)
	x.Resource = r
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case r != "" && !keyed && x.replayed():
	case r != "":
		if e.resources == nil {
			e.resources = map[string]bool{}
		}
		e.resources[r] = true
	case !x.replayed():
		e.unidentified++
	}
}

// counts returns how many distinct resources and unidentified answers were seen.
func (e *env) counts() (resources, unidentified int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.resources), e.unidentified
}

// prepare sends Body with a fresh key: the first request of the checks that need a
// completed key, and the proof that the endpoint can be checked at all.
func (e *env) prepare(ctx context.Context) error {
	e.fixtureKey = client.NewKey()
	x := e.send(ctx, request{label: "first request (--body)", body: e.body, keys: []string{e.fixtureKey}})
	switch {
	case x.Response == nil:
		return fmt.Errorf("%w: %s %s: %s", ErrUnusable, e.cfg.Method, redactURL(e.cfg.URL), x.Error)
	case !is2xx(x.Response.Status):
		return fmt.Errorf("%w: %s %s with --body and a fresh key answered %s: the checks need a body it accepts (2xx) and the headers it needs (--header)",
			ErrUnusable, e.cfg.Method, redactURL(e.cfg.URL), x.Response.describe())
	}
	e.fixture = x
	for i, u := range e.urls[1:] {
		y := e.send(ctx, request{label: fmt.Sprintf("instance %d: GET without a key", i+2), method: http.MethodGet, instance: i + 1})
		if y.Response == nil {
			return fmt.Errorf("%w: instance %d, %s: %s", ErrUnusable, i+2, redactURL(u), y.Error)
		}
	}
	return nil
}

// request is one request a check sends.
type request struct {
	// label says what the request is in the evidence ("retry", "empty key").
	label string
	// method defaults to the endpoint's.
	method string
	body   []byte
	// keys are the values of the key's header fields: nil sends no header, {""} an
	// empty one, two values two fields.
	keys []string
	// other sends the second principal's headers.
	other bool
	// instance is the index in env.urls of the instance the request goes to.
	instance int
	// url, when set, replaces the instance's URL (another path or query).
	url string
	// wrote, when set, is called once the request is written.
	wrote func()
	// variant names what the request changes (other-request: "method", "path",
	// "query"), for the cause of a failure.
	variant string
	// fresh sends the request on a connection of its own, and never again (see
	// [env.send]).
	fresh bool
}

// Exchange is one request and its answer, as the report shows them.
type Exchange struct {
	// Label says what the request was for.
	Label string `json:"label"`
	// Instance is which of the endpoint's URLs was asked, from 1; 0 when there is
	// one.
	Instance int `json:"instance,omitempty"`
	// Request is what was sent, secrets redacted.
	Request SentRequest `json:"request"`
	// Response is the answer; nil when there was none.
	Response *Answer `json:"response,omitempty"`
	// Error is why there was no answer.
	Error string `json:"error,omitempty"`
	// Resource is the resource a 2xx answer to an unsafe request named: "id ch_1",
	// or "Location /v1/charges/ch_1" when the body has no id; "" when neither.
	Resource string `json:"resource,omitempty"`
	// Elapsed is how long the exchange took.
	Elapsed Millis `json:"elapsed_ms"`
	// Resent, when set, says why the request was sent a second time, on a new
	// connection: the first send got no answer on a connection the server had closed
	// after an earlier answer. Only the second send's answer is the exchange's.
	Resent string `json:"resent,omitempty"`

	err error // the error of a request without an answer
}

// SentRequest is a request as the report shows it.
type SentRequest struct {
	Method string `json:"method"`
	URL    string `json:"url"`
	// Header are the headers sent: the values that came from the configuration are
	// redacted but for Content-Type and Accept (a bearer token shows its scheme and
	// a short hash, so that two principals can be told apart).
	Header http.Header `json:"header"`
	// Body is the body sent, cut at 4 KiB, with [Config.IncludeBodies] only.
	Body string `json:"body,omitempty"`
	// BodySHA256 is the start of the hex SHA-256 of the body sent (12 digits), and
	// BodyBytes its length: what the reports show of a body without IncludeBodies.
	BodySHA256 string `json:"body_sha256,omitempty"`
	BodyBytes  int    `json:"body_bytes,omitempty"`
}

// Answer is a response as the report shows it.
type Answer struct {
	Status int `json:"status"`
	// Header are the response's headers, Set-Cookie redacted.
	Header http.Header `json:"header"`
	// Body is the body, cut at 4 KiB, with [Config.IncludeBodies] only.
	Body string `json:"body,omitempty"`
	// BodySHA256 is the start of the hex SHA-256 of the body (12 digits), and
	// BodyBytes its length.
	BodySHA256 string `json:"body_sha256,omitempty"`
	BodyBytes  int    `json:"body_bytes,omitempty"`
	// Code is the error code of an error body in idem's profiles (Stripe's shape or
	// problem+json), if any.
	Code string `json:"code,omitempty"`

	raw []byte // the body as read, up to maxBody
}

// Millis is a duration that JSON shows in milliseconds.
type Millis time.Duration

// MarshalJSON writes the duration as a number of milliseconds.
func (m Millis) MarshalJSON() ([]byte, error) {
	return json.Marshal(float64(time.Duration(m).Microseconds()) / 1000)
}

// UnmarshalJSON reads a number of milliseconds.
func (m *Millis) UnmarshalJSON(b []byte) error {
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil {
		return err
	}
	*m = Millis(ms * float64(time.Millisecond))
	return nil
}

func (m Millis) String() string { return time.Duration(m).Round(time.Millisecond).String() }

// send sends r and returns the exchange; an error is in the exchange, never
// returned: a check judges a missing answer as any other.
//
// A request written on a kept-alive connection that the server had closed after its
// last answer (a server may close a connection after an answer without saying so:
// uvicorn after a 500 from an exception) fails with no answer at all, or, when the
// client saw the close first, goes out on a new connection: which of the two a run
// meets is a race. So a request that got no byte of an answer on a reused connection
// is sent once more on a new one (as net/http does for a request it may replay), and
// its exchange says so ([Exchange.Resent]); one with r.fresh is sent on a new
// connection to begin with, and never again.
func (e *env) send(ctx context.Context, r request) *Exchange {
	x, req := e.newRequest(ctx, r)
	if req == nil {
		return x
	}
	if r.fresh {
		return e.do(x, req, e.freshClient())
	}
	var reused bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
	}))
	x = e.do(x, req, nil)
	if x.Response != nil || !reused || ctx.Err() != nil || !closedByServer(x.err) {
		return x
	}
	why := x.Error
	y, req := e.newRequest(ctx, r)
	if req == nil {
		return x
	}
	y.Resent = "the first send, on a connection kept from an earlier answer, got no answer (" + why + "): the server had closed it; sent again on a new connection"
	return e.do(y, req, e.freshClient())
}

// closedByServer reports whether err, a request's error without an answer, is what
// a connection closed by the server gives: the end of the stream, a reset, a broken
// pipe.
func closedByServer(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	return strings.Contains(err.Error(), "server closed idle connection")
}

// freshClient returns a client that sends each request on a connection of its own
// and closes it after the answer: the configuration's transport without keep-alives,
// or, when the configuration's client has a transport of the caller's, that client.
func (e *env) freshClient() *http.Client {
	e.freshOnce.Do(func() {
		t, ok := e.cfg.Client.Transport.(*http.Transport)
		if !ok {
			e.fresh = e.cfg.Client
			return
		}
		t = t.Clone()
		t.DisableKeepAlives = true
		c := *e.cfg.Client
		c.Transport = t
		e.fresh = &c
	})
	return e.fresh
}

// newRequest returns r's exchange and its HTTP request, or a nil request and the
// exchange with its error.
func (e *env) newRequest(ctx context.Context, r request) (*Exchange, *http.Request) {
	method := r.method
	if method == "" {
		method = e.cfg.Method
	}
	target := e.urls[r.instance]
	if r.url != "" {
		target = r.url
	}
	x := &Exchange{Label: r.label, Request: SentRequest{Method: method, URL: redactURL(target)}}
	x.Request.Body, x.Request.BodySHA256, x.Request.BodyBytes = e.shownBody(r.body)
	if len(e.urls) > 1 {
		x.Instance = r.instance + 1
	}
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	if r.wrote != nil {
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { r.wrote() }})
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		x.Error = err.Error()
		return x, nil
	}
	// Go's transport sends a request with a body it can rebuild and an
	// Idempotency-Key again, on a new connection, when a reused one fails: the
	// checker must send each of its requests once, and count what it sent.
	req.GetBody = nil
	req.Header = e.header(r.other)
	if r.body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", contentType(r.body))
	}
	if r.keys != nil {
		req.Header[e.cfg.KeyHeader] = r.keys
	}
	x.Request.Header = redactHeader(req.Header, e.cfg.KeyHeader)
	return x, req
}

// do sends req with c (the configuration's client when nil) and fills in x.
func (e *env) do(x *Exchange, req *http.Request, c *http.Client) *Exchange {
	if c == nil {
		c = e.cfg.Client
	}
	e.requests.Add(1)
	start := time.Now()
	resp, err := c.Do(req)
	return e.answer(x, start, resp, err)
}

// answer fills in x with resp, read to its end and closed, or with err.
func (e *env) answer(x *Exchange, start time.Time, resp *http.Response, err error) *Exchange {
	if err != nil {
		x.Elapsed = Millis(time.Since(start))
		x.Error = netAddrs.ReplaceAllString(oneLine(secret.RedactURLError(err).Error()), "")
		x.err = err
		return x
	}
	defer resp.Body.Close()
	a := &Answer{Status: resp.StatusCode, Code: client.ErrorCode(resp)}
	a.raw, err = io.ReadAll(io.LimitReader(resp.Body, maxBody))
	x.Elapsed = Millis(time.Since(start))
	if err != nil {
		x.Error = "reading the body: " + oneLine(err.Error())
		return x
	}
	a.Body, a.BodySHA256, a.BodyBytes = e.shownBody(a.raw)
	a.Header = resp.Header.Clone()
	if _, ok := a.Header["Set-Cookie"]; ok {
		a.Header["Set-Cookie"] = []string{"[redacted]"}
	}
	x.Response = a
	e.record(x)
	return x
}

// shownBody returns what the reports show of a body: the body itself (cut at
// shownBody bytes) with IncludeBodies only, its hash and its length.
func (e *env) shownBody(b []byte) (body, sum string, n int) {
	if len(b) == 0 {
		return "", "", 0
	}
	if e.cfg.IncludeBodies {
		body = shown(b)
	}
	return body, bodyHash(b), len(b)
}

// bodyHash is the start of the hex SHA-256 of b, 12 digits.
func bodyHash(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:6])
}

// header returns the headers of a request, as the second principal when other.
func (e *env) header(other bool) http.Header {
	h := e.cfg.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	if other {
		for k, v := range e.cfg.Other {
			h[k] = v
		}
	}
	h.Set("User-Agent", "idem-check")
	return h
}

// redactHeader returns h with the values that may be secrets redacted: every header
// but the key's, Content-Type, Accept and User-Agent. An Authorization value keeps its
// scheme; every redacted value shows a short hash, so that two principals' headers
// differ in the report.
func redactHeader(h http.Header, keyHeader string) http.Header {
	out := make(http.Header, len(h))
	for k, vs := range h {
		switch k {
		case keyHeader, "Content-Type", "Accept", "User-Agent":
			out[k] = vs
			continue
		}
		for _, v := range vs {
			out[k] = append(out[k], redactValue(k, v))
		}
	}
	return out
}

// redactValue hides v, keeping an Authorization scheme and an 8-digit hash of v.
func redactValue(name, v string) string {
	sum := sha256.Sum256([]byte(v))
	hidden := "[redacted sha256:" + hex.EncodeToString(sum[:4]) + "]"
	if scheme, _, ok := strings.Cut(v, " "); ok && (name == "Authorization" || name == "Proxy-Authorization") {
		return scheme + " " + hidden
	}
	return hidden
}

// redactURL hides the passwords and the token-like query parameters of a URL.
func redactURL(u string) string { return secret.RedactURL(u) }

// shown returns b as the report shows a body: cut at shownBody bytes, and "" for nil.
func shown(b []byte) string {
	if len(b) > shownBody {
		return string(b[:shownBody]) + fmt.Sprintf("… (%d bytes)", len(b))
	}
	return string(b)
}

// netAddrs are the addresses in a network error ("read tcp 127.0.0.1:4242->…: "),
// which differ from one connection to the next: without them, one failure reads the
// same on every connection, and tallies count it as one.
var netAddrs = regexp.MustCompile(`(read|write|dial) (tcp|udp|unix)[46]? \S+: `)

// contentType is the Content-Type of a body the configuration sends without one.
func contentType(body []byte) string {
	if json.Valid(body) {
		return "application/json"
	}
	return "application/x-www-form-urlencoded"
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func is2xx(status int) bool { return status >= 200 && status < 300 }

// describe renders an answer as "201", "409 key_reused" or, without a code, the
// status and the start of the body.
func (a *Answer) describe() string {
	if a.Code != "" {
		return fmt.Sprintf("%d %s", a.Status, a.Code)
	}
	if is2xx(a.Status) {
		return fmt.Sprint(a.Status)
	}
	b := summary(a.Header.Get("Content-Type"), a.raw)
	if b == "" {
		return fmt.Sprint(a.Status)
	}
	return fmt.Sprintf("%d %s", a.Status, b)
}

// describe renders the exchange's outcome: the answer, or "no answer (…)".
func (x *Exchange) describe() string {
	if x.Response == nil {
		return "no answer (" + x.Error + ")"
	}
	return x.Response.describe()
}

// Outcome renders the exchange's outcome for the report: the answer's status and
// error code, with a replay marker or Retry-After when present, or "no answer".
func (x *Exchange) Outcome() string {
	d := x.describe()
	if x.replayed() {
		d += ", " + HeaderReplayed
	}
	if x.retryAfter() {
		d += ", Retry-After: " + x.Response.Header.Get("Retry-After")
	}
	return d
}

// status is the answer's status, 0 without an answer.
func (x *Exchange) status() int {
	if x.Response == nil {
		return 0
	}
	return x.Response.Status
}

// ok reports whether the exchange was answered 2xx.
func (x *Exchange) ok() bool { return is2xx(x.status()) }

// replayed reports whether the answer says it is a replay.
func (x *Exchange) replayed() bool {
	return x.Response != nil && strings.EqualFold(x.Response.Header.Get(HeaderReplayed), "true")
}

// retryAfter reports whether the answer carries Retry-After.
func (x *Exchange) retryAfter() bool {
	return x.Response != nil && x.Response.Header.Get("Retry-After") != ""
}

// resourceID returns the top-level "id" of a JSON object body (a string, or a number
// as written), or "".
func resourceID(body []byte) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return ""
	}
	raw, ok := obj["id"]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String()
	}
	return ""
}

// identity names the resource a 2xx answer is: its id when the body has one, else
// its Location, else "body sha256:…" of the bytes.
func identity(x *Exchange) string {
	if id := resourceID(x.Response.raw); id != "" {
		return id
	}
	if loc := x.Response.Header.Get("Location"); loc != "" {
		return "Location " + loc
	}
	return "body sha256:" + bodyHash(x.Response.raw)
}

// resourceOf names the resource a 2xx answer created or replayed, by its id, else
// its Location; "" when it has neither (such answers cannot be counted as
// resources).
func resourceOf(x *Exchange) string {
	if id := resourceID(x.Response.raw); id != "" {
		return "id " + id
	}
	if loc := x.Response.Header.Get("Location"); loc != "" {
		return "Location " + loc
	}
	return ""
}

// sameResource reports whether two 2xx answers are one resource: identical bodies,
// bodies with the same id, or the same Location.
func sameResource(a, b *Exchange) bool {
	if !a.ok() || !b.ok() {
		return false
	}
	if bytes.Equal(a.Response.raw, b.Response.raw) {
		return true
	}
	r := resourceOf(a)
	return r != "" && r == resourceOf(b)
}

// carries reports whether x's answer, whatever its status, is first's response
// again by its content: the same resource id in the body, the same Location, or the
// same body bytes (not empty). A library that replays a completed key with 409 and the
// first body is recognised by it.
func carries(first, x *Exchange) bool {
	if first.Response == nil || x.Response == nil {
		return false
	}
	a, b := first.Response, x.Response
	if bytes.Equal(a.raw, b.raw) && (len(a.raw) > 0 || first.ok() && x.ok()) {
		return true // two empty 2xx answers are one as far as anyone can tell
	}
	if id := resourceID(a.raw); id != "" && resourceID(b.raw) == id {
		return true
	}
	loc := a.Header.Get("Location")
	return loc != "" && b.Header.Get("Location") == loc
}

// namesResource reports whether x's answer names a resource (an id in its body, or a
// Location), whatever its status: such an answer is a final one, a resource's,
// never a refusal of a key in flight.
func namesResource(x *Exchange) bool {
	if x.Response == nil {
		return false
	}
	return resourceID(x.Response.raw) != "" || x.Response.Header.Get("Location") != ""
}

// leaks reports whether first's response shows up in x's answer, whatever its status:
// its resource's id (of 8 characters or more) anywhere in x's body or headers, its
// Location in any of x's headers, or its whole body (not empty) inside x's.
func leaks(first, x *Exchange) bool {
	if carries(first, x) {
		return true
	}
	if first.Response == nil || x.Response == nil {
		return false
	}
	var marks []string
	if id := resourceID(first.Response.raw); len(id) >= 8 {
		marks = append(marks, id)
	}
	if loc := first.Response.Header.Get("Location"); loc != "" {
		marks = append(marks, loc)
	}
	for _, m := range marks {
		if bytes.Contains(x.Response.raw, []byte(m)) {
			return true
		}
		for _, vs := range x.Response.Header {
			for _, v := range vs {
				if strings.Contains(v, m) {
					return true
				}
			}
		}
	}
	return len(marks) > 0 && bytes.Contains(x.Response.raw, first.Response.raw)
}

// untellable reports whether a 2xx answer cannot be told from another execution's:
// it is byte for byte the same as first's, yet names no resource and carries no
// replay marker (an empty 204 is the same for every execution).
func untellable(first, x *Exchange) bool {
	return x.ok() && bytes.Equal(x.Response.raw, first.Response.raw) && resourceOf(x) == "" && !x.replayed()
}

// errNoNumber is AltBody's error for a body without a number to change.
var errNoNumber = errors.New("the body has no number to change: give another valid body")
