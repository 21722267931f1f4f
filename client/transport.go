package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/internal/logsummary"
)

// Defaults of a [Transport]'s limits.
const (
	// DefaultMaxAttempts is the number of attempts that reached the server (the first
	// included), after which a [Transport] gives up.
	DefaultMaxAttempts = 5
	// DefaultMaxWait is how long a [Transport] waits for a server that refuses
	// connections (a restart) or for a key in progress (a crashed holder's, until the
	// server's lease lapses: 30 s by default on an idem server), before it gives up.
	DefaultMaxWait = time.Minute
)

// maxDrain bounds how much of a discarded response is read so that its connection
// can be reused; a longer body is closed unread.
const maxDrain = 64 << 10

// Transport is an [http.RoundTripper] that adds idempotency keys and retries safely
// (SPEC §12). The zero value is ready to use; fields must not change once it is in
// use. A Transport is safe for concurrent use, and all its requests share one
// [Budget].
//
// A POST or PATCH without an Idempotency-Key gets a fresh one ([NewKey]); the body is
// read once (or rebuilt with Request.GetBody when the request has it) and sent
// byte for byte, with the same key, on every attempt. RoundTrip returns the first
// answer the [RetryPolicy] does not retry; when it gives up instead, it returns a
// [*RetryError] that names the limit that stopped it (RetryError.Limit), and closes the
// last response.
//
// # What limits the retries
//
// The retries of one request fall in three kinds, so that a server restart of a few
// seconds is ridden out with the defaults while an overloaded server is spared:
//
//   - Waiting: an attempt whose connection could not be made (refused: nothing
//     listens, as while the server restarts; no route; a failed DNS lookup), so that
//     nothing was sent, and an answer 409 request_in_progress (the key's first
//     attempt still holds it: after a crash, until the server's lease lapses). These
//     are retried without a [Budget] token and do not count in MaxAttempts: they add
//     no load that the budget is there to limit (nothing listens, or a replay is one
//     read of the key), and they are paced by the backoff, or the server's
//     Retry-After. MaxWait bounds them instead: no waiting retry starts more than
//     MaxWait (60 s by default) after the request's first attempt. Against a server
//     that stays down a request therefore gives up within MaxWait plus one connection
//     attempt: at once when connections are refused, up to Base's dial timeout (30 s
//     for http.DefaultTransport) when the host does not answer at all.
//   - A broken connection: the request was sent, or may have been, and the connection
//     failed before an answer (a reset, an EOF: the server was killed mid-request, or
//     closed a keep-alive connection as the request arrived). A request's first such
//     retry takes no Budget token, since a restart breaks every connection in flight
//     at once and each of them needs one retry to get through; nor does its first
//     after each time it could not connect (a waiting attempt, above: the server went
//     down and came back, a restart of its own, which a request waiting out a first
//     restart may meet too). Its other ones do. All count in MaxAttempts. The retry of a broken
//     connection waits at least 50 ms, the http.Transport's re-sends (below)
//     included: a server being killed resets the connections in flight a few
//     milliseconds before its listening socket closes, and a retry sent at once
//     connects to the dying process and breaks again.
//   - A failure: a 5xx (other than 501), a 429, an attempt that outlived
//     AttemptTimeout. Each retry takes a Budget token and counts in MaxAttempts (5 by
//     default, the first attempt included).
//
// A request gives up at the first limit it meets: MaxAttempts, the Budget, MaxWait, or
// its context (which bounds everything: http.Client.Timeout, a deadline).
//
// # The http.Transport's own re-sends
//
// The http.Transport underneath re-sends a request that carries an Idempotency-Key
// on its own when a reused keep-alive connection fails after the request was written
// (a server's idle timeout striking as the request arrives). Such a re-send is an
// attempt like any other (a broken connection's retry), and takes its attempt and its
// Budget token before it happens, or does not happen:
//
//   - A request with a body is re-sent only after net/http calls its
//     Request.GetBody, which the Transport sets to a gate: it admits the re-send when
//     the request has an attempt left (MaxAttempts) and the budget a token (or the
//     request its free retry after a broken connection), and takes both; otherwise it
//     refuses, and the request ends with a [*RetryError] that says why (wrapping
//     [ErrBudgetExhausted] when the budget refused).
//   - A request without a body gives net/http nothing to ask, so the Transport keeps
//     it from re-sending at all: net/http re-sends only requests whose header map
//     holds the canonical "Idempotency-Key" entry, and the Transport writes the key
//     under its lower-case name instead (header names are case-insensitive, and
//     HTTP/2 lower-cases them anyway). A failed connection is then retried by the
//     Transport itself, paid for like any retry. Only the request handed to Base
//     carries the lower-case entry; the [RetryPolicy] and resp.Request see the
//     canonical one.
//
// What net/http still re-sends without asking is counted after the fact, by tracing
// each attempt ([httptrace.ClientTrace]: a second request written within one attempt
// is a re-send), and charged to the budget, which it may overdraw: body-less requests
// that are idempotent by method (GET, HEAD, OPTIONS, TRACE), an HTTP/2 request the
// server refused unprocessed (REFUSED_STREAM, GOAWAY), and a body-less request none of
// whose bytes reached the connection.
type Transport struct {
	// Base sends each attempt. Defaults to [http.DefaultTransport].
	Base http.RoundTripper

	// Policy decides which answers and errors are retried. Defaults to
	// [DefaultRetryPolicy].
	Policy RetryPolicy

	// Backoff is the wait before a retry when the answer has no Retry-After.
	// Defaults to [DefaultBackoff] (exponential from 100ms to 5s, full jitter).
	Backoff Backoff

	// Budget limits the retries of failures, and of broken connections after each
	// request's first (and first since it last found connections refused), of all
	// requests sharing it (see [Transport]: waiting for a server that refuses
	// connections, or for a key in progress, takes no token).
	// Defaults to one budget per Transport, made on first use by
	// NewBudget([DefaultBudgetRatio], [DefaultBudgetFloor], [DefaultBudgetBurst]):
	// retries add at most 10% to the requests, plus one a second, with a burst of 10.
	// A client that sends many requests at once to a server that fails them all may
	// want a larger burst (client.NewBudget(0.1, 1, 100)).
	Budget *Budget

	// MaxAttempts is the most attempts of one logical request that reached the server
	// or may have (the first and the http.Transport's re-sends included): with 1, a
	// POST is sent once, unless the server answers 409 request_in_progress (a wait:
	// the retry is a replay or another 409, never a second execution). Attempts
	// whose connection could not be made and answers 409 request_in_progress do not
	// count (MaxWait bounds them). Defaults to [DefaultMaxAttempts] when 0.
	MaxAttempts int

	// MaxWait bounds how long a request waits for a server that refuses its
	// connections and for a key in progress (see [Transport]): no such retry starts
	// more than MaxWait after the request's first attempt, so a server that stays
	// down makes the request give up within MaxWait plus one connection attempt.
	// Keep it longer than the server's restart plus its lease (an idem server's
	// Config.Lease, 30 s by default), which a request in flight when the server
	// crashed waits out. Defaults to [DefaultMaxWait] (60 s) when 0.
	MaxWait time.Duration

	// AttemptTimeout bounds each attempt, from the request's sending to its
	// response's body being closed; an attempt that outlives it is abandoned and
	// retried as a failure (the key makes the retry a replay, or 409 while the server
	// still runs the first). http.Client.Timeout and the request's context bound all
	// the attempts together; this bounds each. It bounds the body of the response
	// RoundTrip returns too: read it promptly. Defaults to 0: no bound of its own
	// (Base's, if any: http.DefaultTransport bounds dialing to 30 s).
	AttemptTimeout time.Duration

	// MaxRetryAfter caps the wait a Retry-After header asks for. Defaults to
	// [DefaultMaxRetryAfter] when 0.
	MaxRetryAfter time.Duration

	// Logger receives a debug line per retry and re-send, and a warning when the
	// budget refuses a retry; repeats of that warning within 10 s are summarised into
	// one line with their count (repeated=N), so that a failing server does not flood
	// the log. It never logs a key or a body. Defaults to [slog.Default].
	Logger *slog.Logger

	// NewKey makes the key of a POST or PATCH that has none. Returning "" sends the
	// request without a key; it is then not retried once it may have reached the
	// server. Defaults to [NewKey].
	NewKey func() string

	once   sync.Once
	budget *Budget
	log    *slog.Logger // Logger, its warnings summarised
}

// NewClient returns an [*http.Client] whose transport is t, or a zero [Transport]
// when t is nil. It panics with a "client: " message when a field of t is invalid.
func NewClient(t *Transport) *http.Client {
	if t == nil {
		t = &Transport{}
	}
	if err := t.validate(); err != nil {
		panic("client: " + err.Error())
	}
	return &http.Client{Transport: t}
}

func (t *Transport) validate() error {
	switch {
	case t.MaxAttempts < 0:
		return fmt.Errorf("Transport.MaxAttempts must not be negative, got %d", t.MaxAttempts)
	case t.MaxRetryAfter < 0:
		return fmt.Errorf("Transport.MaxRetryAfter must not be negative, got %v", t.MaxRetryAfter)
	case t.MaxWait < 0:
		return fmt.Errorf("Transport.MaxWait must not be negative, got %v", t.MaxWait)
	case t.AttemptTimeout < 0:
		return fmt.Errorf("Transport.AttemptTimeout must not be negative, got %v", t.AttemptTimeout)
	}
	return nil
}

// RetryError is the error of a request the [Transport] gave up on. Its message reads
// "<METHOD> <URL> giving up after N attempt(s) in D: <cause>", where the cause names
// the limit that ended the retries and the setting that would have kept them going
// ("Transport.MaxAttempts (5) reached; last attempt: 503 Service Unavailable"), and
// it wraps the last transport error or a [*StatusError] for the last answer, joined
// with [ErrBudgetExhausted] or the context's error when one of those ended the
// retries.
type RetryError struct {
	// Method and URL (password redacted) of the request.
	Method, URL string
	// Attempts is the number of attempts made, re-sends and attempts whose
	// connection could not be made included.
	Attempts int
	// Resends is how many of those attempts were the http.Transport's own re-sends.
	Resends int
	// Elapsed is the time from the first attempt to giving up.
	Elapsed time.Duration
	// Limit names the setting whose limit ended the retries: [LimitMaxAttempts],
	// [LimitBudget] or [LimitMaxWait]; "" when the last answer or error was not to be
	// retried, or the request's context ended.
	Limit string
	// Err is the cause.
	Err error
}

// The settings a [RetryError] names as the limit that ended the retries.
const (
	LimitMaxAttempts = "Transport.MaxAttempts"
	LimitBudget      = "Transport.Budget"
	LimitMaxWait     = "Transport.MaxWait"
)

func (e *RetryError) Error() string {
	return fmt.Sprintf("%s %s giving up after %d attempt(s) in %v: %v", e.Method, e.URL, e.Attempts, e.Elapsed.Round(time.Millisecond), e.Err)
}

// Unwrap returns the cause.
func (e *RetryError) Unwrap() error { return e.Err }

// ErrAttemptTimeout is wrapped by the error of an attempt that outlived
// [Transport.AttemptTimeout].
var ErrAttemptTimeout = errors.New("the attempt outlived Transport.AttemptTimeout")

// StatusError describes an answer that was retried until the [Transport] gave up.
type StatusError struct {
	// StatusCode is the HTTP status of the answer.
	StatusCode int
	// Code is its error code ([ErrorCode]), or "".
	Code string
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("%d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Code != "" {
		s += " (" + e.Code + ")"
	}
	return s
}

type attemptsKey struct{}

// Attempts returns how many attempts the [Transport] made for resp, the
// http.Transport's re-sends included: 1 when the first attempt was answered. The
// count travels in the context of resp.Request (nothing is added on the wire); it is
// 0 for a response that did not come from a Transport. A failed request reports its
// attempts in its [*RetryError].
func Attempts(resp *http.Response) int {
	if resp == nil || resp.Request == nil {
		return 0
	}
	n, _ := resp.Request.Context().Value(attemptsKey{}).(int)
	return n
}

// RoundTrip sends req until an answer is final, a limit ends the retries or req's
// context ends. See [Transport].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.validate(); err != nil {
		closeBody(req)
		return nil, errors.New("client: " + err.Error())
	}
	l, err := t.prepare(req)
	if err != nil {
		return nil, err
	}
	budget := t.theBudget()
	budget.Deposit()
	ctx := req.Context()
	gate := t.resendGate(ctx, l, budget)
	retries := 0
	for {
		r, wire, written, err := l.attempt(ctx, gate)
		if err != nil {
			return nil, l.fail(err, "")
		}
		l.attempts.Add(1)
		l.counted.Add(1)
		admitted := l.resends.Load()
		resp, err := t.send(wire)
		// Re-sends net/http made without asking the gate are counted now, and paid
		// for after the fact.
		if extra := int(written.Load()) - 1 - int(l.resends.Load()-admitted); extra > 0 {
			l.attempts.Add(int32(extra))
			l.counted.Add(int32(extra))
			l.resends.Add(int32(extra))
			budget.charge(extra)
			t.logger().DebugContext(ctx, "client: the http.Transport re-sent the request", "method", req.Method,
				"url", l.url, "resends", extra)
		}
		var refused *resendRefusedError
		if errors.As(err, &refused) {
			return nil, l.fail(refused, refused.limit)
		}
		retry, perr := t.policy()(ctx, r, resp, err)
		switch {
		case perr == nil && !retry && err == nil:
			return withAttempts(resp, r, int(l.attempts.Load())), nil
		case perr == nil && !retry:
			return nil, l.fail(err, "")
		}
		last := err
		if err == nil {
			last = &StatusError{StatusCode: resp.StatusCode, Code: ErrorCode(resp)}
		}
		kind := classify(resp, err)
		if kind == waitRefused || kind == waitInProgress {
			l.counted.Add(-1) // a wait is not an attempt of MaxAttempts
		}
		switch {
		case perr != nil:
			discard(resp)
			return nil, l.fail(joinCause(perr, last), "")
		case ctx.Err() != nil:
			discard(resp)
			return nil, l.fail(joinCause(context.Cause(ctx), last), "")
		case kind != waitRefused && kind != waitInProgress && int(l.counted.Load()) >= t.maxAttempts():
			discard(resp)
			return nil, l.fail(joinCause(fmt.Errorf("%s (%d) reached", LimitMaxAttempts, t.maxAttempts()), last), LimitMaxAttempts)
		}
		wait, err := t.wait(ctx, retries, resp)
		if err == nil && kind == broken && wait < brokenRetryWait {
			wait, err = brokenRetryWait, deadlineAllows(ctx, brokenRetryWait)
		}
		if err != nil {
			discard(resp)
			return nil, l.fail(joinCause(err, last), "")
		}
		discard(resp)
		if kind == waitRefused {
			// The server is down: the connections the request breaks from now on
			// are a restart's of their own, and the first is free again.
			l.freeRetry.Store(false)
		}
		switch {
		case kind == waitRefused || kind == waitInProgress:
			left := time.Until(l.start.Add(t.maxWait()))
			if left <= 0 {
				what := "the server refused connections"
				if kind == waitInProgress {
					what = "the key was still in progress"
				}
				return nil, l.fail(joinCause(fmt.Errorf("%s for %s (%v)", what, LimitMaxWait, t.maxWait()), last), LimitMaxWait)
			}
			wait = min(wait, left) // one last attempt at the bound
		case kind == broken && !l.freeRetry.Swap(true):
			// A broken connection's first retry since the request began, or since
			// it last found the server down: free (see Transport).
		case !budget.Withdraw():
			t.logger().WarnContext(ctx, "client: retry budget exhausted; giving up on a request (raise Transport.Budget: client.NewBudget)",
				"method", req.Method, "url", l.url, "attempts", l.attempts.Load(), "tokens", budget.Tokens())
			return nil, l.fail(joinCause(errBudget, last), LimitBudget)
		}
		retries++
		t.logger().DebugContext(ctx, "client: retrying", "method", req.Method, "url", l.url,
			"attempt", l.attempts.Load()+1, "wait", wait, "cause", last)
		if err := Sleep(ctx, wait); err != nil {
			return nil, l.fail(joinCause(err, last), "")
		}
	}
}

// brokenRetryWait is the least wait before the retry of a broken connection (see
// [Transport]). A server killed with SIGKILL was measured (on two busy cores) to
// reset the connections in flight 0.1 to 4 ms before it stopped accepting new ones;
// 50 ms leaves a margin of ten and more.
const brokenRetryWait = 50 * time.Millisecond

// deadlineAllows reports an error when ctx's deadline comes before a wait of d ends,
// as [Pacing.Delay] does.
func deadlineAllows(ctx context.Context, d time.Duration) error {
	if deadline, ok := ctx.Deadline(); ok && time.Now().Add(d).After(deadline) {
		return fmt.Errorf("%w: the next attempt, in %v, would start after it", context.DeadlineExceeded, d.Round(time.Millisecond))
	}
	return nil
}

// errBudget is the cause of a request whose retry the budget refused: it wraps
// ErrBudgetExhausted and names the setting that would have granted it.
var errBudget = fmt.Errorf("%w (%s; client.NewBudget(ratio, floorPerSecond, burst) sizes it, by default %v%% of requests + %v a second, burst %d)",
	ErrBudgetExhausted, LimitBudget, DefaultBudgetRatio*100, DefaultBudgetFloor, DefaultBudgetBurst)

// attemptKind is how an attempt that is to be retried counts against the limits (see
// [Transport]).
type attemptKind int

const (
	// failure: a 5xx, a 429, a timeout; takes a token, counts in MaxAttempts.
	failure attemptKind = iota
	// broken: the connection failed after the request was, or may have been, sent;
	// the first of a request takes no token.
	broken
	// waitRefused: the connection could not be made; nothing was sent.
	waitRefused
	// waitInProgress: 409 request_in_progress.
	waitInProgress
)

// classify says what kind of retry the attempt that produced resp or err calls for.
func classify(resp *http.Response, err error) attemptKind {
	if err != nil {
		var ne net.Error
		switch {
		case neverSent(err):
			return waitRefused
		case errors.Is(err, ErrAttemptTimeout), errors.As(err, &ne) && ne.Timeout():
			return failure
		}
		return broken
	}
	if resp.StatusCode == http.StatusConflict && ErrorCode(resp) == "request_in_progress" {
		return waitInProgress
	}
	return failure
}

// send sends one attempt through Base, bounded by AttemptTimeout when it is set: the
// bound runs until the response's body is closed.
func (t *Transport) send(wire *http.Request) (*http.Response, error) {
	if t.AttemptTimeout <= 0 {
		return t.base().RoundTrip(wire)
	}
	ctx, cancel := context.WithTimeoutCause(wire.Context(), t.AttemptTimeout, ErrAttemptTimeout)
	resp, err := t.base().RoundTrip(wire.WithContext(ctx))
	if err != nil {
		switch {
		case !errors.Is(context.Cause(ctx), ErrAttemptTimeout):
		case errors.Is(err, ErrAttemptTimeout): // net/http returned the cause itself
			err = fmt.Errorf("%w (%v)", ErrAttemptTimeout, t.AttemptTimeout)
		default:
			err = fmt.Errorf("%w (%v): %w", ErrAttemptTimeout, t.AttemptTimeout, err)
		}
		cancel()
		return nil, err
	}
	body := &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	if w, ok := resp.Body.(io.Writer); ok { // a 101's: its caller writes to it
		resp.Body = cancelOnCloseRW{body, w}
	} else {
		resp.Body = body
	}
	return resp, nil
}

// cancelOnClose is a response body whose attempt's context ends when it is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// cancelOnCloseRW is cancelOnClose for a body the caller also writes to.
type cancelOnCloseRW struct {
	*cancelOnClose
	io.Writer
}

// resendGate returns the Request.GetBody of a logical request's attempts. net/http
// calls it before it re-sends a request with a body on its own (a reused connection
// failed), and re-sends only when it returns a body: the gate admits the re-send when
// the request has an attempt left and the budget a token, and takes both first.
// Otherwise it returns a [*resendRefusedError], which net/http returns as the
// attempt's error.
func (t *Transport) resendGate(ctx context.Context, l *logical, budget *Budget) func() (io.ReadCloser, error) {
	return func() (io.ReadCloser, error) {
		if n := int(l.counted.Load()); n >= t.maxAttempts() {
			return nil, &resendRefusedError{limit: LimitMaxAttempts,
				cause: fmt.Errorf("it would be attempt %d of at most %d (%s)", n+1, t.maxAttempts(), LimitMaxAttempts)}
		}
		// A re-send follows a broken connection, and waits as its retry would.
		if err := deadlineAllows(ctx, brokenRetryWait); err != nil {
			return nil, err
		}
		if err := Sleep(ctx, brokenRetryWait); err != nil {
			return nil, err
		}
		// A re-send follows a broken connection: the request's first is free (and
		// its first since it last found the server down).
		if l.freeRetry.Swap(true) && !budget.Withdraw() {
			t.logger().WarnContext(ctx, "client: retry budget exhausted; the http.Transport's re-send is refused (raise Transport.Budget: client.NewBudget)",
				"method", l.req.Method, "url", l.url, "attempts", l.attempts.Load(), "tokens", budget.Tokens())
			return nil, &resendRefusedError{limit: LimitBudget, cause: errBudget}
		}
		l.attempts.Add(1)
		l.counted.Add(1)
		l.resends.Add(1)
		t.logger().DebugContext(ctx, "client: admitting the http.Transport's re-send", "method", l.req.Method,
			"url", l.url, "attempt", l.attempts.Load())
		return l.getBody()
	}
}

// resendRefusedError is the error of an attempt whose re-send by the http.Transport
// the gate refused: the request went out on a reused connection that then failed,
// and may or may not have reached the server.
type resendRefusedError struct {
	cause error
	limit string // the setting that refused it
}

func (e *resendRefusedError) Error() string {
	return "a reused connection failed, and the http.Transport's re-send is refused: " + e.cause.Error()
}

func (e *resendRefusedError) Unwrap() error { return e.cause }

// wait returns the wait before the next attempt: the answer's Retry-After (capped
// by MaxRetryAfter) or the backoff, or an error when it would end after the
// context's deadline ([Pacing.Delay]).
func (t *Transport) wait(ctx context.Context, retries int, resp *http.Response) (time.Duration, error) {
	hint, hinted := retryAfter(resp, time.Now())
	return Pacing{Backoff: t.Backoff, MaxRetryAfter: t.MaxRetryAfter}.Delay(ctx, retries, resp, hint, hinted)
}

// joinCause wraps why the retries ended together with the last attempt's outcome.
func joinCause(why, last error) error {
	if last == nil || errors.Is(last, why) {
		return why
	}
	return fmt.Errorf("%w; last attempt: %w", why, last)
}

// withAttempts sets resp.Request to the attempt's request r (with the key under its
// canonical name), recording the attempt count in its context.
func withAttempts(resp *http.Response, r *http.Request, attempts int) *http.Response {
	resp.Request = r.WithContext(context.WithValue(r.Context(), attemptsKey{}, attempts))
	return resp
}

// discard drains (up to maxDrain) and closes a response that is not returned, so
// that its connection can be reused.
func discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	_ = resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

func (t *Transport) theBudget() *Budget {
	t.setUp()
	if t.Budget != nil {
		return t.Budget
	}
	return t.budget
}

// setUp makes, on first use, the default budget and the summarising logger.
func (t *Transport) setUp() {
	t.once.Do(func() {
		if t.Budget == nil {
			t.budget = NewBudget(DefaultBudgetRatio, DefaultBudgetFloor, DefaultBudgetBurst)
		}
		base := t.Logger
		if base == nil {
			base = slog.Default()
		}
		t.log = slog.New(logsummary.New(base.Handler(), 0))
	})
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func (t *Transport) policy() RetryPolicy {
	if t.Policy != nil {
		return t.Policy
	}
	return DefaultRetryPolicy
}

func (t *Transport) maxAttempts() int {
	if t.MaxAttempts > 0 {
		return t.MaxAttempts
	}
	return DefaultMaxAttempts
}

func (t *Transport) logger() *slog.Logger {
	t.setUp()
	return t.log
}

func (t *Transport) maxWait() time.Duration {
	if t.MaxWait > 0 {
		return t.MaxWait
	}
	return DefaultMaxWait
}

// logical is one call of RoundTrip: the caller's request with its key and its body,
// replayed on every attempt.
type logical struct {
	req     *http.Request
	url     string
	key     string // added by the Transport; "" when the request had one or gets none
	getBody func() (io.ReadCloser, error)
	length  int64

	// start is when the first attempt began (MaxWait counts from it).
	start time.Time

	// attempts and resends count what was sent, re-sends included, and counted the
	// attempts of MaxAttempts (the waits left out); the re-send gate updates them
	// from whichever goroutine the http.Transport calls it on. freeRetry is set once
	// the request's free retry after a broken connection is spent, and cleared when
	// an attempt finds connections refused.
	attempts, resends, counted atomic.Int32
	freeRetry                  atomic.Bool
}

// prepare reads req's body once (unless GetBody can rebuild it) and picks its key.
func (t *Transport) prepare(req *http.Request) (*logical, error) {
	l := &logical{req: req, url: req.URL.Redacted(), start: time.Now()}
	if err := l.bufferBody(); err != nil {
		return nil, fmt.Errorf("client: %s %s: reading the request body: %w", req.Method, l.url, err)
	}
	if (req.Method == http.MethodPost || req.Method == http.MethodPatch) && len(req.Header.Values(HeaderKey)) == 0 {
		newKey := t.NewKey
		if newKey == nil {
			newKey = NewKey
		}
		l.key = newKey()
	}
	return l, nil
}

func (l *logical) bufferBody() error {
	req := l.req
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	defer req.Body.Close()
	if req.GetBody != nil {
		l.getBody, l.length = req.GetBody, req.ContentLength
		return nil
	}
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return err
	}
	l.getBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	l.length = int64(len(b))
	return nil
}

// attempt returns the request of one attempt: a clone of the caller's with the key,
// a fresh copy of the body and a trace counting the requests written. It returns it
// twice: r as the policy and the caller see it, and wire, as Base sends it. With a
// body, wire is r, and its GetBody is gate, which net/http calls before re-sending
// it. Without one, wire carries the idempotency key under its lower-case name, so
// that net/http does not re-send it on its own (see [Transport]).
func (l *logical) attempt(ctx context.Context, gate func() (io.ReadCloser, error)) (r, wire *http.Request, written *atomic.Int32, err error) {
	// A counter per attempt: a late hook of one attempt must not count in the next.
	written = new(atomic.Int32)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { written.Add(1) },
	})
	r = l.req.Clone(ctx)
	if l.key != "" {
		r.Header.Set(HeaderKey, l.key)
	}
	if l.getBody == nil {
		return r, unreplayable(r), written, nil
	}
	body, err := l.getBody()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("rebuilding the request body: %w", err)
	}
	r.Body, r.ContentLength, r.GetBody = body, l.length, gate
	return r, r, written, nil
}

// replayableHeaders are the header map entries that make net/http re-send a request
// on its own, whatever its method (see http.Transport).
var replayableHeaders = [...]string{HeaderKey, "X-Idempotency-Key"}

// unreplayable returns r as Base should send it when r has no body: when net/http
// would re-send it only because of its idempotency key, a shallow copy whose key
// entries are renamed to lower case, which net/http does not look for but sends (and
// servers read) all the same.
func unreplayable(r *http.Request) *http.Request {
	if idempotentToNetHTTP(r.Method) {
		return r
	}
	var h http.Header
	for _, name := range replayableHeaders {
		v, ok := r.Header[name]
		if !ok {
			continue
		}
		if h == nil {
			h = r.Header.Clone()
		}
		delete(h, name)
		h[strings.ToLower(name)] = v
	}
	if h == nil {
		return r
	}
	wire := *r
	wire.Header = h
	return &wire
}

// idempotentToNetHTTP reports whether net/http re-sends a body-less request of method
// on its own, key or not.
func idempotentToNetHTTP(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// fail returns the RetryError of giving up with err, at limit (a Limit… name, or "").
func (l *logical) fail(err error, limit string) error {
	return &RetryError{Method: l.req.Method, URL: l.url, Attempts: int(l.attempts.Load()), Resends: int(l.resends.Load()),
		Elapsed: time.Since(l.start), Limit: limit, Err: err}
}
