package payments

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// reply writes a response rendered inside a transaction.
type reply func(w http.ResponseWriter)

// mutation is the writes of one mutating request, which may read before they write:
// it returns the reply they produce.
type mutation func(ctx context.Context, q querier) (reply, error)

// mutate runs fn, the writes of one mutating request, in one transaction and sends the
// reply fn rendered (SPEC §7): the lease path's InTx, for writes that read first or
// follow a foreign call. (A creation whose writes are known goes through write.)
//
// When the transaction is the idempotency store's own and the request holds a key, the
// reply is written inside the transaction, into the middleware's capture, before
// COMMIT: the store's helper then completes the record with exactly that response in
// the same transaction. Otherwise the reply is written only after COMMIT succeeded, so
// that the client never receives a response whose effects did not commit.
func (s *Server) mutate(w http.ResponseWriter, r *http.Request, fn mutation) {
	inside := s.db.CompletesRecords() && idem.FromContext(r.Context()) != nil
	var out reply
	wrote := false
	err := s.db.inTx(r.Context(), func(ctx context.Context, q querier) error {
		var err error
		if out, err = fn(ctx, q); err != nil {
			return err
		}
		if inside {
			out(w)
			wrote = true
		}
		return nil
	})
	switch {
	case err == nil:
		if !wrote {
			out(w)
		}
	case errors.Is(err, idem.ErrAnswered):
		// A ClaimInHandler route's claim found the key taken: the transaction did not
		// run, and the middleware answers (a replay, a refusal).
	case wrote:
		// The COMMIT or the fenced completion failed after the reply went into the
		// capture: the middleware sends 503 store_unavailable instead of it.
		s.logger.WarnContext(r.Context(), "payments: transaction failed after the response was rendered", "err", err)
	case errors.Is(err, errKeyConflict):
		// Another execution of this key is inserting right now (its idempotency record
		// was lost); its outcome is replayed by the backstop on retry.
		idem.WriteError(w, r, s.cfg.Profile, idem.CodeRequestInProgress, "")
	default:
		s.logger.WarnContext(r.Context(), "payments: transaction failed", "err", err)
		writeAPIError(w, errUnavailable())
	}
}

// keyInfo is what an object records of the idempotency key that wrote it: the key, the
// request's fingerprint, and when the key's record expires (unix milliseconds). All nil
// when the request holds no key (none sent, or the middleware is disabled).
type keyInfo struct {
	key, fingerprint *string
	expiresAt        *int64
}

// keyOf returns the key information of a request that arrived at arrival, whose body
// is body; with body nil, its fingerprint is the record's (keyed while the store's
// sealing is in effect, SPEC §19), which a route whose claim was made before its
// handler ran has computed already. The record was claimed just before the handler
// ran, so arrival + TTL is at most a moment after the record's own expiry.
func (s *Server) keyOf(r *http.Request, body []byte, arrival time.Time) keyInfo {
	h := idem.FromContext(r.Context())
	if h == nil {
		return keyInfo{}
	}
	k := h.Key()
	f := h.Fingerprint()
	if body != nil {
		f = idem.FingerprintRequest(r, body)
	}
	fp := formatFingerprint(f)
	exp := arrival.Add(s.ttl).UnixMilli()
	return keyInfo{key: &k, fingerprint: &fp, expiresAt: &exp}
}

// keyExpired reports whether a key whose record expires at expiresAt (nil: no key)
// may start a new operation at now (SPEC §8).
func keyExpired(expiresAt *int64, now time.Time) bool {
	return expiresAt != nil && *expiresAt <= now.UnixMilli()
}

func formatFingerprint(fp idem.Fingerprint) string {
	return fmt.Sprintf("v%d:%x", fp.Version, fp.Sum)
}

// parseFingerprint reads what formatFingerprint wrote; false for anything else.
func parseFingerprint(s string) (idem.Fingerprint, bool) {
	v, sum, ok := strings.Cut(s, ":")
	n, err := strconv.Atoi(strings.TrimPrefix(v, "v"))
	b, herr := hex.DecodeString(sum)
	if !ok || !strings.HasPrefix(v, "v") || err != nil || n < 0 || herr != nil || len(b) != 32 {
		return idem.Fingerprint{}, false
	}
	return idem.Fingerprint{Version: n, Sum: [32]byte(b)}, true
}

// sameRequest reports whether a stored request_fingerprint matches the current one,
// with [idem.Fingerprint.Matches]' rule: fingerprints of different versions are treated
// as matching.
func sameRequest(stored *string, current string) bool {
	if stored == nil {
		return true
	}
	sv, _, _ := strings.Cut(*stored, ":")
	cv, _, _ := strings.Cut(current, ":")
	if sv != cv {
		return true
	}
	return *stored == current
}

// keyReused answers like the middleware does for a key used with other parameters.
func (s *Server) keyReused(r *http.Request) reply {
	return func(w http.ResponseWriter) {
		idem.WriteError(w, r, s.cfg.Profile, idem.CodeKeyReused, "")
	}
}

func jsonReply(status int, body []byte, header ...string) reply {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(header); i += 2 {
			w.Header().Set(header[i], header[i+1])
		}
		writeJSON(w, status, body)
	}
}

const idAlphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newID returns prefix followed by 24 random base-62 characters (~143 bits).
func newID(prefix string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return prefix + string(b)
}

// scope is the authenticated principal of r; authenticate guarantees it.
func scope(r *http.Request) string {
	s, _ := scopeOf(r)
	return s
}

// parseLimit parses a list's limit parameter: 1–1000, default 100.
func parseLimit(v string) (int, *apiError) {
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 || !digits.MatchString(v) {
		return 0, invalid("limit", "must be an integer between 1 and 1000")
	}
	return n, nil
}
