package idem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/corehooks"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
)

// Sealed records (SPEC §19). With a keyring (GuardConfig.Seal, Config.Seal) the core
// seals, above the store, what a record holds that came from the application — the
// stored response's status, headers and body, and the results its steps saved — bound
// to the record (scope, key, record id), and keys every fingerprint it stores (an
// HMAC, under a version of its own). Every store and every path gets it: the
// completion, the §7 helpers' completions and steps (PrepareCompletion, PrepareStep),
// the claim's and the in-flight wait's reads, the completer's takeovers. A record that
// does not open is never executed again and never answered with other bytes: the
// caller gets ErrRecordUnreadable (500 record_unreadable).

// The MAC secret's records (OpenKeyring) live in idemstore.ReservedScope, which
// Begin and the middleware refuse as a request's scope.

// keyringKey is the key of the MAC secret's generation gen.
func keyringKey(gen int) string { return "mac-secret-" + strconv.Itoa(gen) }

// keyringLease bounds how long processes wait for one that died creating a generation.
const keyringLease = 10 * time.Second

// OpenKeyring returns the keyring that seals the records of store under keys (the
// first seals, all open; SPEC §19), with the store's MAC secret, which keys
// fingerprints and scopes alike in every process that shares the store.
//
// The MAC secret is kept in the store itself, as a reserved record (its scope is
// reserved; its TTL is [MaxTTL]), wrapped under each configured key: it lives and dies
// with the records that depend on it. The first process to open a keyring on a store
// makes it, at random, in one atomic claim (of any number of processes starting at
// once, one makes it and the others read it). Later processes unwrap it with any of
// their keys. When the first key is not among the keys it is wrapped under (a
// rotation: keys "B,A" after "A"), OpenKeyring keeps it anew, wrapped under every
// configured key, as the next generation, so that "B" alone opens it once "A" is
// retired. It never makes a new secret while one is kept: when none of keys opens the
// kept one it fails, naming the keys it is wrapped under (fail closed: a new secret
// would key every retry differently from its record).
//
// It calls each key manager once or twice (to wrap the keyring's data key, and to
// unwrap the secret); ctx bounds the calls and the store's.
func OpenKeyring(ctx context.Context, store idemstore.Store, keys ...seal.KeyWrapper) (*seal.Keyring, error) {
	if store == nil {
		return nil, errors.New("idem: OpenKeyring needs the store")
	}
	if len(keys) == 0 {
		return nil, errors.New("idem: OpenKeyring needs at least one key")
	}
	blob, gen, err := latestSecret(ctx, store)
	if err != nil {
		return nil, err
	}
	var secret []byte
	if gen == 0 {
		secret = seal.NewMACSecret()
		if blob, err = seal.WrapSecret(ctx, secret, keys...); err != nil {
			return nil, err
		}
		kept, err := keepSecret(ctx, store, 1, blob)
		if err != nil {
			return nil, err
		}
		gen = 1
		if string(kept) != string(blob) { // another process made it first
			secret, blob = nil, kept
		}
	}
	if secret == nil {
		if secret, err = seal.UnwrapSecret(ctx, blob, keys...); err != nil {
			return nil, fmt.Errorf("idem: the store's MAC secret (record %q): %w; configure a key it is wrapped under, first or not "+
				"(rotate by adding the new key before the old one, and dropping the old one only once every process runs with both); "+
				"a new secret is never made while one is kept", keyringKey(gen), err)
		}
		ids, _ := seal.SecretKeyIDs(blob)
		if !contains(ids, keys[0].ID()) {
			if blob, err = seal.WrapSecret(ctx, secret, keys...); err != nil {
				return nil, err
			}
			if _, err := keepSecret(ctx, store, gen+1, blob); err != nil {
				return nil, err
			}
		}
	}
	return seal.NewKeyring(ctx, secret, keys...)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// latestSecret reads the MAC secret's generations in order and returns the last one
// kept and its number (0 when there is none). A generation being made is waited for.
func latestSecret(ctx context.Context, store idemstore.Store) (blob []byte, gen int, err error) {
	for g := 1; ; g++ {
		rec, err := store.RecordGet(ctx, &idemstore.GetParams{Scope: idemstore.ReservedScope, Key: keyringKey(g)})
		switch {
		case errors.Is(err, idemstore.ErrNotFound):
			return blob, g - 1, nil
		case err != nil:
			return nil, 0, fmt.Errorf("idem: reading the store's MAC secret: %w", err)
		case rec.State != idemstore.StateCompleted:
			// Being made: its maker's claim completes it, or lapses and is ours.
			if blob, err = keepSecret(ctx, store, g, nil); err != nil {
				return nil, 0, err
			}
		case rec.Response == nil || len(rec.Response.Body) == 0:
			return nil, 0, fmt.Errorf("idem: the store's MAC secret (record %q) is empty", keyringKey(g))
		default:
			blob = rec.Response.Body
		}
	}
}

// keepSecretFingerprint is the fingerprint of the MAC secret's records.
var keepSecretFingerprint = Fingerprint{Version: idemstore.FingerprintVersion, Sum: [32]byte{'i', 'd', 'e', 'm', ' ', 'k', 'e', 'y', 'r', 'i', 'n', 'g'}}

// keepSecret keeps blob as the MAC secret's generation gen, in one atomic claim, and
// returns what the generation holds: blob, or what another process kept first. With
// blob nil it only waits for the generation that another process is making (and, when
// that process died, fails).
func keepSecret(ctx context.Context, store idemstore.Store, gen int, blob []byte) ([]byte, error) {
	for {
		token := newToken()
		res, err := store.RecordClaim(ctx, &idemstore.ClaimParams{
			Scope: idemstore.ReservedScope, Key: keyringKey(gen), Fingerprint: keepSecretFingerprint, Token: token, RecordID: newToken(),
			Lease: keyringLease, TTL: MaxTTL, OnLapse: LapseTakeOver,
		})
		if err != nil {
			return nil, fmt.Errorf("idem: keeping the store's MAC secret: %w", err)
		}
		switch res.Outcome {
		case idemstore.ClaimCompleted:
			if res.Record.Response == nil || len(res.Record.Response.Body) == 0 {
				return nil, fmt.Errorf("idem: the store's MAC secret (record %q) is empty", keyringKey(gen))
			}
			return res.Record.Response.Body, nil
		case idemstore.ClaimMismatch:
			return nil, fmt.Errorf("idem: the store's reserved record %q is not a MAC secret", keyringKey(gen))
		case idemstore.ClaimAcquired:
			if blob == nil {
				_ = store.RecordRelease(ctx, &idemstore.ReleaseParams{Scope: idemstore.ReservedScope, Key: keyringKey(gen), Token: token})
				return nil, fmt.Errorf("idem: the process making the store's MAC secret (record %q) died; open the keyring again", keyringKey(gen))
			}
			err := store.RecordComplete(ctx, &idemstore.CompleteParams{Scope: idemstore.ReservedScope, Key: keyringKey(gen), Token: token,
				Response: &Response{Status: 200, Body: blob}, TTL: MaxTTL})
			if err != nil {
				return nil, fmt.Errorf("idem: keeping the store's MAC secret: %w", err)
			}
			return blob, nil
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("idem: waiting for another process to keep the store's MAC secret: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// keyed returns fp keyed under the guard's keyring: its sum an HMAC of its version
// and sum, its version offset by idemstore.KeyedVersionOffset. A keyed fingerprint, or
// any without a keyring, is returned as it is.
func (g *Guard) keyed(fp Fingerprint) Fingerprint {
	if g.cfg.Seal == nil || fp.Keyed() {
		return fp
	}
	return Fingerprint{Version: idemstore.KeyedVersionOffset + fp.Version, Sum: g.cfg.Seal.FingerprintSum(fp.Version, fp.Sum)}
}

// binding is what h's sealed values are bound to: its scope, key and record id (the
// claimed record's, or for a claim made in the handler's transaction, its own).
func (h *Handle) binding() seal.Binding {
	id := h.claim.RecordID
	if h.claimed != nil {
		id = h.claimed.ID
	}
	return seal.Binding{Scope: h.scope, Key: h.key, RecordID: id}
}

// sealResponse returns resp sealed for b, as a completion stores it: status and flags
// in clear, no headers, the body a sealed value of status, headers and body. A
// response without anything to seal (not stored, outcome unknown) is returned as is.
func sealResponse(k *seal.Keyring, b seal.Binding, resp *Response) (*Response, error) {
	if resp == nil || resp.NotStored || resp.OutcomeUnknown {
		return resp, nil
	}
	body, err := k.Seal(seal.PurposeResponse, b, encodeResponse(resp))
	if err != nil {
		return nil, err
	}
	return &Response{Status: resp.Status, Body: body}, nil
}

// encodeResponse is what a sealed response holds: a version, the status, the headers
// (a count, then each name and its values, length-prefixed) and the body.
func encodeResponse(resp *Response) []byte {
	n := 16 + len(resp.Body)
	for k, v := range resp.Header {
		n += len(k) + 4
		for _, s := range v {
			n += len(s) + 2
		}
	}
	b := make([]byte, 0, n)
	b = append(b, 1)
	b = binary.AppendUvarint(b, uint64(resp.Status))
	b = binary.AppendUvarint(b, uint64(len(resp.Header)))
	for k, v := range resp.Header {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		for _, s := range v {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	return append(b, resp.Body...)
}

// errMalformed is the reason of a sealed response that opened but does not decode.
var errMalformed = errors.New("idem: a sealed response does not decode")

func decodeResponse(b []byte) (*Response, error) {
	if len(b) == 0 || b[0] != 1 {
		return nil, errMalformed
	}
	b = b[1:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	status, ok1 := next()
	headers, ok2 := next()
	if !ok1 || !ok2 || headers > uint64(len(b)) {
		return nil, errMalformed
	}
	resp := &Response{Status: int(status)}
	if headers > 0 {
		resp.Header = make(map[string][]string, headers)
	}
	// One string holds every name and value, and one array every value: a response's
	// headers are a handful. A first pass finds where they end.
	rest, nvalues := b, 0
	for range headers {
		var ok bool
		if rest, ok = skipString(rest); !ok {
			return nil, errMalformed
		}
		nv, n := binary.Uvarint(rest)
		if n <= 0 || nv > uint64(len(rest)) {
			return nil, errMalformed
		}
		rest = rest[n:]
		for range nv {
			if rest, ok = skipString(rest); !ok {
				return nil, errMalformed
			}
		}
		nvalues += int(nv)
	}
	all := string(b[:len(b)-len(rest)])
	values := make([]string, 0, nvalues)
	at := 0
	str := func() string {
		n, k := binary.Uvarint(b[at:])
		s := all[at+k : at+k+int(n)]
		at += k + int(n)
		return s
	}
	for range headers {
		name := str()
		nv, k := binary.Uvarint(b[at:])
		at += k
		first := len(values)
		for range nv {
			values = append(values, str())
		}
		resp.Header[name] = values[first:len(values):len(values)]
	}
	b = rest
	resp.Body = b
	return resp, nil
}

// skipString returns b after the length-prefixed string it starts with.
func skipString(b []byte) ([]byte, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, false
	}
	return b[k+int(n):], true
}

// openResponse opens a response that sealResponse made for b.
func openResponse(ctx context.Context, k *seal.Keyring, b seal.Binding, resp *Response) (*Response, error) {
	plain, err := k.Open(ctx, seal.PurposeResponse, b, resp.Body)
	if err != nil {
		return nil, err
	}
	open, err := decodeResponse(plain)
	switch {
	case err != nil:
		return nil, &seal.UnreadableError{KeyID: seal.KeyIDOf(resp.Body), Reason: "it opens to no response"}
	case open.Status != resp.Status:
		return nil, &seal.UnreadableError{KeyID: seal.KeyIDOf(resp.Body), Reason: "its status was altered in the store"}
	}
	return open, nil
}

func init() {
	corehooks.SealResponse = func(k *seal.Keyring, scope, key, recordID string, resp *Response) (*Response, error) {
		return sealResponse(k, seal.Binding{Scope: scope, Key: key, RecordID: recordID}, resp)
	}
	corehooks.OpenRecord = openRecord
}

// isSealed reports whether rec holds a sealed response or sealed step results.
func isSealed(rec *idemstore.Record) bool {
	return (rec.Response != nil && seal.Sealed(rec.Response.Body)) || seal.Sealed(rec.Steps)
}

// openRecord returns rec with its response and saved step results opened with k
// (admin.OpenRecord): a copy when anything was sealed, rec itself otherwise.
func openRecord(ctx context.Context, k *seal.Keyring, rec *idemstore.Record) (*idemstore.Record, error) {
	resp := rec.Response
	bodySealed := resp != nil && seal.Sealed(resp.Body)
	stepsSealed := seal.Sealed(rec.Steps)
	if k == nil {
		if bodySealed || stepsSealed {
			id := seal.KeyIDOf(rec.Steps)
			if bodySealed {
				id = seal.KeyIDOf(resp.Body)
			}
			return nil, &UnreadableError{KeyID: id, Reason: "it is sealed, and no key is configured"}
		}
		return rec, nil
	}
	if !bodySealed && !stepsSealed {
		if rec.Fingerprint.Keyed() && (hasContent(resp) || len(rec.Steps) > 0) {
			// Made under a keyring, which seals everything: stored in clear since, by
			// someone else.
			return nil, &UnreadableError{Reason: "its fingerprint is keyed, and its content is in clear"}
		}
		return rec, nil
	}
	b := seal.Binding{Scope: rec.Scope, Key: rec.Key, RecordID: rec.ID}
	out := *rec
	if hasContent(resp) {
		if !bodySealed && rec.Fingerprint.Keyed() {
			return nil, &UnreadableError{Reason: "its fingerprint is keyed, and its response is in clear"}
		}
		if bodySealed {
			open, err := openResponse(ctx, k, b, resp)
			if err != nil {
				return nil, unreadable(err)
			}
			out.Response = open
		}
	}
	if len(rec.Steps) > 0 {
		if !stepsSealed && rec.Fingerprint.Keyed() {
			return nil, &UnreadableError{Reason: "its fingerprint is keyed, and its step results are in clear"}
		}
		if stepsSealed {
			steps, err := k.Open(ctx, seal.PurposeSteps, b, rec.Steps)
			if err != nil {
				return nil, unreadable(err)
			}
			out.Steps = steps
		}
	}
	return &out, nil
}

// hasContent reports whether resp holds what a keyring seals.
func hasContent(resp *Response) bool {
	return resp != nil && !resp.NotStored && !resp.OutcomeUnknown
}

// unreadable turns the seal package's error into the core's: an UnreadableError, or
// (a key manager that did not answer) the error as it is.
func unreadable(err error) error {
	var u *seal.UnreadableError
	if errors.As(err, &u) {
		return &UnreadableError{KeyID: u.KeyID, Reason: u.Reason}
	}
	return err
}

// UnreadableError is the error of a record that cannot be opened (SPEC §19): sealed
// under a key that is not configured (or with none configured), altered, or moved from
// another record. It matches [ErrRecordUnreadable]. It never holds the record's
// content.
type UnreadableError struct {
	// KeyID is the key the record says it was sealed under ("" when it does not say).
	KeyID string
	// Reason says what is wrong.
	Reason string
}

func (e *UnreadableError) Error() string {
	s := ErrRecordUnreadable.Error() + ": " + e.Reason
	if e.KeyID != "" {
		s += " (sealed under key " + e.KeyID + ")"
	}
	return s
}

// Is reports whether target is [ErrRecordUnreadable].
func (e *UnreadableError) Is(target error) bool { return target == ErrRecordUnreadable }

// open opens rec, a record of h's key read from the store, with the guard's keyring.
func (h *Handle) open(ctx context.Context, rec *idemstore.Record) (*idemstore.Record, error) {
	g := h.g
	if rec == nil {
		return nil, nil
	}
	if h.sealed && !rec.Fingerprint.Keyed() && g.cfg.Seal != nil {
		// A record in clear while sealing (SPEC §20): honoured within the window only.
		if err := h.honours(rec); err != nil {
			return nil, err
		}
	}
	if !isSealed(rec) {
		if g.cfg.Seal == nil || !rec.Fingerprint.Keyed() || (!hasContent(rec.Response) && len(rec.Steps) == 0) {
			return rec, nil // the hot path: nothing to open
		}
		return openRecord(ctx, g.cfg.Seal, rec) // keyed in clear: refused
	}
	// A data key met for the first time is unwrapped within seal.UnwrapTimeout.
	return openRecord(ctx, g.cfg.Seal, rec)
}

// openFailed logs and reports a record of h's key that did not open, and returns the
// caller's error: ErrRecordUnreadable (the record is never executed again), or a
// *StoreError when the key manager did not answer (retry later). claimed says whether
// h holds the key now (a takeover): it is released, which keeps a record whose
// recovery point advanced.
func (h *Handle) openFailed(ctx context.Context, err error, claimed bool, waited bool, start time.Time) error {
	g := h.g
	if claimed {
		_ = h.release()
	}
	if !errors.Is(err, ErrRecordUnreadable) {
		h.observeClaim(observe.OutcomeStoreError, waited, start, err)
		return g.storeError(ctx, h, "open", err)
	}
	var u *UnreadableError
	keyID := ""
	if errors.As(err, &u) {
		keyID = u.KeyID
	}
	g.cfg.Logger.ErrorContext(ctx, "idem: a record cannot be opened; answering record_unreadable, never executing it again "+
		"(configure the key it was sealed under, or delete the record with idem keys delete once its outcome is known)",
		h.attrs(slog.String("key_id", keyID), slog.Any("error", err))...)
	h.observeClaim(observe.OutcomeUnreadable, waited, start, err)
	return err
}

// OpenStored opens a response that a SPEC §7 helper keeps outside the record, as the
// params of [Handle.PrepareCompletion] carried it (the backstop keeps it in the
// application's database): under a keyring it is sealed for the key's record, and
// opens for any record of h's scope and key (the copy outlives the record it answered
// for). A response in clear is returned as it is. It fails as opening a record does: an [*UnreadableError], or the key manager's error.
func (h *Handle) OpenStored(ctx context.Context, resp *Response) (*Response, error) {
	if resp == nil || !seal.Sealed(resp.Body) || !hasContent(resp) {
		return resp, nil
	}
	if h.g == nil || h.g.cfg.Seal == nil {
		return nil, &UnreadableError{KeyID: seal.KeyIDOf(resp.Body), Reason: "it is sealed, and no key is configured"}
	}
	open, err := openResponse(ctx, h.g.cfg.Seal, seal.Binding{Scope: h.scope, Key: h.key, RecordID: seal.AnyRecord}, resp)
	if err != nil {
		return nil, unreadable(err)
	}
	return open, nil
}
