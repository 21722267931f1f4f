package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/idem-go/idem"
)

// idemAnswer is the response idem's middleware writes for code in profile.
func idemAnswer(profile idem.Profile, code string) *http.Response {
	rec := httptest.NewRecorder()
	idem.WriteError(rec, nil, profile, code, "")
	return rec.Result()
}

// statusAnswer is a response with status and no body.
func statusAnswer(status int) *http.Response {
	rec := httptest.NewRecorder()
	rec.WriteHeader(status)
	return rec.Result()
}

func keyedPost() *http.Request {
	req := httptest.NewRequest(http.MethodPost, "http://api.test/v1/charges", nil)
	req.Header.Set(HeaderKey, "k-0123456789")
	return req
}

// Answers are classified by their code in both profiles: in progress and
// unavailable are retried, final codes never.
func TestDefaultRetryPolicyClassifiesIdemCodesInBothProfiles(t *testing.T) {
	t.Parallel()
	retried := map[string]bool{
		idem.CodeRequestInProgress: true,
		idem.CodeStoreUnavailable:  true,
		idem.CodeQuotaExceeded:     true, // without a Retry-After
		idem.CodeKeyReused:         false,
		idem.CodeResponseNotStored: false,
		idem.CodeOutcomeUnknown:    false, // a 500 that is final
		idem.CodeKeyRequired:       false,
		idem.CodeKeyInvalid:        false,
		idem.CodeScopeRequired:     false,
		idem.CodeBodyTooLarge:      false,
		idem.CodeBodyUnreadable:    false,
	}
	for _, profile := range []idem.Profile{idem.ProfileSeed, idem.ProfileIETF} {
		for code, want := range retried {
			resp := idemAnswer(profile, code)
			if got := ErrorCode(resp); got != code {
				t.Errorf("%v: ErrorCode = %q, want %q", profile, got, code)
			}
			got, err := DefaultRetryPolicy(context.Background(), keyedPost(), resp, nil)
			if got != want || err != nil {
				t.Errorf("%v %d %s: retry = %v, %v; want %v", profile, resp.StatusCode, code, got, err, want)
			}
		}
	}
}

// 429 quota_exceeded (a bound per principal, SPEC §19) is retried when its Retry-After
// is within DefaultMaxRetryAfter; a longer wait (the rest of a stored-bytes window)
// returns the answer to the caller rather than retry early and get it again.
func TestDefaultRetryPolicyRetriesQuotaExceededOnlyWithinItsWait(t *testing.T) {
	t.Parallel()
	for retryAfter, want := range map[string]bool{"1": true, "30": true, "600": false} {
		rec := httptest.NewRecorder()
		rec.Header().Set("Retry-After", retryAfter)
		idem.WriteError(rec, nil, idem.ProfileSeed, idem.CodeQuotaExceeded, "")
		resp := rec.Result()
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("quota_exceeded is %d, want 429", resp.StatusCode)
		}
		if got, err := DefaultRetryPolicy(context.Background(), keyedPost(), resp, nil); got != want || err != nil {
			t.Errorf("Retry-After %s: retry = %v, %v; want %v", retryAfter, got, err, want)
		}
	}
}

// Statuses without an idem code: 429 and 5xx but 501 are retried; 400, 401, 403,
// 404, 422, any other 4xx, 2xx and 3xx are not.
func TestDefaultRetryPolicyClassifiesStatuses(t *testing.T) {
	t.Parallel()
	for status, want := range map[int]bool{
		200: false, 201: false, 204: false, 304: false,
		400: false, 401: false, 402: false, 403: false, 404: false, 409: false, 410: false, 422: false,
		429: true, 500: true, 501: false, 502: true, 503: true, 504: true,
	} {
		got, err := DefaultRetryPolicy(context.Background(), keyedPost(), statusAnswer(status), nil)
		if got != want || err != nil {
			t.Errorf("%d: retry = %v, %v; want %v", status, got, err, want)
		}
	}
	// A payments API error in Stripe's shape is classified by status too.
	rec := httptest.NewRecorder()
	rec.Header().Set("Content-Type", "application/json")
	rec.WriteHeader(http.StatusServiceUnavailable)
	_, _ = rec.WriteString(`{"error":{"type":"api_error","code":"db_unavailable","message":"x"}}`)
	if got, _ := DefaultRetryPolicy(context.Background(), keyedPost(), rec.Result(), nil); !got {
		t.Errorf("503 db_unavailable not retried")
	}
}

// Connection errors are retried for a keyed or idempotent request; a request that is
// not idempotent and has no key is retried only when it was never sent.
func TestDefaultRetryPolicyClassifiesErrors(t *testing.T) {
	t.Parallel()
	var (
		refused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		reset   = &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
		eof     = fmt.Errorf("reading the response: %w", io.EOF)
		cert    = &tls.CertificateVerificationError{Err: errors.New("x509: unknown authority")}
		scheme  = errors.New(`unsupported protocol scheme "ftp"`)
	)
	keylessPost := httptest.NewRequest(http.MethodPost, "http://api.test/v1/charges", nil)
	get := httptest.NewRequest(http.MethodGet, "http://api.test/v1/charges", nil)
	put := httptest.NewRequest(http.MethodPut, "http://api.test/v1/orders/ord_1", nil)
	for _, tc := range []struct {
		name string
		req  *http.Request
		err  error
		want bool
	}{
		{"keyed POST, refused", keyedPost(), refused, true},
		{"keyed POST, reset", keyedPost(), reset, true},
		{"keyed POST, EOF mid-response", keyedPost(), eof, true},
		{"keyed POST, bad certificate", keyedPost(), cert, false},
		{"keyed POST, bad scheme", keyedPost(), scheme, false},
		{"GET, reset", get, reset, true},
		{"PUT, EOF", put, eof, true},
		{"keyless POST, refused", keylessPost, refused, true},
		{"keyless POST, reset", keylessPost, reset, false},
		{"keyless POST, EOF", keylessPost, eof, false},
	} {
		got, err := DefaultRetryPolicy(context.Background(), tc.req, nil, tc.err)
		if got != tc.want || err != nil {
			t.Errorf("%s: retry = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if got, _ := DefaultRetryPolicy(context.Background(), keylessPost, statusAnswer(503), nil); got {
		t.Errorf("keyless POST answered 503 was retried")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if got, err := DefaultRetryPolicy(ctx, keyedPost(), nil, reset); got || !errors.Is(err, context.Canceled) {
		t.Errorf("ended context: retry = %v, %v; want false, context.Canceled", got, err)
	}
}

// ErrorCode reads a bounded prefix of an error body and puts it back: the caller
// reads the same bytes.
func TestErrorCodeRestoresTheBody(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, contentType, body, want string
		status                        int
	}{
		{"seed", "application/json", `{"error":{"type":"idempotency_error","code":"key_reused","message":"m"}}`, "key_reused", 409},
		{"ietf", "application/problem+json", `{"type":"https://idem.dev/problems/key_reused","title":"t","status":422,"code":"key_reused"}`, "key_reused", 422},
		{"charset", "application/json; charset=utf-8", `{"error":{"code":"request_in_progress"}}`, "request_in_progress", 409},
		{"not json", "text/plain", `{"error":{"code":"key_reused"}}`, "", 409},
		{"bad json", "application/json", `{"error":`, "", 409},
		{"success", "application/json", `{"code":"key_reused"}`, "", 200},
		{"too long", "application/json", `{"code":"key_reused","pad":"` + strings.Repeat("x", MaxErrorPeek) + `"}`, "", 409},
	} {
		resp := &http.Response{StatusCode: tc.status, Header: http.Header{"Content-Type": {tc.contentType}},
			Body: io.NopCloser(strings.NewReader(tc.body))}
		if got := ErrorCode(resp); got != tc.want {
			t.Errorf("%s: ErrorCode = %q, want %q", tc.name, got, tc.want)
		}
		if got := ErrorCode(resp); got != tc.want {
			t.Errorf("%s: second ErrorCode = %q, want %q", tc.name, got, tc.want)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.Equal(b, []byte(tc.body)) {
			t.Errorf("%s: body after ErrorCode = %q, %v; want it unchanged", tc.name, b, err)
		}
	}
}
