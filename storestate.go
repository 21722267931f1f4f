package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// The store's state (SPEC §20). Every process that shares a store learns from the
// store itself which record formats it may write (the format level) and whether
// records are being sealed (the sealing state). The state is a series of immutable
// reserved records, state-1, state-2, …, in idemstore.ReservedScope: each is claimed
// once, atomically, and completed with its content; the highest one present is the
// current state. A process that knows state-N learns of a change by reading state-N+1:
// finding nothing means "unchanged", one primary-key read. Nothing changes a state
// record once it is written, and none expires (their TTL is MaxTTL).
//
// This is the one place where a process learns the store's state: at its start
// (CheckStore), and in every Guard lazily, on the claim path, at most every
// StoreStateRefresh ([Guard] re-reads it only when what it knows is that old).

// FormatLevel is a store's format level (SPEC §20): which record formats the
// processes that share the store may write. A release writes a format that the
// previous release cannot read (a gate of [Gates]) only once the store's level
// reaches the gate's level, which the operator raises once no process of the
// previous release serves the store ([FinalizeUpgrade], `idem migrate --finalize`).
// Levels only go up.
type FormatLevel int

const (
	// FormatLevel1 is the level of what idem 0.1.0 and 0.2.0 read and write, and of
	// every store without a state record (one those releases made or served).
	FormatLevel1 FormatLevel = 1
	// FormatLevel2 is the level of idem 0.3.0's new formats ([Gates]).
	FormatLevel2 FormatLevel = 2
	// CurrentFormatLevel is the highest level this release knows: the level
	// FinalizeUpgrade raises a store to, and the level of a store this release
	// creates. A process refuses a store whose level is higher ([StoreTooNewError]).
	CurrentFormatLevel = FormatLevel2
)

// StoreStateRefresh is how old what a Guard knows of its store's state may grow
// before its next claim reads the store's state again (one primary-key read, under
// the claim's StoreTimeout). A store's level or sealing state changed by an operator
// reaches every running process within about this long.
const StoreStateRefresh = 5 * time.Second

// storeStateRetry is how soon a Guard reads the state again after a read failed.
const storeStateRetry = time.Second

// StoreState is a store's state (SPEC §20): its format level and sealing state, and
// which release wrote it and when. [ReadStoreState] reads it; [UpdateStoreState]
// writes the next one.
type StoreState struct {
	// Seq is the number of the state record it was read from (state-Seq); 0 when the
	// store has none.
	Seq int `json:"-"`
	// Level is the store's format level; FormatLevel1 when it has no state record.
	Level FormatLevel `json:"level"`
	// Sealing is the store's sealing state.
	Sealing SealingState `json:"sealing,omitzero"`
	// WrittenAt is when the state was written (zero when the store has none).
	WrittenAt time.Time `json:"written_at,omitzero"`
	// Release is the idem release that wrote it ("" when the store has none).
	Release string `json:"release,omitempty"`
	// Revision is the VCS revision of the build that wrote it, when it was known.
	Revision string `json:"revision,omitempty"`
}

// WrittenBy names the release (and the revision, when known) that wrote s.
func (s StoreState) WrittenBy() string {
	switch {
	case s.Seq == 0:
		return "an earlier release (the store has no state record: idem 0.2.0 or older made it)"
	case s.Revision != "":
		return "idem " + s.Release + " (" + s.Revision + ")"
	}
	return "idem " + s.Release
}

// Allows reports whether a store in state s may hold records of gate g's format:
// its level reached the gate's.
func (s StoreState) Allows(g Gate) bool { return s.Level >= g.Level() }

// ErrStoreTooNew is matched by the error of a store whose format level is higher
// than this release knows ([StoreTooNewError]).
var ErrStoreTooNew = errors.New("idem: the store's format level is newer than this release knows")

// StoreTooNewError is the refusal of a store whose format level this release does
// not know (SPEC §20): a newer release finalized its upgrade, and its records may be
// in formats this release would misread. It matches [ErrStoreTooNew] and names both
// sides.
type StoreTooNewError struct {
	// State is the store's state as read.
	State StoreState
	// Release is this release; Known the highest level it knows.
	Release string
	Known   FormatLevel
	// Reason, when not empty, says why the state was refused other than by its
	// level (a state record that does not decode).
	Reason string
}

func (e *StoreTooNewError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("idem: the store's state cannot be read by idem %s (%s); refusing to serve it: its records may be in formats this release does not know", e.Release, e.Reason)
	}
	return fmt.Sprintf("idem: the store is at format level %d, written by %s at %s; this is idem %s, which knows format levels up to %d: "+
		"run a release that knows level %d (a rollback past a finalized upgrade is not supported: SPEC §20)",
		e.State.Level, e.State.WrittenBy(), e.State.WrittenAt.UTC().Format(time.RFC3339), e.Release, e.Known, e.State.Level)
}

// Is reports whether target is [ErrStoreTooNew].
func (e *StoreTooNewError) Is(target error) bool { return target == ErrStoreTooNew }

// refusal returns the error of a process of this release on a store in state s, nil
// when it may serve it.
func (s StoreState) refusal() error {
	if s.Level > CurrentFormatLevel {
		return &StoreTooNewError{State: s, Release: Release, Known: CurrentFormatLevel}
	}
	return nil
}

// stateKey is the key of the state record number seq.
func stateKey(seq int) string { return "state-" + strconv.Itoa(seq) }

// stateFingerprint is the fingerprint of every state record.
var stateFingerprint = Fingerprint{Version: idemstore.FingerprintVersion, Sum: [32]byte{'i', 'd', 'e', 'm', ' ', 's', 't', 'o', 'r', 'e', ' ', 's', 't', 'a', 't', 'e'}}

// reservedLease bounds how long processes wait for one that died writing a reserved
// record.
const reservedLease = 10 * time.Second

// ReadStoreState reads the store's current state: its highest state record, or, when
// it has none, level 1 with Seq 0. It reads state-1, state-2, … until one is absent
// (a handful: the state changes when an operator finalizes an upgrade or turns
// sealing on or off). A state record that does not decode fails with a
// [StoreTooNewError] (fail closed: a newer release may have written it).
func ReadStoreState(ctx context.Context, store idemstore.Store) (StoreState, error) {
	return readStateAfter(ctx, store, StoreState{Level: FormatLevel1})
}

// readStateAfter reads the states that follow known (state-known.Seq+1 onwards) and
// returns the last one, or known itself when the next is absent (one read).
func readStateAfter(ctx context.Context, store idemstore.Store, known StoreState) (StoreState, error) {
	for {
		next, ok, err := readState(ctx, store, known.Seq+1)
		if err != nil || !ok {
			return known, err
		}
		known = next
	}
}

// readState reads the state record seq: ok false when it is absent, or in flight
// (being written: it counts once it is).
func readState(ctx context.Context, store idemstore.Store, seq int) (StoreState, bool, error) {
	rec, err := store.RecordGet(ctx, &idemstore.GetParams{Scope: idemstore.ReservedScope, Key: stateKey(seq)})
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return StoreState{}, false, nil
	case err != nil:
		return StoreState{}, false, fmt.Errorf("idem: reading the store's state (record %q): %w", stateKey(seq), err)
	case rec.State != idemstore.StateCompleted:
		return StoreState{}, false, nil
	}
	st, err := decodeState(rec)
	if err != nil {
		return StoreState{}, false, &StoreTooNewError{Release: Release, Known: CurrentFormatLevel,
			Reason: fmt.Sprintf("its state record %q %v", stateKey(seq), err)}
	}
	st.Seq = seq
	return st, true, nil
}

// decodeState decodes a state record's content.
func decodeState(rec *idemstore.Record) (StoreState, error) {
	var st StoreState
	if rec.Response == nil || len(rec.Response.Body) == 0 {
		return st, errors.New("is empty")
	}
	if err := json.Unmarshal(rec.Response.Body, &st); err != nil {
		return st, errors.New("does not decode")
	}
	if st.Level < FormatLevel1 {
		return st, fmt.Errorf("holds no format level (%d)", st.Level)
	}
	return st, nil
}

// errStateConflict is what writeState answers when another process wrote the state
// record first.
var errStateConflict = errors.New("idem: another process changed the store's state first")

// UpdateStoreState changes the store's state: it reads the current state, passes a
// copy to change, and writes what change left as the next state record, in one
// atomic claim. When another process wrote the next state first, it reads that one
// and calls change again, so that no change is lost. A change that leaves the state
// as it was (or returns an error) writes nothing. It returns the state written (or
// the current one, unchanged). WrittenAt, Release and Revision are set by
// UpdateStoreState; change sets Level (never lower) and Sealing. FinalizeUpgrade,
// and the transitions of sealing, are built on it.
//
// It refuses a store whose level is newer than this release knows
// ([StoreTooNewError]).
func UpdateStoreState(ctx context.Context, store idemstore.Store, change func(*StoreState) error) (StoreState, error) {
	cur, err := ReadStoreState(ctx, store)
	return updateStoreStateFrom(ctx, store, cur, err, change)
}

// updateStoreStateFrom is UpdateStoreState from cur, the state as read (err: its
// read's error).
func updateStoreStateFrom(ctx context.Context, store idemstore.Store, cur StoreState, err error, change func(*StoreState) error) (StoreState, error) {
	for {
		if err != nil {
			return cur, err
		}
		if err := cur.refusal(); err != nil {
			return cur, err
		}
		next := cur
		if err := change(&next); err != nil {
			return cur, err
		}
		if next.Level == cur.Level && next.Sealing == cur.Sealing {
			return cur, nil
		}
		if next.Level < cur.Level {
			return cur, fmt.Errorf("idem: the store's format level never goes down (from %d to %d)", cur.Level, next.Level)
		}
		next.Seq, next.WrittenAt, next.Release, next.Revision = cur.Seq+1, time.Now().UTC().Truncate(time.Millisecond), Release, revision()
		err = writeState(ctx, store, next)
		if err == nil {
			return next, nil
		}
		if errors.Is(err, errStateConflict) {
			cur, err = readStateAfter(ctx, store, cur)
		}
	}
}

// writeState writes st as the state record st.Seq, in one atomic claim: errStateConflict
// when another process wrote it first.
func writeState(ctx context.Context, store idemstore.Store, st StoreState) error {
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	done, err := keepReserved(ctx, store, stateKey(st.Seq), stateFingerprint, MaxTTL, body)
	switch {
	case errors.Is(err, ErrKeyReused):
		return errStateConflict // written by a release that fingerprints it otherwise
	case err != nil:
		return fmt.Errorf("idem: writing the store's state: %w", err)
	case !done:
		return errStateConflict
	}
	return nil
}

// keepReserved keeps body as the completed reserved record key, fingerprinted fp, in
// one atomic claim: done false when the record was there already (completed by
// another process, or being written by one whose lease is live, with the same
// fingerprint; with another, ErrKeyReused). A claim left in flight by a process that
// died is taken over once its lease lapses: the loop waits for that.
func keepReserved(ctx context.Context, store idemstore.Store, key string, fp Fingerprint, ttl time.Duration, body []byte) (done bool, err error) {
	for {
		token := newToken()
		res, err := store.RecordClaim(ctx, &idemstore.ClaimParams{
			Scope: idemstore.ReservedScope, Key: key, Fingerprint: fp, Token: token, RecordID: newToken(),
			Lease: reservedLease, TTL: ttl, OnLapse: LapseTakeOver,
		})
		if err != nil {
			return false, err
		}
		switch res.Outcome {
		case idemstore.ClaimCompleted:
			return false, nil
		case idemstore.ClaimMismatch:
			return false, ErrKeyReused
		case idemstore.ClaimAcquired:
			err := store.RecordComplete(ctx, &idemstore.CompleteParams{Scope: idemstore.ReservedScope, Key: key, Token: token,
				Response: &Response{Status: 200, Body: body}, TTL: ttl})
			return err == nil, err
		}
		// Being written by another process: it completes it, or its lease lapses.
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
	}
}

// InitStoreState records that this release created store: when the store has no
// state record, it writes state-1 at [CurrentFormatLevel], so that no process of an
// earlier release, which cannot read this release's formats, is ever taken to serve
// it. A store's Migrate calls it after it created the schema from nothing (no
// earlier release can have served a store that had no schema); store/memory calls it
// for every new store. A store that has a state is left as it is.
func InitStoreState(ctx context.Context, store idemstore.Store) error {
	_, err := UpdateStoreState(ctx, store, func(s *StoreState) error {
		if s.Seq == 0 {
			// No call used it yet: the first process with a keyring begins sealing
			// at once (sealstate.go).
			s.Level, s.Sealing.Unused = CurrentFormatLevel, true
		}
		return nil
	})
	return err
}

// storeStateCache is what a process knows of one store's state, and when it reads
// it again: shared by every Guard of the process on that store (and CheckStore), so
// that the process reads the state once per StoreStateRefresh, whatever number of
// guards it runs.
type storeStateCache struct {
	// known is the state last read, with the refusal it calls for; nil until the
	// first read.
	known atomic.Pointer[knownState]
	// next is when (UnixNano, by the guards' clock) the state is read again: 0 at
	// first.
	next atomic.Int64
	// reading is held by the one claim that reads the state; the others go on with
	// what is known.
	reading atomic.Bool
	// first is held by the one claim that reads the state while no claim may go on
	// without it (nothing known yet, or the store unused): the others wait for its
	// reading rather than each reading, and writing, the same state (a burst of
	// claims on a new store, through a small pool and a slow network, would
	// otherwise queue behind each other's reads past their deadlines).
	first chan struct{}
	// servedDay is the day (UTC, "2006-01-02") the process last recorded its release
	// as serving the store (recordServed): the day the cache was made at first, which
	// is the start sequence's (CheckStore). Nil for a guard whose clock is injected
	// (tests), which records nothing: its days are not the store's.
	servedDay atomic.Pointer[string]
}

// knownState is one reading of the store's state.
type knownState struct {
	state   StoreState
	refusal error // nil, or why this process must not serve the store
	// readAt is when the read that found it began, by the reader's clock: calls act
	// on it until readAt + stateValidity at most (sealstate.go).
	readAt time.Time
}

// stateCaches holds the process's storeStateCache of each store, the most recent
// maxStateCaches stores only (a process has a few; tests make many).
var stateCaches struct {
	sync.Mutex
	byStore map[idemstore.Store]*storeStateCache
	order   []idemstore.Store
}

const maxStateCaches = 64

// stateCacheFor returns the process's cache of store's state. A guard whose clock is
// injected (tests), or a store that cannot be a map key, gets one of its own.
func stateCacheFor(store idemstore.Store, ownClock bool) *storeStateCache {
	newCache := func() *storeStateCache {
		c := newStoreStateCache()
		day := time.Now().UTC().Format(time.DateOnly)
		c.servedDay.Store(&day)
		return c
	}
	if ownClock {
		return newStoreStateCache()
	}
	if store == nil || !reflect.TypeOf(store).Comparable() {
		return newCache()
	}
	stateCaches.Lock()
	defer stateCaches.Unlock()
	if c := stateCaches.byStore[store]; c != nil {
		return c
	}
	if stateCaches.byStore == nil {
		stateCaches.byStore = map[idemstore.Store]*storeStateCache{}
	}
	if len(stateCaches.order) == maxStateCaches {
		delete(stateCaches.byStore, stateCaches.order[0])
		stateCaches.order = append(stateCaches.order[:0], stateCaches.order[1:]...)
	}
	c := newCache()
	stateCaches.byStore[store] = c
	stateCaches.order = append(stateCaches.order, store)
	return c
}

// newStoreStateCache returns a cache that knows nothing yet.
func newStoreStateCache() *storeStateCache {
	return &storeStateCache{first: make(chan struct{}, 1)}
}

// learned records st, read from the store at now, as what the process knows: a
// CheckStore at the start spares the first claims a read.
func (s *storeStateCache) learned(st StoreState, now time.Time) {
	s.known.Store(&knownState{state: st, refusal: st.refusal(), readAt: now})
	s.next.Store(now.Add(StoreStateRefresh).UnixNano())
}

// checkStoreState is where a Guard learns its store's state (SPEC §20), on the way
// to every claim: it answers at once (two atomic loads) unless what the process knows
// is StoreStateRefresh old, when it reads the state records that follow the known
// one (one read), ending by deadline (zero: StoreTimeout from now). Only one claim at
// a time reads; the others go on with what is known. A store whose level is newer than this release knows is
// refused (a [StoreTooNewError]: the caller answers 503 store_unavailable and writes
// nothing), logged once at ERROR. A read that fails is tried again after a second;
// meanwhile claims go on under the state known (the claim itself meets a store that
// does not answer).
//
// What a call may act on is bounded too (SPEC §20, sealstate.go): with no state known
// (its first read failed), or a state read more than stateValidity ago, the call
// fails closed (503); and a store whose sealing state keeps this process from
// claiming refuses the call (a process without a key on a store whose sealing began).
func (g *Guard) checkStoreState(ctx context.Context, now, deadline time.Time) error {
	s := g.state
	k := s.known.Load()
	if k != nil && k.refusal != nil {
		return k.refusal
	}
	if k == nil || now.UnixNano() >= s.next.Load() || k.state.Sealing.Unused {
		if err := g.refreshStoreState(ctx, now, deadline); err != nil {
			return err
		}
		k = s.known.Load()
	}
	if err := k.usable(now); err != nil {
		return err
	}
	return g.sealCheck(ctx, k.state)
}

// refreshStoreState reads the store's state for checkStoreState.
func (g *Guard) refreshStoreState(ctx context.Context, now, deadline time.Time) error {
	s := g.state
	if deadline.IsZero() {
		deadline = time.Now().Add(g.cfg.StoreTimeout)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// Only one claim reads at a time, the others going on with what is known; until
	// something is known, and while the store is unused (no claim may go on before
	// its first use is recorded: sealstate.go), the others wait for that read, by
	// their deadline, and read only if it found nothing.
	if k := s.known.Load(); k != nil && !k.state.Sealing.Unused {
		if !s.reading.CompareAndSwap(false, true) {
			return nil
		}
		defer s.reading.Store(false)
		if now.UnixNano() < s.next.Load() {
			return nil // read meanwhile
		}
	} else {
		select {
		case s.first <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("idem: waiting for another call's reading of the store's state: %w", ctx.Err())
		}
		defer func() { <-s.first }()
		if k := s.known.Load(); k != nil && !k.state.Sealing.Unused && now.UnixNano() < s.next.Load() {
			return nil // read meanwhile
		}
	}
	prev := s.known.Load()
	var st StoreState
	var err error
	if prev == nil {
		st, err = ReadStoreState(ctx, g.cfg.Store)
	} else {
		st, err = readStateAfter(ctx, g.cfg.Store, prev.state)
	}
	var tooNew *StoreTooNewError
	switch {
	case errors.As(err, &tooNew):
	case err != nil:
		s.next.Store(now.Add(storeStateRetry).UnixNano())
		return nil
	default:
		if err = st.refusal(); err == nil {
			break
		}
		errors.As(err, &tooNew)
	}
	if err == nil {
		// A store no call used yet is used now, and begins sealing at once under a
		// keyring (sealstate.go).
		if st, err = g.useStore(ctx, st); err != nil {
			return err // the next call tries again
		}
	}
	s.known.Store(&knownState{state: st, refusal: err, readAt: now})
	s.next.Store(now.Add(StoreStateRefresh).UnixNano())
	if err != nil {
		g.cfg.Logger.ErrorContext(ctx, "idem: refusing every request from now on: the store's state is newer than this release knows; "+
			"it writes nothing more to the store (answering 503 store_unavailable)", slog.Any("error", err))
		return err
	}
	if prev != nil && prev.state.Seq != st.Seq {
		g.cfg.Logger.InfoContext(ctx, "idem: the store's state changed", slog.Int("level", int(st.Level)),
			slog.String("sealing", string(st.Sealing.Phase)), slog.String("written_by", st.WrittenBy()))
	}
	g.recordServedDaily(ctx, now)
	return nil
}

// knownStoreState returns the store's state as the guard last read it, and false
// when it has not read it yet.
func (g *Guard) knownStoreState() (StoreState, bool) {
	if k := g.state.known.Load(); k != nil {
		return k.state, true
	}
	return StoreState{}, false
}

// recordServedDaily records, once a day, that this process's release serves the
// store (recordServed); the day the process started is left to the start sequence
// (CheckStore). A failure is tried again at the next read of the state.
func (g *Guard) recordServedDaily(ctx context.Context, now time.Time) {
	day := now.UTC().Format(time.DateOnly)
	last := g.state.servedDay.Load()
	if last == nil || *last == day {
		return
	}
	if err := recordServed(ctx, g.cfg.Store, now); err == nil {
		g.state.servedDay.Store(&day)
	}
}

// trimRevision shortens a VCS revision to 12 characters, keeping a "-dirty" mark.
func trimRevision(rev string, dirty bool) string {
	rev = rev[:min(len(rev), 12)]
	if dirty && rev != "" {
		rev += "-dirty"
	}
	return strings.TrimSpace(rev)
}
