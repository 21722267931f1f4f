// Package secret hides the passwords of store URLs wherever a URL is printed: the
// command's start line, migrate's and purge's output, and error messages (SPEC §15).
package secret

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
)

// Mask replaces each password in a redacted URL, as [url.URL.Redacted] writes it.
const Mask = "xxxxx"

// RedactURL returns raw with every password in it replaced by [Mask]: the password of
// its userinfo ([url.URL.Redacted]) and the value of every password-like query
// parameter (see [IsSecretParam]), in every store URL form: postgres://,
// redis://, rediss://, redis+cluster://, and sqlite: with a file: URI. A URL with
// nothing to hide is returned as given. A URL that url.Parse refuses (a bad port, say)
// is shown as its scheme only, since where its password starts cannot be known; so is
// an opaque URL with an '@' in it ("user:password@host" without "//" parses as scheme
// "user").
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || strings.Contains(u.Opaque, "@") {
		return schemeOnly(raw)
	}
	query, hidden := redactQuery(u.RawQuery)
	if _, hasPassword := u.User.Password(); !hasPassword && !hidden {
		return raw
	}
	u.RawQuery = query
	return u.Redacted()
}

// RedactURLError returns err with the URL that a *url.Error in its chain quotes
// redacted from its message: url.Parse's errors quote the whole URL, password
// included, and libraries such as go-redis return them as they are. The result
// unwraps to err; an error without a *url.Error is returned as it is.
func RedactURLError(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) || ue.URL == "" {
		return err
	}
	shown := RedactURL(ue.URL)
	quoted := strconv.Quote(ue.URL) // url.Error quotes with %q
	msg := strings.ReplaceAll(err.Error(), quoted[1:len(quoted)-1], shown)
	return &redactedError{msg: strings.ReplaceAll(msg, ue.URL, shown), err: err}
}

// redactedError is an error whose message had a URL redacted.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// IsSecretParam reports whether a query parameter named name (as decoded) holds a
// password: its name contains "pass" (password, sslpassword, passwd, passphrase,
// sentinel_password), "pwd", "secret" or "token", in any case.
func IsSecretParam(name string) bool {
	name = strings.ToLower(name)
	for _, s := range []string{"pass", "pwd", "secret", "token"} {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// redactQuery masks the value of every secret parameter of the raw query q, keeping
// the order and spelling of the rest, and reports whether it masked any.
func redactQuery(q string) (string, bool) {
	if q == "" {
		return q, false
	}
	params := strings.Split(q, "&")
	hidden := false
	for i, p := range params {
		name, _, hasValue := strings.Cut(p, "=")
		decoded, err := url.QueryUnescape(name)
		if err != nil {
			decoded = name
		}
		if hasValue && IsSecretParam(decoded) {
			params[i] = name + "=" + Mask
			hidden = true
		}
	}
	return strings.Join(params, "&"), hidden
}

// schemeOnly shows a URL that does not parse as "scheme://…" (or "scheme:…"), or as
// "(unparseable URL)" when it has no scheme either.
func schemeOnly(raw string) string {
	scheme, rest, ok := strings.Cut(raw, ":")
	if !ok || !validScheme(scheme) {
		return "(unparseable URL)"
	}
	if strings.HasPrefix(rest, "//") {
		return scheme + "://…"
	}
	return scheme + ":…"
}

// validScheme reports whether s is an RFC 3986 scheme: a letter, then letters, digits,
// '+', '-' or '.'.
func validScheme(s string) bool {
	for i, c := range []byte(s) {
		letter := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || !('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return s != ""
}
