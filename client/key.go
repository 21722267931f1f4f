package client

import (
	"crypto/rand"
	"encoding/hex"
)

// HeaderKey is the request header that carries the idempotency key.
const HeaderKey = "Idempotency-Key"

// NewKey returns a random UUID version 4 (RFC 9562) from crypto/rand, in its
// 36-character lower-case form, such as "3b241101-e2bb-4255-8caf-4136c566a962". Its
// 122 random bits make a collision between two keys of one principal negligible.
func NewKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])  // never fails (crypto/rand.Read crashes the program instead)
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // variant 10 (RFC 9562)
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}
