package idem

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Profile chooses the shape of the error bodies the middleware writes (SPEC §9).
type Profile int

const (
	// ProfileSeed writes Stripe's error shape, as the design note does:
	//
	//	{"error": {"type": "idempotency_error", "code": "key_reused", "message": "..."}}
	//
	// with Content-Type application/json, and answers key_reused with 409.
	ProfileSeed Profile = iota
	// ProfileIETF writes RFC 9457 problem details (application/problem+json) whose
	// type is [Config.ProblemTypeBase] followed by the code, with title, status,
	// detail and a code member, and answers key_reused with 422 as the IETF draft does.
	ProfileIETF
)

// String returns "seed" or "ietf".
func (p Profile) String() string {
	switch p {
	case ProfileSeed:
		return "seed"
	case ProfileIETF:
		return "ietf"
	}
	return fmt.Sprintf("Profile(%d)", int(p))
}

// ParseProfile parses "seed" or "ietf", as a --profile flag takes them.
func ParseProfile(s string) (Profile, error) {
	switch strings.ToLower(s) {
	case "seed":
		return ProfileSeed, nil
	case "ietf":
		return ProfileIETF, nil
	}
	return 0, fmt.Errorf("idem: unknown profile %q (want seed or ietf)", s)
}

func (p Profile) valid() bool { return p == ProfileSeed || p == ProfileIETF }

// The error codes of SPEC §9. Every error the middleware writes carries one of them, in
// both profiles, so clients classify answers by code rather than by status.
const (
	// CodeKeyRequired (400): the route requires an Idempotency-Key and none was sent.
	CodeKeyRequired = "key_required"
	// CodeKeyInvalid (400): the Idempotency-Key header is malformed, empty or repeated.
	CodeKeyInvalid = "key_invalid"
	// CodeScopeRequired (401): the request has no authenticated principal to scope
	// the key to.
	CodeScopeRequired = "scope_required"
	// CodeKeyReused (409 seed, 422 ietf): the key was used with different request
	// parameters. Final: retrying cannot succeed.
	CodeKeyReused = "key_reused"
	// CodeRequestInProgress (409 with Retry-After): a request with this key is still
	// executing. Retry later.
	CodeRequestInProgress = "request_in_progress"
	// CodeResponseNotStored (409): the operation completed but its response was
	// streamed or too large to keep, so it cannot be replayed. Final.
	CodeResponseNotStored = "response_not_stored"
	// CodeBodyTooLarge (413): the request body exceeds Config.MaxBodyBytes.
	CodeBodyTooLarge = "body_too_large"
	// CodeBodyUnreadable (400): reading the request body failed before it ended
	// (typically the client went away). SPEC §9 is silent on this case; nothing is stored.
	CodeBodyUnreadable = "body_unreadable"
	// CodeQuotaExceeded (429 with Retry-After): the request's scope (principal)
	// reached a bound of its own (SPEC §19): MaxInFlightPerScope keyed requests under
	// way, or MaxStoredBytesPerScope bytes of responses stored in the window. Nothing
	// was claimed; retry after Retry-After.
	CodeQuotaExceeded = "quota_exceeded"
	// CodeStoreUnavailable (503 with Retry-After): the store could not be reached, or
	// the completion of the record did not commit. Retry later.
	CodeStoreUnavailable = "store_unavailable"
	// CodeOutcomeUnknown (500): the request's holder died under the route policy
	// [LapseUnknown], so whether its operation's effects happened is unknown (SPEC
	// §5.3, §13). Stored: every retry gets it until an operator resolves the key.
	// Final: clients do not retry it.
	CodeOutcomeUnknown = "outcome_unknown"
	// CodeInternalError (500): the handler misused a SPEC §7 helper (its transaction
	// was to commit with a response it had not written yet, [ErrNoResponse]; or it
	// answered nothing at all on a [RouteOptions.ClaimInHandler] route). Nothing
	// was stored and nothing committed, so a retry executes afresh; the middleware
	// logs the mistake at error level. SPEC §9 is silent on this case.
	CodeInternalError = "internal_error"

	// DefaultProblemTypeBase is the base URI of the problem types of [ProfileIETF]:
	// the type of an error is this base followed by its code, such as
	// "https://idem.dev/problems/key_reused".
	DefaultProblemTypeBase = "https://idem.dev/problems/"
)

// seedErrorType is the "type" member of every idem error in the seed profile, as
// Stripe names its idempotency errors.
const seedErrorType = "idempotency_error"

type codeInfo struct {
	status  int
	title   string
	message string
}

var codes = map[string]codeInfo{
	CodeKeyRequired:       {http.StatusBadRequest, "Idempotency key required", "An Idempotency-Key header is required for this request."},
	CodeKeyInvalid:        {http.StatusBadRequest, "Idempotency key invalid", "The Idempotency-Key header is invalid."},
	CodeScopeRequired:     {http.StatusUnauthorized, "Authentication required", "Idempotency keys require an authenticated request."},
	CodeKeyReused:         {http.StatusConflict, "Idempotency key reused", "Idempotency key already used with different request parameters."},
	CodeRequestInProgress: {http.StatusConflict, "Request in progress", "A request with this idempotency key is still in progress; retry later."},
	CodeResponseNotStored: {http.StatusConflict, "Response not stored", "The request with this idempotency key completed, but its response was not stored and cannot be replayed."},
	CodeBodyTooLarge:      {http.StatusRequestEntityTooLarge, "Request body too large", "The request body is too large."},
	CodeBodyUnreadable:    {http.StatusBadRequest, "Request body unreadable", "The request body could not be read."},
	CodeQuotaExceeded:     {http.StatusTooManyRequests, "Quota exceeded", "Too many requests of this principal are in progress, or its stored responses reached their bound; retry later."},
	CodeStoreUnavailable:  {http.StatusServiceUnavailable, "Idempotency store unavailable", "The idempotency store is unavailable; retry later."},
	CodeInternalError:     {http.StatusInternalServerError, "Internal error", "The server could not complete this request; nothing was stored, and a retry executes it afresh."},
	CodeOutcomeUnknown:    {http.StatusInternalServerError, "Outcome unknown", "The outcome of the request with this idempotency key is unknown; it will not be executed again until it is resolved. Contact support."},
}

// Status returns the HTTP status of an idem error code in profile p (SPEC §9), or 500
// for a code idem does not define.
func (p Profile) Status(code string) int {
	if code == CodeKeyReused && p == ProfileIETF {
		return http.StatusUnprocessableEntity
	}
	if c, ok := codes[code]; ok {
		return c.status
	}
	return http.StatusInternalServerError
}

// retryable reports whether an answer with code asks the client to come back later,
// which the middleware says with Retry-After.
func retryable(code string) bool {
	return code == CodeRequestInProgress || code == CodeStoreUnavailable || code == CodeQuotaExceeded
}

// Problem is an error response in either profile. Applications use it with
// [WriteProblem] to answer their own errors in the same shape as idem's.
type Problem struct {
	// Status is the HTTP status. Defaults to the status of Code when Code is one of
	// idem's codes, and to 500 otherwise.
	Status int
	// Code is the machine-readable code, such as "key_reused" or an application's
	// "amount_invalid".
	Code string
	// Type is the "type" member of the seed profile (Stripe's error type, such as
	// "invalid_request_error" or "card_error"). The ietf profile ignores it and uses
	// TypeBase followed by Code. Defaults to "idempotency_error".
	Type string
	// Title is the ietf profile's short summary. Defaults to idem's title for its own
	// codes, and to the text of Status otherwise.
	Title string
	// Detail is the explanation for a human: "message" in the seed profile, "detail"
	// in the ietf profile. Defaults to idem's message for its own codes.
	Detail string
	// TypeBase is the ietf profile's base URI of problem types. Defaults to
	// [DefaultProblemTypeBase].
	TypeBase string
}

type seedBody struct {
	Error seedError `json:"error"`
}

type seedError struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

type ietfBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

// WriteError writes the idem error code (one of the Code constants) in profile's shape
// with its SPEC §9 status. detail replaces the code's default message when non-empty;
// it must not contain the key or anything secret. For request_in_progress and
// store_unavailable it sets "Retry-After: 1" unless w already has a Retry-After. r may
// be nil; for a HEAD request no body is written.
func WriteError(w http.ResponseWriter, r *http.Request, profile Profile, code string, detail string) {
	if retryable(code) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	WriteProblem(w, r, profile, &Problem{Status: profile.Status(code), Code: code, Detail: detail})
}

// WriteProblem writes p in profile's shape: a JSON body with Content-Type
// application/json (seed) or application/problem+json (ietf). r may be nil; for a HEAD
// request no body is written.
func WriteProblem(w http.ResponseWriter, r *http.Request, profile Profile, p *Problem) {
	q := p.withDefaults(profile)
	var body any
	contentType := "application/json"
	if profile == ProfileIETF {
		contentType = "application/problem+json"
		body = ietfBody{Type: q.TypeBase + q.Code, Title: q.Title, Status: q.Status, Detail: q.Detail, Code: q.Code}
	} else {
		body = seedBody{Error: seedError{Type: q.Type, Code: q.Code, Message: q.Detail}}
	}
	b, err := json.Marshal(body)
	if err != nil { // only strings and ints: cannot happen
		panic("idem: encoding a problem: " + err.Error())
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Del("Content-Length")
	w.WriteHeader(q.Status)
	if r == nil || r.Method != http.MethodHead {
		_, _ = w.Write(b)
	}
}

func (p *Problem) withDefaults(profile Profile) Problem {
	q := *p
	info, known := codes[q.Code]
	if q.Status == 0 {
		q.Status = profile.Status(q.Code)
	}
	if q.Type == "" {
		q.Type = seedErrorType
	}
	if q.Title == "" {
		q.Title = info.title
		if !known {
			q.Title = http.StatusText(q.Status)
		}
	}
	if q.Detail == "" {
		q.Detail = info.message
	}
	if q.TypeBase == "" {
		q.TypeBase = DefaultProblemTypeBase
	}
	return q
}
