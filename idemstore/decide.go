package idemstore

import "time"

// Decision is what a claim must do about the record it found (SPEC §5). The state
// machine is pure: stores feed it the record they read together with their own clock and
// carry out its decision atomically (an insert, or a conditional update fenced by the
// old token).
type Decision int

const (
	// DecideClaim: no record, or an expired one (SPEC §5.1, §8). Claim the key afresh:
	// new record id, new created_at, new token and lease.
	DecideClaim Decision = iota
	// DecideTakeOver: in flight, the lease lapsed, same fingerprint (SPEC §5.3). Take the
	// key over with a new token and lease, keeping the record id and created_at.
	DecideTakeOver
	// DecideInFlight: in flight under a live lease (SPEC §5.2): 409 request_in_progress.
	DecideInFlight
	// DecideReplay: completed with the same fingerprint (SPEC §5.4): replay.
	DecideReplay
	// DecideMismatch: a live record with a different fingerprint (SPEC §5.5): key_reused;
	// the record is untouched.
	DecideMismatch
	// DecideUnknown: in flight, its holder's lease lapsed, and the claim's policy is
	// [LapseUnknown] (SPEC §13): complete the record as outcome_unknown, fenced by the
	// old token, instead of taking it over, and answer it. [ClaimParams.Decide]
	// returns it; [Decide] never does.
	DecideUnknown
)

var decisionNames = [...]string{"claim", "take_over", "in_flight", "replay", "mismatch", "unknown"}

func (d Decision) String() string {
	if int(d) < len(decisionNames) {
		return decisionNames[d]
	}
	return "unknown"
}

// Decide says what this claim must do about rec (nil when absent) at the store's time
// now: [Decide]'s decision, except that under the policy [LapseUnknown] a lapsed lease
// whose holder died is [DecideUnknown]. A record whose holder released it after a step
// committed (no holder, its lease ended: SPEC §13) is taken over whatever the policy:
// its holder stopped knowing where it was, and the operation resumes.
func (p *ClaimParams) Decide(rec *Record, now time.Time) Decision {
	d := Decide(rec, p.Fingerprint, now)
	if d == DecideTakeOver && p.OnLapse == LapseUnknown && rec.Token != "" {
		return DecideUnknown
	}
	return d
}

// Decide says what a request fingerprinted fp finds in rec (nil when absent) at the
// store's time now.
func Decide(rec *Record, fp Fingerprint, now time.Time) Decision {
	switch {
	case rec == nil || rec.Expired(now):
		return DecideClaim
	case !fp.Matches(rec.Fingerprint):
		return DecideMismatch
	case rec.State == StateCompleted:
		return DecideReplay
	case rec.LeaseLive(now):
		return DecideInFlight
	default:
		return DecideTakeOver
	}
}
