package idem

import "sync/atomic"

// retryRate estimates, for one route, how often a request finds its key recorded
// already (a replay, a duplicate in flight, a reused key), so that the route reads the
// key first only while that pays (SPEC §7): a ClaimInHandler route before its handler,
// a lease route before its claim, whose statement costs a replay more than a plain
// read does (issue 31). Reading first
// answers a retry from one primary-key read, without running the handler; but it costs
// every new key that read beside its transaction (on PostgreSQL, measured with
// benchtool: the README's path at 0.54× plain with the read, 0.75× without). A route
// that mostly sees new keys therefore goes straight to the handler, whose transaction
// finds a recorded key itself, and one that sees retries often reads first; nobody has
// to tell it which it is.
//
// The estimate is an exponentially weighted mean of the requests' outcomes (1: the key
// was there), weight 1/32 each, kept in fixed point in one word. The route reads
// first once it passes 1/4 and stops again under 1/8: about where a read costs what it
// saves (a retry answered without the read costs the handler, its aborted transaction
// and the usual claim).
type retryRate struct {
	// v is the mean, scaled by rateOne, in its low 62 bits; bit 63 says that the route
	// reads first.
	v atomic.Uint64
}

const (
	rateOne     = 1 << 20
	rateShift   = 5 // weight 1/32
	rateEnter   = rateOne / 4
	rateLeave   = rateOne / 8
	rateReading = 1 << 63
)

// readFirst reports whether the route reads the key before its handler.
func (r *retryRate) readFirst() bool { return r.v.Load()&rateReading != 0 }

// observe adds one request's outcome: whether its key was recorded already.
func (r *retryRate) observe(found bool) {
	for {
		old := r.v.Load()
		mean := old &^ rateReading
		var x uint64
		if found {
			x = rateOne
		}
		mean = mean - mean>>rateShift + x>>rateShift
		reading := old&rateReading != 0
		switch {
		case !reading && mean > rateEnter:
			reading = true
		case reading && mean < rateLeave:
			reading = false
		}
		next := mean
		if reading {
			next |= rateReading
		}
		if r.v.CompareAndSwap(old, next) {
			return
		}
	}
}
