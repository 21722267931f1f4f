package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
)

// The sealing transitions on a call's path (SPEC §20): which form a call writes, and
// what it does with a record of its key made in the other form — a record in clear
// made before sealing began, or a sealed one made before it ended.
//
// Round trips. Outside the transition windows a call costs what it always did. While
// sealing began less than a TTL ago (and for a TTL after its end):
//   - a new key of a route that keys its scope (Call.KeyScope: idem proxy, idem
//     payments) costs one read more: after the fresh claim under the scope of its form,
//     a read of the key under the other form's scope (plain while sealing, keyed once
//     ended), which finds nothing;
//   - a retry of a record made in the other form costs three more there (that read,
//     the release of the fresh claim, the claim of the record found), and one more on
//     a route whose scope is not keyed (the claim in the other form, after the store
//     answered the first as another fingerprint's).
//
// A route that claims its key in its own transaction (ClaimInHandler) reads the other
// scope before its handler runs, and claims the usual way when a record is there.

// decideForm sets h's form from the store's sealing state as the guard knows it now,
// unless h follows a record of the other form (pinned). A guard without a keyring
// always writes in clear.
func (h *Handle) decideForm() {
	g := h.g
	if g.cfg.Seal == nil || h.pinned {
		return
	}
	h.mode = g.sealState().mode(g.localNow(), max(g.cfg.TTL, h.claim.TTL))
	h.setForm(h.mode.seal)
}

// setForm makes h write the sealed form or the clear one: its scope (when the core
// keys it) and its fingerprint follow.
func (h *Handle) setForm(sealed bool) {
	h.sealed = sealed
	if h.keyScope {
		h.scope = h.plainScope
		if sealed {
			if h.keyedScope == "" {
				h.keyedScope = h.g.cfg.Seal.Scope(h.plainScope)
			}
			h.scope = h.keyedScope
		}
	}
	if h.plainFp != (Fingerprint{}) {
		h.claim.Fingerprint = h.plainFp
		if sealed {
			if h.keyedFp == (Fingerprint{}) {
				h.keyedFp = h.g.keyed(h.plainFp) // one HMAC per call
			}
			h.claim.Fingerprint = h.keyedFp
		}
	}
}

// setFingerprint sets the call's fingerprint as computed: keyed when h writes the
// sealed form. A fingerprint keyed already is kept as it is, and pins h to the
// sealed form (there is no plain one to fall back on).
func (h *Handle) setFingerprint(fp Fingerprint) {
	if fp.Keyed() {
		h.plainFp, h.claim.Fingerprint = Fingerprint{}, fp
		h.pinned, h.sealed = true, true
		return
	}
	h.plainFp = fp
	h.setForm(h.sealed)
}

// pinTo makes h follow a record of the other form: its fingerprint (and scope, when
// the core keys it) become the record's form, and the mode no longer changes them.
// The content h writes is sealed when the record's fingerprint is keyed, or when h
// was sealing anyway (a record in clear completed under sealing is sealed: its
// content is then authenticated).
func (h *Handle) pinTo(keyed bool) {
	sealing := h.sealed
	h.pinned = true
	h.transitions++
	h.setForm(keyed)
	h.sealed = keyed || sealing
}

// initRecord makes h follow rec, a record it resumes (the completer): its scope and
// fingerprint as they are, and its content sealed when rec's fingerprint is keyed or
// the store's sealing is in effect.
func (h *Handle) initRecord(rec *idemstore.Record) {
	h.pinned = true
	h.claim.Fingerprint = rec.Fingerprint
	h.sealed = h.g.cfg.Seal != nil && (rec.Fingerprint.Keyed() || h.mode.seal)
}

// unpin lets the mode decide h's form again: the record h followed is gone.
func (h *Handle) unpin() {
	h.pinned = false
	h.transitions++
	h.decideForm()
}

// maxTransitions bounds the form changes of one call: a record that keeps changing
// under it is answered as the store finds it at the last.
const maxTransitions = 4

// transition looks at what a claim of h found for a record of the other form, and
// says whether to claim again (in the form h now has), or fails the call: a record
// of the other form that h must not honour is unreadable (never executed again,
// never answered), one of another request is key_reused.
func (h *Handle) transition(ctx context.Context, res *idemstore.ClaimResult) (again bool, err error) {
	if h.transitions >= maxTransitions {
		return false, nil
	}
	switch res.Outcome {
	case idemstore.ClaimMismatch:
		rec := res.Record
		if rec == nil || rec.Fingerprint.Keyed() == h.claim.Fingerprint.Keyed() {
			return false, nil
		}
		if err := h.honours(rec); err != nil {
			return false, err
		}
		if !h.sameRequest(rec.Fingerprint) {
			return false, nil // another request's: key_reused
		}
		h.pinTo(rec.Fingerprint.Keyed())
		return true, nil
	case idemstore.ClaimAcquired:
		if res.TookOver || res.Released {
			return false, nil
		}
		if h.pinned {
			// The record followed went away (expired, or deleted) before this claim,
			// which made a new one in its form: never a new record in the old form.
			if err := h.dropFresh(ctx); err != nil {
				return false, err
			}
			h.otherLooked = true
			h.unpin()
			return true, nil
		}
		return h.lookOther(ctx)
	}
	return false, nil
}

// honours says whether h may act on rec, a record of its key in the other form than
// h's claim: nil, or why not (an *UnreadableError).
//
// Under a keyring: a keyed record opens if sealed (openRecord checks that); a record
// in clear is honoured while h writes in clear, and while sealing only within the
// transition window, when made before the handoff — or when its content is sealed (a
// record in clear that a process with the key resumed: the seal authenticates it). A
// record in clear under a keyed scope is never honoured: only a process with the key
// makes that scope, and it makes sealed records there. Without a keyring a keyed
// record is unreadable.
func (h *Handle) honours(rec *idemstore.Record) error {
	g := h.g
	if rec.Fingerprint.Keyed() {
		if g.cfg.Seal == nil {
			return &UnreadableError{KeyID: recordKeyID(rec), Reason: "it was made under a keyring (its fingerprint is keyed), and no key is configured"}
		}
		return nil
	}
	if g.cfg.Seal == nil || !h.sealed {
		return nil
	}
	if h.keyScope && rec.Scope == h.keyedScope && h.keyedScope != "" {
		return &UnreadableError{Reason: "it is in clear under a keyed scope, where only sealed records are made"}
	}
	if isSealed(rec) {
		return nil
	}
	now := g.localNow()
	if h.mode.plainUntil.IsZero() || !now.Before(h.mode.plainUntil) || !rec.CreatedAt.Before(h.mode.plainBefore) {
		return &UnreadableError{Reason: "it is in clear, and sealing began before it was made or longer than a TTL ago"}
	}
	return nil
}

// recordKeyID is the key a record says it was sealed under ("" when it says none).
func recordKeyID(rec *idemstore.Record) string {
	if rec.Response != nil && seal.Sealed(rec.Response.Body) {
		return seal.KeyIDOf(rec.Response.Body)
	}
	return seal.KeyIDOf(rec.Steps)
}

// sameRequest reports whether stored, a fingerprint of the other form than h's
// claim, is the fingerprint of h's request: compared exactly, in its own form (the
// request's plain fingerprint, or that keyed under the guard's keyring). A keyed
// fingerprint of another version than the request's is compared as
// Fingerprint.Matches compares versions (SPEC §4); a plain one must be the very
// fingerprint, version included: a record in clear that could be written by anyone
// who can write the store is never taken to match by its version.
func (h *Handle) sameRequest(stored Fingerprint) bool {
	if h.plainFp == (Fingerprint{}) {
		return false // the call gave a keyed fingerprint: there is no plain one
	}
	if stored.Keyed() {
		if h.g.cfg.Seal == nil {
			return false
		}
		if h.keyedFp == (Fingerprint{}) {
			h.keyedFp = h.g.keyed(h.plainFp)
		}
		return h.keyedFp.Matches(stored)
	}
	return stored == h.plainFp
}

// FingerprintMatches reports whether a record of h's key, or a copy of one (the
// backstop's row), fingerprinted as stored answers h's call: stored must be h's
// fingerprint in either form (SPEC §19, §20) — the keyed one under the guard's
// keyring, or the plain one exactly — compared as [Fingerprint.Matches] compares
// fingerprints of one form.
func (h *Handle) FingerprintMatches(stored Fingerprint) bool {
	if stored.Keyed() == h.claim.Fingerprint.Keyed() {
		return h.claim.Fingerprint.Matches(stored)
	}
	return h.sameRequest(stored)
}

// otherScopeDue reports whether a fresh claim of h must read the key under the other
// form's scope: h's scope is keyed by the core, and a record under the other scope
// may be alive (the transition window).
func (h *Handle) otherScopeDue() bool {
	return h.keyScope && !h.pinned && !h.otherLooked && !h.mode.otherScopeUntil.IsZero() &&
		h.g.localNow().Before(h.mode.otherScopeUntil)
}

// transitional reports whether h's call falls in a transition of the store's
// sealing: the form changes before its claim could commit (a handoff), or a record of
// its key may be under the other form's scope.
func (h *Handle) transitional() bool {
	return !h.mode.capAt.IsZero() || h.otherScopeDue()
}

// otherScope is the scope of h's key in the form h does not write.
func (h *Handle) otherScope() string {
	if h.sealed {
		return h.plainScope
	}
	if h.keyedScope == "" {
		h.keyedScope = h.g.cfg.Seal.Scope(h.plainScope)
	}
	return h.keyedScope
}

// lookOther reads h's key under the other form's scope after h claimed it afresh,
// when that is due. A record there (live, or unfinished) is the request's: h gives
// its fresh claim back, follows that record, and claims again.
func (h *Handle) lookOther(ctx context.Context) (again bool, err error) {
	if !h.otherScopeDue() {
		return false, nil
	}
	h.otherLooked = true
	rec, err := h.readOther(ctx)
	if err != nil || rec == nil {
		if err != nil {
			// Whether the request ran before cannot be told: fail closed.
			_ = h.dropFresh(ctx)
		}
		return false, err
	}
	if err := h.dropFresh(ctx); err != nil {
		return false, err
	}
	return true, h.follow(rec)
}

// follow makes h claim rec, the key's record under the other form's scope, in that
// record's form: the other scope, and its fingerprint's form. A record whose
// fingerprint is not of its scope's form (a keyed one under the plain scope, or a
// plain one under the keyed scope) was made by no process of idem: unreadable.
func (h *Handle) follow(rec *idemstore.Record) error {
	keyed := rec.Fingerprint.Keyed()
	if keyed == h.sealed {
		return &UnreadableError{KeyID: recordKeyID(rec), Reason: "its fingerprint is not of its scope's form"}
	}
	if err := h.honours(rec); err != nil {
		return err
	}
	h.pinTo(keyed)
	return nil
}

// readOther reads h's key under the other form's scope, under StoreTimeout: the
// record, or nil when there is none alive.
func (h *Handle) readOther(ctx context.Context) (*idemstore.Record, error) {
	g := h.g
	ctx, cancel := context.WithDeadline(ctx, callDeadline(g.cfg.StoreTimeout, h.mode.capAt))
	defer cancel()
	start := h.storeCallStart()
	rec, err := g.cfg.Store.RecordGet(ctx, &idemstore.GetParams{Scope: h.otherScope(), Key: h.key, Now: g.storeNow()})
	h.observeStoreCall(observe.StoreOpLookup, start, err)
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return rec, nil
}

// dropFresh gives back the record h just claimed afresh (it has no step: the release
// deletes it), so that h claims another; under StoreTimeout.
func (h *Handle) dropFresh(ctx context.Context) error {
	g := h.g
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cfg.StoreTimeout)
	defer cancel()
	err := g.cfg.Store.RecordRelease(ctx, &idemstore.ReleaseParams{Scope: h.scope, Key: h.key, Token: h.claim.Token, Now: g.storeNow()})
	if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
		g.cfg.Logger.WarnContext(ctx, "idem: giving back a claim made in the form a record of the key was not in failed; "+
			"the key is in flight until its lease lapses", h.attrs(slog.Any("error", err))...)
		return err
	}
	return nil
}

// transitionFailed reports a call that a record of the other form failed: unreadable
// (logged, never executed again), or the store's error.
func (h *Handle) transitionFailed(ctx context.Context, err error, waited bool, start time.Time) error {
	if errors.Is(err, ErrRecordUnreadable) {
		return h.openFailed(ctx, err, false, waited, start)
	}
	h.observeClaim(observe.OutcomeStoreError, waited, start, err)
	return h.g.storeError(ctx, h, "claim", err)
}
