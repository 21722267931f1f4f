package idem_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idem-go/idem"
)

func TestWriteErrorSeedShape(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	idem.WriteError(w, nil, idem.ProfileSeed, idem.CodeKeyReused, "")
	if w.Code != http.StatusConflict {
		t.Errorf("status = %d, want 409", w.Code)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	want := `{"error":{"type":"idempotency_error","code":"key_reused","message":"Idempotency key already used with different request parameters."}}` + "\n"
	if got := w.Body.String(); got != want {
		t.Errorf("body =\n%s\nwant\n%s", got, want)
	}
}

func TestWriteErrorIETFShape(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	idem.WriteError(w, nil, idem.ProfileIETF, idem.CodeKeyReused, "")
	if w.Code != http.StatusUnprocessableEntity {
		t.Errorf("status = %d, want 422", w.Code)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q", ct)
	}
	want := `{"type":"https://idem.dev/problems/key_reused","title":"Idempotency key reused","status":422,"detail":"Idempotency key already used with different request parameters.","code":"key_reused"}` + "\n"
	if got := w.Body.String(); got != want {
		t.Errorf("body =\n%s\nwant\n%s", got, want)
	}
}

func TestErrorStatusesFollowTheTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code       string
		seed, ietf int
	}{
		{idem.CodeKeyRequired, 400, 400},
		{idem.CodeKeyInvalid, 400, 400},
		{idem.CodeScopeRequired, 401, 401},
		{idem.CodeKeyReused, 409, 422},
		{idem.CodeRequestInProgress, 409, 409},
		{idem.CodeResponseNotStored, 409, 409},
		{idem.CodeBodyTooLarge, 413, 413},
		{idem.CodeStoreUnavailable, 503, 503},
		{idem.CodeOutcomeUnknown, 500, 500},
	}
	for _, tt := range tests {
		if got := idem.ProfileSeed.Status(tt.code); got != tt.seed {
			t.Errorf("seed %s = %d, want %d", tt.code, got, tt.seed)
		}
		if got := idem.ProfileIETF.Status(tt.code); got != tt.ietf {
			t.Errorf("ietf %s = %d, want %d", tt.code, got, tt.ietf)
		}
	}
}

func TestRetryableErrorsCarryRetryAfter(t *testing.T) {
	t.Parallel()
	for _, code := range []string{idem.CodeRequestInProgress, idem.CodeStoreUnavailable} {
		w := httptest.NewRecorder()
		idem.WriteError(w, nil, idem.ProfileSeed, code, "")
		if got := w.Header().Get("Retry-After"); got != "1" {
			t.Errorf("%s: Retry-After = %q, want 1", code, got)
		}
	}
	w := httptest.NewRecorder()
	idem.WriteError(w, nil, idem.ProfileSeed, idem.CodeKeyReused, "")
	if got := w.Header().Get("Retry-After"); got != "" {
		t.Errorf("key_reused: Retry-After = %q, want none", got)
	}
}

func TestWriteProblemLetsApplicationsUseTheSameShape(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	idem.WriteProblem(w, nil, idem.ProfileSeed, &idem.Problem{
		Status: 400, Code: "amount_invalid", Type: "invalid_request_error", Detail: "Amount must be positive.",
	})
	want := `{"error":{"type":"invalid_request_error","code":"amount_invalid","message":"Amount must be positive."}}` + "\n"
	if w.Code != 400 || w.Body.String() != want {
		t.Errorf("seed: %d %s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	idem.WriteProblem(w, nil, idem.ProfileIETF, &idem.Problem{
		Status: 400, Code: "amount_invalid", Detail: "Amount must be positive.", TypeBase: "https://example.com/p/",
	})
	want = `{"type":"https://example.com/p/amount_invalid","title":"Bad Request","status":400,"detail":"Amount must be positive.","code":"amount_invalid"}` + "\n"
	if w.Code != 400 || w.Body.String() != want {
		t.Errorf("ietf: %d %s", w.Code, w.Body)
	}
}

func TestParseProfile(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]idem.Profile{"seed": idem.ProfileSeed, "ietf": idem.ProfileIETF, "IETF": idem.ProfileIETF} {
		if got, err := idem.ParseProfile(s); err != nil || got != want {
			t.Errorf("ParseProfile(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := idem.ParseProfile("stripe"); err == nil {
		t.Error("ParseProfile(stripe) must fail")
	}
}

// Every error of the ietf profile is an RFC 9457 problem with exactly the documented
// members: type (the base URI plus the code), title, status (the HTTP status), detail
// and code (SPEC §9).
func TestEveryIETFErrorIsAProblemWithTheDocumentedMembers(t *testing.T) {
	t.Parallel()
	for _, code := range []string{idem.CodeKeyRequired, idem.CodeKeyInvalid, idem.CodeScopeRequired, idem.CodeKeyReused,
		idem.CodeRequestInProgress, idem.CodeResponseNotStored, idem.CodeBodyTooLarge, idem.CodeStoreUnavailable, idem.CodeOutcomeUnknown} {
		w := httptest.NewRecorder()
		idem.WriteError(w, nil, idem.ProfileIETF, code, "")
		if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%s: Content-Type %q", code, ct)
		}
		var p map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatalf("%s: %v: %s", code, err, w.Body)
		}
		title, _ := p["title"].(string)
		detail, _ := p["detail"].(string)
		if len(p) != 5 || p["type"] != idem.DefaultProblemTypeBase+code || p["code"] != code ||
			p["status"] != float64(w.Code) || title == "" || detail == "" {
			t.Errorf("%s: problem %s (HTTP %d)", code, w.Body, w.Code)
		}
	}
}
