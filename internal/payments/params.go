package payments

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// maxAmount is the largest amount accepted, in the currency's smallest unit.
const maxAmount = 99999999

// params are the parameters of a request body, JSON or form-encoded, before they are
// typed. A JSON value keeps its raw bytes so that types are checked exactly (20.5 and
// "2000" are not integers); a form value is always a string (Stripe's wire format).
type params struct {
	json map[string]json.RawMessage
	form url.Values
}

// readParams reads and decodes r's body, refusing a body that is not JSON or form.
func readParams(w http.ResponseWriter, r *http.Request) (*params, []byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, DefaultMaxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, nil, &apiError{status: http.StatusRequestEntityTooLarge, code: "body_too_large", message: "The request body is too large."}
		}
		return nil, nil, &apiError{status: http.StatusBadRequest, code: "body_unreadable", message: "The request body could not be read."}
	}
	ct := r.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	switch {
	case ct == "" && len(bytes.TrimSpace(body)) == 0, mt == "application/x-www-form-urlencoded":
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, nil, &apiError{status: http.StatusBadRequest, code: "body_invalid", message: "The form-encoded body is malformed."}
		}
		return &params{form: form}, body, nil
	case mt == "application/json" || strings.HasSuffix(mt, "+json"):
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil || m == nil {
			return nil, nil, &apiError{status: http.StatusBadRequest, code: "body_invalid", message: "The JSON body must be an object."}
		}
		return &params{json: m}, body, nil
	}
	return nil, nil, &apiError{status: http.StatusUnsupportedMediaType, code: "unsupported_media_type", message: "Send application/json or application/x-www-form-urlencoded."}
}

// money checks that the body has no parameters but amount, currency and others, and
// returns the required amount and currency, in that order of checks.
func (p *params) money(others ...string) (int64, string, *apiError) {
	if err := p.only(append([]string{"amount", "currency"}, others...)...); err != nil {
		return 0, "", err
	}
	amount, err := p.amount("amount")
	if err != nil {
		return 0, "", err
	}
	currency, err := p.currency("currency")
	return amount, currency, err
}

// only refuses any parameter not in allowed, as Stripe does, naming the first unknown
// one in sorted order so that the answer does not depend on map order.
func (p *params) only(allowed ...string) *apiError {
	var unknown []string
	for _, name := range p.names() {
		if !contains(allowed, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return &apiError{status: http.StatusBadRequest, code: "parameter_unknown", param: unknown[0], message: "Received unknown parameter: " + unknown[0]}
}

func (p *params) names() []string {
	var out []string
	if p.json != nil {
		for k := range p.json {
			out = append(out, k)
		}
	}
	for k := range p.form {
		out = append(out, k)
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// raw returns the parameter name: its JSON text or form string, whether it is a
// string, and whether it was sent (a JSON null or an empty form value counts as unset).
func (p *params) raw(name string) (text string, isString bool, present bool, err *apiError) {
	if p.json != nil {
		v, ok := p.json[name]
		if !ok || string(v) == "null" {
			return "", false, false, nil
		}
		if len(v) > 0 && v[0] == '"' {
			var s string
			if json.Unmarshal(v, &s) != nil {
				return "", false, false, invalid(name, "must be a string")
			}
			return s, true, true, nil
		}
		return string(v), false, true, nil
	}
	vs, ok := p.form[name]
	if !ok {
		return "", false, false, nil
	}
	if len(vs) != 1 {
		return "", false, false, invalid(name, "must be given once")
	}
	if vs[0] == "" {
		return "", true, false, nil
	}
	return vs[0], true, true, nil
}

var digits = regexp.MustCompile(`^[0-9]+$`)

// amount returns the required positive integer amount (at most maxAmount). In JSON it
// must be a number without fraction or exponent; in a form, digits only.
func (p *params) amount(name string) (int64, *apiError) {
	text, isString, present, err := p.raw(name)
	switch {
	case err != nil:
		return 0, err
	case !present:
		return 0, &apiError{status: http.StatusBadRequest, code: "parameter_missing", param: name, message: "Missing required param: " + name + "."}
	case p.json != nil && isString:
		return 0, &apiError{status: http.StatusBadRequest, code: "parameter_invalid_integer", param: name, message: "Invalid integer: " + name + " must be a JSON number, not a string."}
	case strings.HasPrefix(text, "-") && digits.MatchString(text[1:]):
		return 0, &apiError{status: http.StatusBadRequest, code: "amount_too_small", param: name, message: "Amount must be a positive integer."}
	case !digits.MatchString(text):
		return 0, &apiError{status: http.StatusBadRequest, code: "parameter_invalid_integer", param: name, message: "Invalid integer: " + truncate(text, 32) + "."}
	}
	n, convErr := strconv.ParseInt(text, 10, 64)
	if convErr != nil || n > maxAmount {
		return 0, &apiError{status: http.StatusBadRequest, code: "amount_too_large", param: name, message: "Amount must be at most 99999999."}
	}
	if n < 1 {
		return 0, &apiError{status: http.StatusBadRequest, code: "amount_too_small", param: name, message: "Amount must be a positive integer."}
	}
	return n, nil
}

// currency returns the required ISO currency code: three ASCII letters, lowercased.
func (p *params) currency(name string) (string, *apiError) {
	s, present, err := p.str(name)
	switch {
	case err != nil:
		return "", err
	case !present:
		return "", &apiError{status: http.StatusBadRequest, code: "parameter_missing", param: name, message: "Missing required param: " + name + "."}
	case len(s) != 3 || !isLetters(s):
		return "", invalid(name, "must be a three-letter ISO currency code")
	}
	return strings.ToLower(s), nil
}

// optionalString returns an optional string of at most maxLen bytes (nil when unset).
func (p *params) optionalString(name string, maxLen int) (*string, *apiError) {
	s, present, err := p.str(name)
	switch {
	case err != nil:
		return nil, err
	case !present:
		return nil, nil
	case len(s) > maxLen:
		return nil, invalid(name, "must be at most "+strconv.Itoa(maxLen)+" characters")
	}
	return &s, nil
}

// str returns a string parameter; a JSON value of another type is refused.
func (p *params) str(name string) (string, bool, *apiError) {
	text, isString, present, err := p.raw(name)
	if err != nil || !present {
		return "", false, err
	}
	if !isString {
		return "", false, &apiError{status: http.StatusBadRequest, code: "parameter_invalid_string", param: name, message: "Invalid string: " + name + " must be a string."}
	}
	return text, true, nil
}

func invalid(name, why string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: "parameter_invalid", param: name, message: "Invalid " + name + ": " + why + "."}
}

func isLetters(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i] | 0x20
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
