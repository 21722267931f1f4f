package idemstore

import "fmt"

// LapsePolicy says what a request does when it finds its key in flight with the
// holder's lease lapsed: the holder died, and what it did outside the store may have
// happened (SPEC §5.3, §13).
type LapsePolicy int

const (
	// LapseTakeOver, the zero value, takes the key over and runs the operation again,
	// resuming after its last committed step (SPEC §13): for operations whose foreign
	// effects are deduplicated (a key from idem.Handle.DerivedKey) or absent.
	LapseTakeOver LapsePolicy = iota
	// LapseUnknown answers 500 outcome_unknown (idem.ErrOutcomeUnknown) instead, for
	// operations whose foreign effects cannot be deduplicated: the claim stores that
	// answer in the record, atomically, so that every repeat gets the same one until
	// an operator resolves the key (admin.Store.RecordResolve, `idem keys resolve`):
	// releases it, so that the next request executes afresh, or completes it with a
	// given response. A record whose holder released it after a step committed is
	// still taken over: its holder stopped knowing where it was.
	LapseUnknown
)

// String returns "take_over" or "unknown".
func (p LapsePolicy) String() string {
	switch p {
	case LapseTakeOver:
		return "take_over"
	case LapseUnknown:
		return "unknown"
	}
	return fmt.Sprintf("LapsePolicy(%d)", int(p))
}

// Valid reports whether p is one of the policies above.
func (p LapsePolicy) Valid() bool { return p == LapseTakeOver || p == LapseUnknown }
