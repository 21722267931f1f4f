package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultMaxAttempts is the number of attempts, the first included, after which a
// [Transport] gives up.
const DefaultMaxAttempts = 5

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
// [*RetryError] and closes the last response.
//
// The http.Transport underneath re-sends a request that carries an Idempotency-Key
// on its own when a reused keep-alive connection fails. Each attempt is traced
// ([httptrace.ClientTrace]): a second request written within one attempt is such a
// re-send, and is charged to the Budget and counted as an attempt. A request with a
// body is only made re-sendable (Request.GetBody is set) while the budget can pay
// for a re-send.
type Transport struct {
	// Base sends each attempt. Defaults to [http.DefaultTransport].
	Base http.RoundTripper

	// Policy decides which answers and errors are retried. Defaults to
	// [DefaultRetryPolicy].
	Policy RetryPolicy

	// Backoff is the wait before a retry when the answer has no Retry-After.
	// Defaults to [DefaultBackoff] (exponential from 100ms to 5s, full jitter).
	Backoff Backoff

	// Budget limits the retries of all requests sharing it. Defaults to one budget
	// per Transport, made on first use by NewBudget([DefaultBudgetRatio],
	// [DefaultBudgetFloor], [DefaultBudgetBurst]): retries add at most 10% to the
	// requests, plus one a second, with a burst of 10.
	Budget *Budget

	// MaxAttempts is the most attempts of one logical request, the first and the
	// http.Transport's re-sends included. Defaults to [DefaultMaxAttempts] when 0.
	MaxAttempts int

	// MaxRetryAfter caps the wait a Retry-After header asks for. Defaults to
	// [DefaultMaxRetryAfter] when 0.
	MaxRetryAfter time.Duration

	// Logger receives a debug line per retry and re-send, and a warning when the
	// budget refuses a retry. It never logs a key or a body. Defaults to
	// [slog.Default].
	Logger *slog.Logger

	// NewKey makes the key of a POST or PATCH that has none. Returning "" sends the
	// request without a key; it is then not retried once it may have reached the
	// server. Defaults to [NewKey].
	NewKey func() string

	once   sync.Once
	budget *Budget
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
	}
	return nil
}

// RetryError is the error of a request the [Transport] gave up on. Its message reads
// "<METHOD> <URL> giving up after N attempt(s): <cause>", and it wraps the cause: the
// last transport error or a [*StatusError] for the last answer, joined with
// [ErrBudgetExhausted] or the context's error when one of those ended the retries.
type RetryError struct {
	// Method and URL (password redacted) of the request.
	Method, URL string
	// Attempts is the number of attempts made, re-sends included.
	Attempts int
	// Resends is how many of those attempts were the http.Transport's own re-sends.
	Resends int
	// Err is the cause.
	Err error
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("%s %s giving up after %d attempt(s): %v", e.Method, e.URL, e.Attempts, e.Err)
}

// Unwrap returns the cause.
func (e *RetryError) Unwrap() error { return e.Err }

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

// RoundTrip sends req until an answer is final, the retries are exhausted or req's
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
	budget.deposit()
	ctx := req.Context()
	var attempts, resends, retries int
	for {
		r, written, err := l.attempt(ctx, budget.canCover())
		if err != nil {
			return nil, l.fail(attempts, resends, err)
		}
		resp, err := t.base().RoundTrip(r)
		extra := max(0, int(written.Load())-1)
		attempts += 1 + extra
		if extra > 0 {
			resends += extra
			budget.charge(extra)
			t.logger().DebugContext(ctx, "client: the http.Transport re-sent the request", "method", req.Method,
				"url", l.url, "resends", extra)
		}
		retry, perr := t.policy()(ctx, r, resp, err)
		switch {
		case perr == nil && !retry && err == nil:
			return withAttempts(resp, r, attempts), nil
		case perr == nil && !retry:
			return nil, l.fail(attempts, resends, err)
		}
		last := err
		if err == nil {
			last = &StatusError{StatusCode: resp.StatusCode, Code: ErrorCode(resp)}
		}
		switch {
		case perr != nil:
			discard(resp)
			return nil, l.fail(attempts, resends, joinCause(perr, last))
		case ctx.Err() != nil:
			discard(resp)
			return nil, l.fail(attempts, resends, joinCause(context.Cause(ctx), last))
		case attempts >= t.maxAttempts():
			discard(resp)
			return nil, l.fail(attempts, resends, last)
		}
		wait, err := t.wait(ctx, retries, resp)
		if err != nil {
			discard(resp)
			return nil, l.fail(attempts, resends, joinCause(err, last))
		}
		if !budget.withdraw() {
			discard(resp)
			t.logger().WarnContext(ctx, "client: retry budget exhausted", "method", req.Method, "url", l.url,
				"attempts", attempts, "tokens", budget.Tokens())
			return nil, l.fail(attempts, resends, joinCause(ErrBudgetExhausted, last))
		}
		discard(resp)
		retries++
		t.logger().DebugContext(ctx, "client: retrying", "method", req.Method, "url", l.url,
			"attempt", attempts+1, "wait", wait, "cause", last)
		if err := sleep(ctx, wait); err != nil {
			return nil, l.fail(attempts, resends, joinCause(err, last))
		}
	}
}

// wait returns the wait before the next attempt: the answer's Retry-After (capped
// by MaxRetryAfter) or the backoff. It returns an error wrapping
// context.DeadlineExceeded when the wait would end after the context's deadline,
// since the attempt could not be made in time.
func (t *Transport) wait(ctx context.Context, retries int, resp *http.Response) (time.Duration, error) {
	now := time.Now()
	d, ok := retryAfter(resp, now)
	if ok {
		d = min(d, t.maxRetryAfter())
	} else {
		d = t.backoff()(retries, resp)
	}
	if deadline, ok := ctx.Deadline(); ok && now.Add(d).After(deadline) {
		return d, fmt.Errorf("%w: the next attempt, in %v, would start after it", context.DeadlineExceeded, d.Round(time.Millisecond))
	}
	return d, nil
}

// sleep waits d or until ctx ends, and then returns its cause.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return nil
	}
}

// joinCause wraps why the retries ended together with the last attempt's outcome.
func joinCause(why, last error) error {
	if last == nil || errors.Is(last, why) {
		return why
	}
	return fmt.Errorf("%w; last attempt: %w", why, last)
}

// withAttempts records the attempt count in the context of resp.Request.
func withAttempts(resp *http.Response, r *http.Request, attempts int) *http.Response {
	req := resp.Request
	if req == nil {
		req = r
	}
	resp.Request = req.WithContext(context.WithValue(req.Context(), attemptsKey{}, attempts))
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
	if t.Budget != nil {
		return t.Budget
	}
	t.once.Do(func() { t.budget = NewBudget(DefaultBudgetRatio, DefaultBudgetFloor, DefaultBudgetBurst) })
	return t.budget
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

func (t *Transport) backoff() Backoff {
	if t.Backoff != nil {
		return t.Backoff
	}
	return DefaultBackoff
}

func (t *Transport) maxAttempts() int {
	if t.MaxAttempts > 0 {
		return t.MaxAttempts
	}
	return DefaultMaxAttempts
}

func (t *Transport) maxRetryAfter() time.Duration {
	if t.MaxRetryAfter > 0 {
		return t.MaxRetryAfter
	}
	return DefaultMaxRetryAfter
}

func (t *Transport) logger() *slog.Logger {
	if t.Logger != nil {
		return t.Logger
	}
	return slog.Default()
}

// logical is one call of RoundTrip: the caller's request with its key and its body,
// replayed on every attempt.
type logical struct {
	req     *http.Request
	url     string
	key     string // added by the Transport; "" when the request had one or gets none
	getBody func() (io.ReadCloser, error)
	length  int64
}

// prepare reads req's body once (unless GetBody can rebuild it) and picks its key.
func (t *Transport) prepare(req *http.Request) (*logical, error) {
	l := &logical{req: req, url: req.URL.Redacted()}
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
// a fresh copy of the body and a trace counting the requests written. resendable
// says whether the http.Transport may re-send it on its own (it cannot re-send a
// body without GetBody).
func (l *logical) attempt(ctx context.Context, resendable bool) (*http.Request, *atomic.Int32, error) {
	// A counter per attempt: a late hook of one attempt must not count in the next.
	written := new(atomic.Int32)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { written.Add(1) },
	})
	r := l.req.Clone(ctx)
	if l.key != "" {
		r.Header.Set(HeaderKey, l.key)
	}
	if l.getBody == nil {
		return r, written, nil
	}
	body, err := l.getBody()
	if err != nil {
		return nil, nil, fmt.Errorf("rebuilding the request body: %w", err)
	}
	r.Body, r.ContentLength, r.GetBody = body, l.length, nil
	if resendable {
		r.GetBody = l.getBody
	}
	return r, written, nil
}

func (l *logical) fail(attempts, resends int, err error) error {
	return &RetryError{Method: l.req.Method, URL: l.url, Attempts: attempts, Resends: resends, Err: err}
}
