package idem

import (
	"fmt"
	"net/http"
	"slices"
)

// DefaultStorePolicy is SPEC §6's default: it stores 2xx, 3xx and the 4xx that are a
// final outcome of the operation (such as 402 card declined), and releases the key for
// the statuses that mean "nothing happened, you may try again": 400, 401, 403, 404,
// 408, 409, 413, 415, 422, 425, 429 and every 5xx.
func DefaultStorePolicy(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden,
		http.StatusNotFound, http.StatusRequestTimeout, http.StatusConflict,
		http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType,
		http.StatusUnprocessableEntity, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// LapsePolicy says what a request does when it finds its key in flight with the
// holder's lease lapsed: the holder died, and what it did outside the store may have
// happened (SPEC §5.3, §13).
type LapsePolicy int

const (
	// LapseTakeOver, the zero value, takes the key over and runs the operation again,
	// resuming after its last committed step (SPEC §13): for operations whose foreign
	// effects are deduplicated (a foreign key from [Handle.ForeignKey]) or absent.
	LapseTakeOver LapsePolicy = iota
	// LapseUnknown answers 500 outcome_unknown ([ErrOutcomeUnknown]) instead, for
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

func (p LapsePolicy) valid() bool { return p == LapseTakeOver || p == LapseUnknown }

// DefaultStoredHeaders are the response headers stored with a response and replayed
// (SPEC §6); [Config.StoredHeaders] adds to them.
var DefaultStoredHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition",
	"Location", "ETag", "Last-Modified", "Link", "Cache-Control", "Vary",
}

// neverStored are headers that must not be replayed: cookies belong to one response,
// Date is the time of the original response, hop-by-hop headers describe one
// connection, and the idempotency headers are set by the middleware itself.
var neverStored = []string{
	"Set-Cookie", "Date", "Connection", "Keep-Alive", "Proxy-Connection",
	"Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Content-Length", "Idempotency-Key", "Idempotent-Replayed",
}

// storedHeaderSet builds the allow-list from the defaults and extra, panicking on a
// header that must never be stored.
func storedHeaderSet(extra []string) map[string]bool {
	set := make(map[string]bool, len(DefaultStoredHeaders)+len(extra))
	for _, h := range DefaultStoredHeaders {
		set[http.CanonicalHeaderKey(h)] = true
	}
	for _, h := range extra {
		c := http.CanonicalHeaderKey(h)
		if slices.Contains(neverStored, c) {
			panic(fmt.Sprintf("idem: Config.StoredHeaders must not contain %s", c))
		}
		set[c] = true
	}
	return set
}
