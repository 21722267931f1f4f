package idem

import "github.com/idem-go/idem/idemstore"

// The names of the store's contract that a handler or job author writes. They are
// defined in package idemstore, where store authors find them; these aliases are
// the same types.
type (
	// Response is a response as the store keeps it: [idemstore.Response].
	Response = idemstore.Response
	// Fingerprint identifies the parameters of a request (SPEC §4):
	// [idemstore.Fingerprint].
	Fingerprint = idemstore.Fingerprint
	// LapsePolicy says what a request does when it finds its key in flight with the
	// holder's lease lapsed (SPEC §5.3, §13): [idemstore.LapsePolicy].
	LapsePolicy = idemstore.LapsePolicy
)

// The lapse policies ([idemstore.LapseTakeOver], [idemstore.LapseUnknown]).
const (
	LapseTakeOver = idemstore.LapseTakeOver
	LapseUnknown  = idemstore.LapseUnknown
)
