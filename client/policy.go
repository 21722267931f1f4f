package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"
)

// MaxErrorPeek is how many bytes of an error response [ErrorCode] reads to find its
// code. idem's error bodies are a few hundred bytes; a longer body is not one of
// them and has no code.
const MaxErrorPeek = 16 << 10

// RetryPolicy decides whether the attempt that produced resp or err is retried. req
// is the attempt's request (it carries the Idempotency-Key the Transport added). A
// non-nil error stops the retries and becomes the cause of the [RetryError].
type RetryPolicy func(ctx context.Context, req *http.Request, resp *http.Response, err error) (bool, error)

// DefaultRetryPolicy retries what an idem server asks to retry and nothing final:
//
//   - connection errors, before or after the request was written (a reply lost after
//     the server committed is replayed, since the key makes the retry a replay), but
//     not TLS certificate errors nor an unsupported URL scheme;
//   - 409 request_in_progress, 429 (quota_exceeded only when its Retry-After is
//     within [DefaultMaxRetryAfter]: a longer wait is the caller's to decide), and
//     5xx other than 501 and outcome_unknown;
//   - never key_reused, response_not_stored, outcome_unknown, nor any other status
//     (400, 401, 403, 404, 422, …).
//
// Answers are classified by their error code in both idem profiles ([ErrorCode]). A
// request that is not idempotent (not GET, HEAD, OPTIONS, TRACE, PUT or DELETE) and
// carries no Idempotency-Key is retried only when it cannot have been sent (its
// connection was never made). After an error it returns the context's cause when ctx
// has ended; an answer is classified even then (a final answer is still returned).
func DefaultRetryPolicy(ctx context.Context, req *http.Request, resp *http.Response, err error) (bool, error) {
	replayable := idempotent(req.Method) || req.Header.Get(HeaderKey) != ""
	if err != nil {
		if ctx.Err() != nil {
			return false, context.Cause(ctx)
		}
		if !replayable && !neverSent(err) {
			return false, nil
		}
		return retryableError(err), nil
	}
	if !replayable {
		return false, nil
	}
	return retryableResponse(resp), nil
}

// idempotent reports whether RFC 9110 calls method idempotent.
func idempotent(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// neverSent reports whether err happened before a connection was made, so that no
// byte of the request can have reached the server.
func neverSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// retryableError reports whether a transport error may go away on another attempt.
func retryableError(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
	)
	if errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) {
		return false
	}
	// net/http's errors for a bad URL or header are unexported; match their text
	// as go-retryablehttp does.
	msg := err.Error()
	return !strings.Contains(msg, "unsupported protocol scheme") && !strings.Contains(msg, "invalid header")
}

// retryableResponse reports whether an answer asks to be retried (SPEC §9, §12).
func retryableResponse(resp *http.Response) bool {
	s := resp.StatusCode
	if s != http.StatusConflict && s != http.StatusTooManyRequests && s < 500 {
		return false
	}
	switch ErrorCode(resp) {
	case "key_reused", "response_not_stored", "outcome_unknown":
		return false
	case "request_in_progress":
		return true
	case "quota_exceeded":
		// The principal reached a bound of its own (SPEC §19): a retry within the
		// server's wait can only get the same answer, so one whose wait is longer
		// than a retry would wait (the rest of a stored-bytes window) is the
		// caller's to decide.
		d, ok := retryAfter(resp, time.Now())
		return !ok || d <= DefaultMaxRetryAfter
	}
	if s == http.StatusTooManyRequests {
		return true
	}
	return s >= 500 && s <= 599 && s != http.StatusNotImplemented
}

// ErrorCode returns the error code of an error response in either idem profile: the
// "code" of {"error": {"code": …}} (seed, Stripe's shape) or the "code" member of an
// application/problem+json body (ietf). It returns "" for a success, a body that is
// not JSON, or one longer than [MaxErrorPeek]. It reads at most MaxErrorPeek+1 bytes
// and puts them back: resp.Body still reads the whole body.
func ErrorCode(resp *http.Response) string {
	if resp == nil || resp.StatusCode < 400 || resp.Body == nil || resp.Body == http.NoBody || !jsonType(resp.Header.Get("Content-Type")) {
		return ""
	}
	prefix, err := io.ReadAll(io.LimitReader(resp.Body, MaxErrorPeek+1))
	resp.Body = &peekedBody{Reader: io.MultiReader(bytes.NewReader(prefix), resp.Body), closer: resp.Body}
	if err != nil || len(prefix) > MaxErrorPeek {
		return ""
	}
	var body struct {
		Code  *string `json:"code"`
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(prefix, &body) != nil {
		return ""
	}
	if body.Error != nil && body.Error.Code != "" {
		return body.Error.Code
	}
	if body.Code != nil {
		return *body.Code
	}
	return ""
}

// jsonType reports whether a Content-Type is JSON: application/json or any +json
// type such as application/problem+json.
func jsonType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}

// peekedBody is a response body whose first bytes were read and put back.
type peekedBody struct {
	io.Reader
	closer io.Closer
}

func (b *peekedBody) Close() error { return b.closer.Close() }
