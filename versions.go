package idem

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// Release is this release of idem (SPEC §20). A process records it in its store
// ([CheckStore], and then once a day), and names it when it refuses a store whose
// format level is newer than it knows.
const Release = "0.3.0"

// ServedRetention is how long a store remembers that a release served it: the
// records of [CheckStore] expire this long after the day they name.
const ServedRetention = 35 * 24 * time.Hour

// maxServedSlots bounds the releases (and builds) recorded as serving a store on one
// day.
const maxServedSlots = 64

// buildRevision is the revision of a build made without the checkout's VCS
// information (scripts/build-static sets it with -X, as it sets cmd/idem's).
var buildRevision string

// revision is the VCS revision of this build (12 digits, "-dirty" when the checkout
// had changes), "" when the build did not record it.
var revision = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return trimRevision(buildRevision, false)
	}
	rev, dirty := buildRevision, false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	return trimRevision(rev, dirty)
})

// CheckStore is the first thing a program does with its store, before it serves
// (the start sequence, SPEC §20: open the store, migrate it when that is the
// program's job, CheckStore, then build the middleware or guard). It reads the
// store's state and refuses a store whose format level is newer than this release
// knows, naming both ([StoreTooNewError]); otherwise it records that this release
// (and build) serves the store today, so that `idem migrate` shows it and
// FinalizeUpgrade knows it, and returns the state. A running [Guard] reads the state
// again by itself every few seconds ([StoreStateRefresh]) and records its release once
// a day.
func CheckStore(ctx context.Context, store idemstore.Store) (StoreState, error) {
	st, err := ReadStoreState(ctx, store)
	if err != nil {
		return st, err
	}
	stateCacheFor(store, false).learned(st, time.Now())
	if err := st.refusal(); err != nil {
		return st, err
	}
	if err := recordServed(ctx, store, time.Now()); err != nil {
		return st, fmt.Errorf("idem: recording this release as serving the store: %w", err)
	}
	return st, nil
}

// ServedRelease is one release (and build) that served a store on one day.
type ServedRelease struct {
	// Release is the idem release, such as "0.3.0".
	Release string `json:"release"`
	// Revision is the build's VCS revision, when it was known.
	Revision string `json:"revision,omitempty"`
	// Level is the highest format level the release knows.
	Level FormatLevel `json:"level"`
	// Day is the day (UTC, 2006-01-02) it served the store.
	Day string `json:"-"`
	// At is when it first recorded itself that day.
	At time.Time `json:"at"`
}

// Name names the release and its build.
func (r ServedRelease) Name() string {
	if r.Revision != "" {
		return "idem " + r.Release + " (" + r.Revision + ")"
	}
	return "idem " + r.Release
}

// servedKey is the key of the record of the slot-th release that served the store
// on day.
func servedKey(day string, slot int) string { return "served/" + day + "/" + strconv.Itoa(slot) }

// servedFingerprint is the fingerprint of the records of one release and build: a
// slot of another is a key_reused claim, and the next slot is tried.
func servedFingerprint(release, rev string) Fingerprint {
	return Fingerprint{Version: idemstore.FingerprintVersion, Sum: sha256.Sum256([]byte("idem served\x00" + release + "\x00" + rev))}
}

// recordServed records that this release serves store on the day of now (UTC):
// in the first slot of the day that holds it already or is free (a claim each, one
// when it holds it). Nothing is written when it was recorded that day.
func recordServed(ctx context.Context, store idemstore.Store, now time.Time) error {
	day := now.UTC().Format(time.DateOnly)
	rev := revision()
	body, err := json.Marshal(ServedRelease{Release: Release, Revision: rev, Level: CurrentFormatLevel, At: now.UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	fp := servedFingerprint(Release, rev)
	for slot := 1; slot <= maxServedSlots; slot++ {
		_, err := keepReserved(ctx, store, servedKey(day, slot), fp, ServedRetention, body)
		if !errors.Is(err, ErrKeyReused) {
			return err
		}
	}
	return fmt.Errorf("idem: %d releases served the store on %s already; not recording more", maxServedSlots, day)
}

// ServedReleases returns the releases that recorded themselves as serving store on
// the days (UTC) of the last days days up to now, today first. idem 0.2.0 and older
// do not record themselves: they are never listed.
func ServedReleases(ctx context.Context, store idemstore.Store, now time.Time, days int) ([]ServedRelease, error) {
	var out []ServedRelease
	for d := range days {
		day := now.UTC().AddDate(0, 0, -d).Format(time.DateOnly)
		for slot := 1; slot <= maxServedSlots; slot++ {
			rec, err := store.RecordGet(ctx, &idemstore.GetParams{Scope: idemstore.ReservedScope, Key: servedKey(day, slot)})
			if errors.Is(err, idemstore.ErrNotFound) {
				break
			}
			if err != nil {
				return out, fmt.Errorf("idem: reading the releases that served the store: %w", err)
			}
			if rec.State != idemstore.StateCompleted || rec.Response == nil {
				continue // being recorded
			}
			var r ServedRelease
			if json.Unmarshal(rec.Response.Body, &r) != nil || r.Release == "" {
				continue
			}
			r.Day = day
			out = append(out, r)
		}
	}
	return out, nil
}

// FinalizeOptions are the options of [FinalizeUpgrade].
type FinalizeOptions struct {
	// Force finalizes even though a release that does not know this release's level
	// served the store in the last day.
	Force bool
	// Now, when non-zero, replaces the clock that picks the days whose records are
	// read (tests only).
	Now time.Time
}

// FinalizeResult is the answer of [FinalizeUpgrade].
type FinalizeResult struct {
	// Before and After are the store's state before and after.
	Before, After StoreState
	// Older are the releases that do not know this release's level and served the
	// store today or yesterday (UTC): finalized past with Force, or the reason of an
	// [OlderReleaseError].
	Older []ServedRelease
}

// Changed reports whether FinalizeUpgrade raised the store's level (false when it
// was at this release's level already).
func (r *FinalizeResult) Changed() bool { return r.After.Level != r.Before.Level }

// FinalizeGivesUp says what finalizing an upgrade gives up, in the words `idem
// migrate --finalize` prints.
const FinalizeGivesUp = "finalizing gives up the rollback to idem 0.2.0 (and 0.1.0): from now on this release may write " +
	"the formats of format level 2 (sealed records), which those releases misread, and PostgreSQL drops the index of expiry their cleaner reads; " +
	"they do not check the store's level, " +
	"so nothing stops them but you: never start them on this store again. A rollback to another 0.3.x release stays safe."

// ErrOlderRelease is matched by the refusal of FinalizeUpgrade while a release that
// does not know this release's level served the store lately ([OlderReleaseError]).
var ErrOlderRelease = errors.New("idem: a release that does not know this release's format level served the store lately")

// OlderReleaseError is FinalizeUpgrade's refusal: releases that do not know this
// release's format level served the store today or yesterday (UTC). It matches
// [ErrOlderRelease].
type OlderReleaseError struct {
	// Releases are the older releases seen.
	Releases []ServedRelease
}

func (e *OlderReleaseError) Error() string {
	names := make([]string, 0, len(e.Releases))
	for _, r := range e.Releases {
		names = append(names, fmt.Sprintf("%s on %s", r.Name(), r.Day))
	}
	return fmt.Sprintf("idem: not finalizing: %s served the store lately, and knows format levels up to %d only; "+
		"finalize once no process of it serves the store (or force it, knowing that it would misread what this release then writes)",
		strings.Join(names, ", "), e.Releases[0].Level)
}

// Is reports whether target is [ErrOlderRelease].
func (e *OlderReleaseError) Is(target error) bool { return target == ErrOlderRelease }

// FinalizeUpgrade raises the store's format level to [CurrentFormatLevel] once the
// operator knows that every process serving the store runs this release (SPEC §20):
// from then on processes write this release's new formats ([Gates]), and a rollback
// to a release that does not know the level is given up ([FinalizeGivesUp]). It
// refuses ([OlderReleaseError]) while a release that does not know the level
// recorded itself as serving the store today or yesterday, unless opts.Force. idem
// 0.2.0 and older never record themselves: the operator must know that they are
// gone. A store at this level already is left as it is.
func FinalizeUpgrade(ctx context.Context, store idemstore.Store, opts FinalizeOptions) (*FinalizeResult, error) {
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	before, err := ReadStoreState(ctx, store)
	if err != nil {
		return nil, err
	}
	if err := before.refusal(); err != nil {
		return nil, err
	}
	res := &FinalizeResult{Before: before, After: before}
	if before.Level >= CurrentFormatLevel {
		return res, nil
	}
	served, err := ServedReleases(ctx, store, now, 2)
	if err != nil {
		return nil, err
	}
	for _, r := range served {
		if r.Level < CurrentFormatLevel && !slices.ContainsFunc(res.Older, func(o ServedRelease) bool { return o.Name() == r.Name() }) {
			res.Older = append(res.Older, r)
		}
	}
	if len(res.Older) > 0 && !opts.Force {
		return res, &OlderReleaseError{Releases: res.Older}
	}
	res.After, err = UpdateStoreState(ctx, store, func(s *StoreState) error {
		s.Level = max(s.Level, CurrentFormatLevel)
		return nil
	})
	return res, err
}
