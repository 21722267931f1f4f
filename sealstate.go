package idem

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/seal"
)

// Sealing as a transition (SPEC §20). A store's sealing state says whether its
// records are being sealed: never (none), since a time (begun), or no longer (ended).
// It is part of the store's state (the reserved state records), MAC'd under the
// store's MAC secret, so that nobody without a configured key can begin, end or move
// it. A process with a keyring writes sealed records (keyed fingerprint, keyed scope,
// sealed content) only from SealingHandoff after the begin, by every process's clock
// alike; before that, and on a store where sealing has not begun (ready mode), it
// writes as a process without a key does, and opens whatever is sealed.

// SealingPhase is where a store is in turning sealing on or off (SPEC §20).
type SealingPhase string

const (
	// SealingNone: sealing never began on the store (the zero value). A process with
	// a keyring runs ready: it writes records as a process without a key does (plain
	// scope, plain fingerprint, content in clear) and opens every sealed one.
	SealingNone SealingPhase = ""
	// SealingBegun: sealing began at SealingState.At. Processes with a keyring write
	// sealed records from At + Handoff; a process without a key stops claiming (503
	// store_unavailable) and refuses to start, unless told that sealing is being
	// turned off (GuardConfig.SealingOff).
	SealingBegun SealingPhase = "begun"
	// SealingEnded: sealing ended at SealingState.At. Processes with a keyring write
	// in clear again from At + Handoff, and keep opening sealed records.
	SealingEnded SealingPhase = "ended"
)

// SealingHandoff is how long after a begin (or an end) of sealing the processes with
// a keyring change how they write (SPEC §20). Every process re-reads the store's
// state at least every StoreStateRefresh, and a claim decided on a state it read
// reaches the store within stateValidity of that read or not at all; so every record
// made in the old form is in the store before any process makes one in the new form,
// and the new form's first claims find it. The margin beyond stateValidity covers the
// clocks of the processes and of the operator's tool, which may disagree by that
// much.
const SealingHandoff = time.Minute

// stateValidity bounds how long a call may act on the store's state as one read of
// it found it: a claim made on it reaches the store by the read's start +
// stateValidity (its deadline is cut there), and a handler that claims its key in its
// own transaction (RouteOptions.ClaimInHandler) ends by then too. Past it, with no
// newer read, calls fail closed (503 store_unavailable) until the state is read.
const stateValidity = 45 * time.Second

// SealingState is a store's sealing state (SPEC §20), part of its state
// ([StoreState]): see [SealingPhase]. The phase and its times are MAC'd under the
// store's MAC secret ([BeginSealing], [EndSealing] write it), so that nobody without a
// configured key can begin, end or move them: a process with a keyring refuses a
// state whose MAC does not verify.
type SealingState struct {
	// Phase is none, begun or ended.
	Phase SealingPhase `json:"phase,omitempty"`
	// At is when the phase began: the begin (begun) or the end (ended), by the clock
	// of the process that recorded it; zero for none.
	At time.Time `json:"at,omitzero"`
	// Began is, for an ended state, when the processes with a keyring began to
	// write sealed records (the begin + its handoff); zero otherwise.
	Began time.Time `json:"began,omitzero"`
	// Handoff is the delay after the begin (and after the end) at which processes
	// with a keyring change how they write: SealingHandoff, or zero when sealing began
	// on a store that held no record yet.
	Handoff time.Duration `json:"handoff,omitempty"`
	// MAC is the HMAC of the fields above under the store's MAC secret (unpadded
	// base64url).
	MAC string `json:"mac,omitempty"`
	// Unused says that no call has used the store yet (InitStoreState sets it on a
	// store this release creates; a Guard's first claim clears it): sealing then
	// begins at once, with no handoff, under the first Guard with a keyring. It is
	// not MAC'd: setting it can only make sealing begin sooner.
	Unused bool `json:"unused,omitempty"`
}

// SealsFrom is when processes with a keyring begin to write sealed records: the
// begin + Handoff (zero when sealing never began).
func (s SealingState) SealsFrom() time.Time {
	switch s.Phase {
	case SealingBegun:
		return s.At.Add(s.Handoff)
	case SealingEnded:
		return s.Began
	}
	return time.Time{}
}

// ClearFrom is when processes with a keyring write in clear again after the end: the
// end + Handoff (zero unless ended).
func (s SealingState) ClearFrom() time.Time {
	if s.Phase != SealingEnded {
		return time.Time{}
	}
	return s.At.Add(s.Handoff)
}

// String says the state in words, for a status line.
func (s SealingState) String() string {
	const layout = "2006-01-02T15:04:05Z07:00"
	switch s.Phase {
	case SealingBegun:
		return "begun at " + s.At.UTC().Format(layout) + "; records sealed from " + s.SealsFrom().UTC().Format(layout)
	case SealingEnded:
		return "ended at " + s.At.UTC().Format(layout) + " (records sealed from " + s.Began.UTC().Format(layout) + "); records in clear from " +
			s.ClearFrom().UTC().Format(layout)
	case SealingNone:
		return "none: not begun (processes with a key write in clear until idem keys seal --begin)"
	}
	return "unknown (" + string(s.Phase) + ")"
}

// macInput is what a sealing state's MAC covers: a label, the phase and its times.
func (s SealingState) macInput() []byte {
	b := append([]byte(nil), "idem sealing state v1\x00"...)
	b = append(b, s.Phase...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(s.At)))
	b = binary.BigEndian.AppendUint64(b, uint64(unixNano(s.Began)))
	return binary.BigEndian.AppendUint64(b, uint64(s.Handoff))
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// signed returns s with its MAC under k.
func (s SealingState) signed(k *seal.Keyring) SealingState {
	s.MAC = ""
	if s.Phase != SealingNone {
		s.MAC = base64.RawURLEncoding.EncodeToString(k.StateMAC(s.macInput()))
	}
	return s
}

// errSealingAltered is the error of a sealing state whose MAC does not verify.
var errSealingAltered = errors.New("idem: the store's sealing state does not verify under its MAC secret: it was written or altered " +
	"by someone without the key; refusing to serve the store (record the state again with idem keys seal --begin or --end, with the key)")

// verify checks s's MAC under k (a keyring with the store's MAC secret): nil, or
// errSealingAltered. A state of no sealing needs none.
func (s SealingState) verify(k *seal.Keyring) error {
	switch s.Phase {
	case SealingNone:
		return nil
	case SealingBegun, SealingEnded:
	default:
		return fmt.Errorf("idem: the store's sealing state has a phase this release does not know (%q): refusing to serve it", s.Phase)
	}
	mac, err := base64.RawURLEncoding.DecodeString(s.MAC)
	if err != nil || s.At.IsZero() || s.Handoff < 0 || (s.Phase == SealingEnded && s.Began.IsZero()) ||
		!k.VerifyStateMAC(s.macInput(), mac) {
		return errSealingAltered
	}
	return nil
}

// sealMode is how one call of a process with a keyring writes and what it honours,
// at one moment of the store's sealing state (SealingState.mode).
type sealMode struct {
	// seal: the call writes the sealed form (keyed fingerprint, keyed scope for a
	// Call.KeyScope, sealed content).
	seal bool
	// capAt, when set, is when the form changes: a claim made in this form reaches
	// the store by then, or is cut off (and released if it lands later).
	capAt time.Time
	// plainUntil and plainBefore: while sealing, a record in clear (a plain
	// fingerprint) is honoured only before plainUntil, and only when made before
	// plainBefore (the handoff), unless its content is sealed.
	plainUntil, plainBefore time.Time
	// otherScopeUntil: for a Call.KeyScope, a fresh claim under the scope of this
	// form reads the key's record under the other form's scope until then (the
	// plain scope while sealing, the keyed scope once sealing ended).
	otherScopeUntil time.Time
}

// mode is the sealMode of a call at now, for records that live ttl.
func (s SealingState) mode(now time.Time, ttl time.Duration) sealMode {
	switch s.Phase {
	case SealingBegun:
		sw := s.SealsFrom()
		if now.Before(sw) {
			return sealMode{capAt: sw}
		}
		if s.Handoff == 0 {
			// Sealing began with the store's first call: no record was ever made in
			// clear, and none is honoured.
			return sealMode{seal: true}
		}
		return sealMode{seal: true, plainUntil: sw.Add(ttl), plainBefore: sw, otherScopeUntil: sw.Add(ttl)}
	case SealingEnded:
		sw, ew := s.SealsFrom(), s.ClearFrom()
		switch {
		case now.Before(sw):
			return sealMode{capAt: sw}
		case now.Before(ew):
			return sealMode{seal: true, capAt: ew, plainUntil: sw.Add(ttl), plainBefore: sw, otherScopeUntil: sw.Add(ttl)}
		}
		return sealMode{otherScopeUntil: ew.Add(ttl)}
	}
	return sealMode{}
}

// usable says whether a call may act on k, the state known at now: nil, or why not
// (fail closed, 503): nothing known (the state was never read), or a state read more
// than stateValidity ago.
func (k *knownState) usable(now time.Time) error {
	switch {
	case k == nil:
		return errStateUnknown
	case now.Sub(k.readAt) > stateValidity:
		return errStateStale
	}
	return nil
}

// sealChecked is a guard's judgement of one sealing state of its store: the refusal
// it calls for (nil: none). The state's cache is shared by the process's guards of a
// store; the judgement depends on each guard's keyring.
type sealChecked struct {
	sealing SealingState
	err     error
}

// sealCheck returns why the store's state st keeps this guard from claiming (nil
// when it does not), judged once per sealing state, and says what a change of it
// means for this guard (sealingChanged).
func (g *Guard) sealCheck(ctx context.Context, st StoreState) error {
	prev := g.sealJudged.Load()
	if prev != nil && prev.sealing == st.Sealing {
		return prev.err
	}
	c := &sealChecked{sealing: st.Sealing, err: g.sealingRefusal(ctx, st, prev)}
	if g.sealJudged.CompareAndSwap(prev, c) {
		g.sealingChanged(ctx, prev, st, c.err)
	}
	return c.err
}

var (
	errStateUnknown = errors.New("idem: the store's state could not be read yet (SPEC §20): nothing is claimed until it is")
	errStateStale   = errors.New("idem: the store's state could not be read for " + stateValidity.String() + " (SPEC §20): nothing is claimed until it is")
)

// sealState returns the store's sealing state as the guard last read it (none when
// it never read it: calls then fail before they claim).
func (g *Guard) sealState() SealingState {
	st, _ := g.knownStoreState()
	return st.Sealing
}

// stateCap is when a claim of h must reach the store at the latest, by the host's
// clock: the state's validity, and the change of form of the store's sealing (zero:
// no bound).
func (g *Guard) stateCap(h *Handle) time.Time {
	var at time.Time
	if k := g.state.known.Load(); k != nil {
		at = k.readAt.Add(stateValidity)
	}
	if c := h.mode.capAt; !c.IsZero() && (at.IsZero() || c.Before(at)) {
		at = c
	}
	if at.IsZero() {
		return at
	}
	return g.realTime(at)
}

// useStore ends st's Unused before the guard's first claim: under a keyring it begins
// sealing at once (no record exists that a handoff would protect), otherwise it
// records that the store is used. It returns the state written (or found written).
func (g *Guard) useStore(ctx context.Context, st StoreState) (StoreState, error) {
	if !st.Sealing.Unused {
		return st, nil
	}
	return useStore(ctx, g.cfg.Store, st, g.cfg.Seal, g.localNow())
}

// useStore is Guard.useStore from cur, the state as read, for the start sequence too
// (CheckSealing).
func useStore(ctx context.Context, store idemstore.Store, cur StoreState, ring *seal.Keyring, now time.Time) (StoreState, error) {
	return updateStoreStateFrom(ctx, store, cur, nil, func(s *StoreState) error {
		if !s.Sealing.Unused {
			return nil
		}
		if ring == nil || !s.Allows(GateSealedRecords) {
			s.Sealing.Unused = false
			return nil
		}
		s.Sealing = SealingState{Phase: SealingBegun, At: now.UTC(), Handoff: 0}.signed(ring)
		return nil
	})
}

// ErrStoreSealed is matched by the refusal of a process without a key on a store whose
// sealing began ([SealedStoreError]).
var ErrStoreSealed = errors.New("idem: the store's records are sealed, and this process has no key")

// SealedStoreError is the refusal of a process without a key on a store whose sealing
// began (SPEC §20): at start ([CheckSealing]), and on every call of a running Guard
// that meets the begin (503 store_unavailable). It names the keys the store's MAC
// secret is wrapped under, one of which the process needs. It matches
// [ErrStoreSealed].
type SealedStoreError struct {
	// State is the store's sealing state.
	State SealingState
	// KeyIDs are the keys the store's MAC secret is wrapped under (empty when it could
	// not be read).
	KeyIDs []string
}

func (e *SealedStoreError) Error() string {
	keys := "the keys the store's MAC secret is wrapped under (its record could not be read to name them)"
	if len(e.KeyIDs) > 0 {
		keys = strings.Join(e.KeyIDs, ", ")
	}
	return "idem: the store's sealing " + e.State.String() + ", and this process has no key: it would write records in clear " +
		"and miss the sealed ones; configure one of " + keys + " (--encryption-key, Config.Seal), " +
		"or, to turn sealing off, start it with --sealing-off (Config.SealingOff), after idem keys seal --end (docs/security.md)"
}

// Is reports whether target is [ErrStoreSealed].
func (e *SealedStoreError) Is(target error) bool { return target == ErrStoreSealed }

// sealedStoreError returns the refusal of a process without a key on a store whose
// sealing state is s, naming the keys its MAC secret is wrapped under.
func sealedStoreError(ctx context.Context, store idemstore.Store, s SealingState) error {
	e := &SealedStoreError{State: s}
	if blob, _, err := latestSecret(ctx, store); err == nil && blob != nil {
		e.KeyIDs, _ = seal.SecretKeyIDs(blob)
	}
	return e
}

// sealingRefusal is why the store's sealing state st keeps this guard from claiming,
// nil when it does not: under a keyring, a sealing state whose MAC does not verify;
// without one, a sealing that began, unless SealingOff.
func (g *Guard) sealingRefusal(ctx context.Context, st StoreState, prev *sealChecked) error {
	sl := st.Sealing
	if k := g.cfg.Seal; k != nil {
		if err := sl.verify(k); err != nil {
			return &StoreError{Op: "state", Err: err}
		}
		return nil
	}
	if sl.Phase == SealingNone || g.cfg.SealingOff {
		return nil
	}
	if prev != nil && prev.err != nil && prev.sealing.Phase != SealingNone {
		return prev.err
	}
	return &StoreError{Op: "state", Err: sealedStoreError(ctx, g.cfg.Store, sl)}
}

// sealingChanged logs what a change of the store's sealing state means for this
// guard, once per change: the refusal that begins (ERROR), the begin or end it will
// follow (INFO), a guard with a keyring on a store whose sealing has not begun
// (WARN: it writes in clear).
func (g *Guard) sealingChanged(ctx context.Context, prev *sealChecked, st StoreState, refusal error) {
	was := SealingState{}
	var wasRefused error
	if prev != nil {
		was, wasRefused = prev.sealing, prev.err
	}
	if prev != nil && was == st.Sealing && (wasRefused == nil) == (refusal == nil) {
		return
	}
	if prev == nil && refusal == nil && startSaid(g.cfg.Store, st.Sealing) {
		return // the program's start said it (CheckSealing)
	}
	switch {
	case refusal != nil:
		g.cfg.Logger.ErrorContext(ctx, "idem: refusing every request (503 store_unavailable) while the store's sealing state keeps this process from serving it",
			slog.Any("error", refusal))
	case g.cfg.Seal != nil && st.Sealing.Phase == SealingNone:
		g.cfg.Logger.WarnContext(ctx, "idem: sealing has not begun on this store: this process has a key but writes records in clear (ready mode) "+
			"until an operator begins sealing with idem keys seal --begin (idem.BeginSealing), once every process runs with the key",
			slog.String("sealed_under", g.cfg.Seal.SealingKeyID()))
	case g.cfg.Seal != nil && st.Sealing.Phase == SealingBegun:
		g.cfg.Logger.InfoContext(ctx, "idem: the store's sealing has begun: this process writes sealed records from "+
			st.Sealing.SealsFrom().UTC().Format(time.RFC3339), slog.String("sealed_under", g.cfg.Seal.SealingKeyID()))
	case g.cfg.Seal != nil && st.Sealing.Phase == SealingEnded:
		g.cfg.Logger.InfoContext(ctx, "idem: the store's sealing has ended: this process writes records in clear from "+
			st.Sealing.ClearFrom().UTC().Format(time.RFC3339)+", and keeps opening sealed ones")
	case g.cfg.Seal == nil && st.Sealing.Phase != SealingNone:
		g.cfg.Logger.WarnContext(ctx, "idem: the store's sealing "+st.Sealing.String()+"; this process has no key and serves it because sealing "+
			"is being turned off (SealingOff): sealed records fail closed (500 record_unreadable), and records under a keyed scope are not found")
	}
}

// SealingChange says how [BeginSealing] or [EndSealing] changes a store's sealing.
type SealingChange struct {
	// Handoff is how long after the change the processes with a keyring change how
	// they write. Defaults to [SealingHandoff], which every process's re-reading of
	// the store's state, and the bounds of its claims, fit in. A shorter handoff is
	// safe only when no process wrote in the old form lately (a store no process
	// serves; tests).
	Handoff time.Duration
	// At is when the change takes effect, by the caller's clock; the processes'
	// clocks must agree with it within SealingHandoff - 45 s. Defaults to now.
	At time.Time
}

func (c SealingChange) values() (time.Time, time.Duration) {
	at, handoff := c.At, c.Handoff
	if at.IsZero() {
		at = time.Now()
	}
	if handoff <= 0 {
		handoff = SealingHandoff
	}
	return at.UTC(), handoff
}

// BeginSealing begins sealing the records of store (SPEC §20), the operator's step
// once every process that serves the store runs with a key (`idem keys seal --begin`):
// it records the begin in the store's state, MAC'd under the store's MAC secret
// (ring must hold it: [OpenKeyring]). From then on a process without a key stops
// claiming within StoreStateRefresh (503 store_unavailable, one ERROR naming the
// keys it needs) and refuses to start; processes with a keyring write sealed records
// from the begin + Handoff, and keep replaying the records made before in clear
// until they expire. It refuses a store below format level 2 (idem 0.2.0 cannot read
// sealed records: finalize the upgrade first, [FinalizeUpgrade]). On a store whose
// sealing began already it changes nothing; on one where it ended, it begins again.
// It returns the store's state as written (or as found).
func BeginSealing(ctx context.Context, store idemstore.Store, ring *seal.Keyring, c SealingChange) (StoreState, error) {
	if ring == nil || !ring.Keyed() {
		return StoreState{}, errors.New("idem: BeginSealing needs the keyring of the store (idem.OpenKeyring)")
	}
	at, handoff := c.values()
	return UpdateStoreState(ctx, store, func(s *StoreState) error {
		if !s.Allows(GateSealedRecords) {
			return fmt.Errorf("idem: the store is at format level %d: a process of idem 0.2.0 or older may serve it, and would replay sealed "+
				"records as they are stored (ciphertext); finalize the upgrade first (idem migrate --finalize) once none does", s.Level)
		}
		if s.Sealing.Phase == SealingBegun && s.Sealing.verify(ring) == nil {
			return nil
		}
		s.Sealing = SealingState{Phase: SealingBegun, At: at, Handoff: handoff}.signed(ring)
		return nil
	})
}

// EndSealing ends the sealing of store's records (SPEC §20), the operator's first
// step to turn sealing off (`idem keys seal --end`): it records the end, MAC'd under
// the store's MAC secret. Processes with a keyring write records in clear from the
// end + Handoff, and keep opening the sealed ones; processes without a key may then
// serve the store, told so (GuardConfig.SealingOff), and the keys may be removed once
// the last sealed record expired (docs/security.md). A store whose sealing never
// began is refused; one whose sealing ended already is left as it is. It returns the
// store's state as written (or as found).
func EndSealing(ctx context.Context, store idemstore.Store, ring *seal.Keyring, c SealingChange) (StoreState, error) {
	if ring == nil || !ring.Keyed() {
		return StoreState{}, errors.New("idem: EndSealing needs the keyring of the store (idem.OpenKeyring)")
	}
	at, handoff := c.values()
	return UpdateStoreState(ctx, store, func(s *StoreState) error {
		cur := s.Sealing
		if err := cur.verify(ring); err != nil {
			return err
		}
		switch cur.Phase {
		case SealingNone:
			return errors.New("idem: the store's sealing never began: there is nothing to end")
		case SealingEnded:
			return nil
		}
		if at.Before(cur.At) {
			at = cur.At
		}
		s.Sealing = SealingState{Phase: SealingEnded, At: at, Began: cur.SealsFrom(), Handoff: handoff}.signed(ring)
		return nil
	})
}

// CheckSealing is the start sequence's check of the store's sealing (SPEC §20),
// after [CheckStore] and [OpenKeyring]: it reads the store's sealing state and returns
// it, or refuses to serve the store. With a keyring (ring), it verifies the state's
// MAC under the store's MAC secret, and on a store no call used yet begins sealing at
// once. Without one (ring nil), a store whose sealing began is refused with a
// [*SealedStoreError] naming the keys the store's MAC secret is wrapped under, unless
// sealingOff says that sealing is being turned off. A running Guard applies the same
// rules to every call, on the state it re-reads every StoreStateRefresh.
func CheckSealing(ctx context.Context, store idemstore.Store, ring *seal.Keyring, sealingOff bool) (SealingState, error) {
	st, err := ReadStoreState(ctx, store)
	if err != nil {
		return SealingState{}, err
	}
	if err := st.refusal(); err != nil {
		return st.Sealing, err
	}
	if st.Sealing.Unused && ring != nil {
		if st, err = useStore(ctx, store, st, ring, time.Now()); err != nil {
			return st.Sealing, err
		}
	}
	s := st.Sealing
	switch {
	case ring != nil:
		err = s.verify(ring)
	case s.Phase == SealingNone || sealingOff:
	default:
		return s, sealedStoreError(ctx, store, s)
	}
	if err == nil && reflect.TypeOf(store).Comparable() {
		startChecks.Store(store, s)
	}
	return s, err
}

// startChecks holds, by store, the sealing state that CheckSealing found there: what
// the program's start said of it, so that a Guard of the store does not say it again
// at its first read of the same state.
var startChecks sync.Map

// startSaid reports whether CheckSealing found s on store.
func startSaid(store idemstore.Store, s SealingState) bool {
	if store == nil || !reflect.TypeOf(store).Comparable() {
		return false
	}
	v, ok := startChecks.Load(store)
	return ok && v.(SealingState) == s
}
