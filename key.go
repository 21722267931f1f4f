package idem

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// keyByte marks the bytes a key may contain: visible ASCII without '"', ',' and '\'
// ([\x21\x23-\x2B\x2D-\x5B\x5D-\x7E]). Excluding exactly the bytes that an RFC 8941
// String must escape or that separate list members makes the bare and the quoted form
// name the same set of keys.
var keyByte = func() (t [256]bool) {
	for c := 0x21; c <= 0x7e; c++ {
		t[c] = c != '"' && c != ',' && c != '\\'
	}
	return t
}()

// ParseKey returns the idempotency key carried by values, the request's
// Idempotency-Key header values (r.Header.Values("Idempotency-Key")), per SPEC §3.
//
// There must be exactly one header. A value that starts with '"' is an RFC 8941 String
// (the form the IETF draft writes) and the key is its content; parameters, lists and
// anything after the closing quote are refused. Any other value is the key itself.
// Surrounding spaces and tabs are ignored, as HTTP does. The key must consist of
// minLen to [MaxKeyLength] bytes of visible ASCII other than '"', ',' and '\', so both
// forms name exactly the same keys; minLen below 1 counts as 1.
//
// ParseKey returns [ErrKeyRequired] when values is empty, and otherwise an error wrapping
// [ErrKeyInvalid] that says what is wrong (positions count bytes of the trimmed header
// value from 1). The error never contains the key. A valid key is returned without
// copying: it shares memory with values[0].
func ParseKey(values []string, minLen int) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyRequired
	case 1:
	case 2:
		return "", fmt.Errorf("%w: two Idempotency-Key headers, exactly one allowed", ErrKeyInvalid)
	default:
		return "", fmt.Errorf("%w: %d Idempotency-Key headers, exactly one allowed", ErrKeyInvalid, len(values))
	}
	v := trimOWS(values[0])
	if v == "" {
		return "", fmt.Errorf("%w: empty value", ErrKeyInvalid)
	}
	key, offset := v, 0
	if v[0] == '"' {
		var err error
		if key, err = unquoteKey(v); err != nil {
			return "", err
		}
		offset = 1
	}
	if err := checkKey(key, offset, minLen); err != nil {
		return "", err
	}
	return key, nil
}

// trimOWS removes the optional whitespace (SP and HTAB) that HTTP allows around a field
// value. net/http already trims received headers; callers passing their own values may not.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// unquoteKey parses v, which starts with '"', as an RFC 8941 String (§4.2.5) that must be
// the whole field value, and returns its content. The content is a substring of v: an
// escape would be needed only for '"' or '\', which no key may contain, so a valid key
// never needs unescaping.
func unquoteKey(v string) (string, error) {
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			if i+1 < len(v) && (v[i+1] == '"' || v[i+1] == '\\') {
				return "", fmt.Errorf("%w: escaped %q at position %d; keys cannot contain '\"' or '\\'", ErrKeyInvalid, v[i+1], i+1)
			}
			return "", fmt.Errorf("%w: invalid escape in quoted string at position %d", ErrKeyInvalid, i+1)
		case c == '"':
			if rest := v[i+1:]; rest != "" {
				return "", trailerError(rest, i+2)
			}
			return v[1:i], nil
		case c < 0x20 || c >= 0x7f:
			return "", byteError(c, i+1)
		}
	}
	return "", fmt.Errorf("%w: quoted string has no closing quote", ErrKeyInvalid)
}

// trailerError explains what follows the closing quote of a quoted key.
func trailerError(rest string, pos int) error {
	switch rest = trimOWS(rest); {
	case rest[0] == ';':
		return fmt.Errorf("%w: parameters are not allowed (';' at position %d)", ErrKeyInvalid, pos)
	case rest[0] == ',':
		return fmt.Errorf("%w: a list is not allowed (',' at position %d), send one key", ErrKeyInvalid, pos)
	default:
		return fmt.Errorf("%w: unexpected data after the closing quote at position %d", ErrKeyInvalid, pos)
	}
}

// checkKey checks the key's bytes and length. offset is the position of the key's first
// byte in the header value, minus one, so errors point into the value as sent.
func checkKey(key string, offset, minLen int) error {
	for i := 0; i < len(key); i++ {
		if c := key[i]; !keyByte[c] {
			return byteError(c, offset+i+1)
		}
	}
	minLen = max(minLen, 1)
	switch {
	case len(key) < minLen:
		return fmt.Errorf("%w: key is %d characters, at least %d required", ErrKeyInvalid, len(key), minLen)
	case len(key) > MaxKeyLength:
		return fmt.Errorf("%w: key is %d characters, at most %d allowed", ErrKeyInvalid, len(key), MaxKeyLength)
	}
	return nil
}

// byteError describes a byte that no key may contain. It names the byte, never the key.
func byteError(c byte, pos int) error {
	var what string
	switch {
	case c < 0x20:
		what = fmt.Sprintf("control character 0x%02X", c)
	case c == 0x7f:
		what = "control character DEL (0x7F)"
	case c >= 0x80:
		what = fmt.Sprintf("non-ASCII byte 0x%02X", c)
	case c == ' ':
		what = "space"
	case c == ',':
		what = "',' (a list?)"
	default:
		what = fmt.Sprintf("%q", c)
	}
	return fmt.Errorf("%w: %s at position %d", ErrKeyInvalid, what, pos)
}

// keyHash identifies a key in logs without revealing it.
func keyHash(scope, key string) string {
	sum := sha256.Sum256([]byte(scope + "\x00" + key))
	return hex.EncodeToString(sum[:6])
}
