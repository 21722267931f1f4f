package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// The cases of the store's state (SPEC §20): idem keeps its format level, its sealing
// state and the releases that served it as reserved records on the Store contract, so
// every store must keep them as the core expects: one writer of each state record,
// whatever the concurrency; a level newer than this release refused; a running guard
// learning a change; and idem's own records never deleted, resumed or counted as the
// records of requests.

func init() {
	register(
		testCase{"StoreStateConcurrentWritersWriteEachStateOnceAndLoseNoChange", testStateConcurrentWriters},
		testCase{"StoreStateNewerThanThisReleaseIsRefusedNamingBoth", testStateNewerRefused},
		testCase{"StoreStateChangeReachesARunningGuardWhichThenFailsClosed", testStateLazyRefresh},
		testCase{"StoreStateReservedRecordsAreNeverExpiredResumedOrCountedUnfinished", testStateReservedRecords},
	)
}

// writeFutureState writes the store's next state record as a later release would, at
// level.
func writeFutureState(t *testing.T, s idemstore.Store, level idem.FormatLevel, release string) {
	t.Helper()
	ctx := context.Background()
	cur, err := idem.ReadStoreState(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"level": level, "release": release, "written_at": time.Now().UTC(), "later_field": 1})
	key := fmt.Sprintf("state-%d", cur.Seq+1)
	p := &idemstore.ClaimParams{Scope: idemstore.ReservedScope, Key: key, Fingerprint: idem.FingerprintInput(release, nil),
		Token: newToken(), RecordID: earlierReleaseRecordID(), Lease: lease, TTL: idem.MaxTTL}
	res, err := s.RecordClaim(ctx, p)
	if err != nil || res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("writing %s: %+v, %v", key, res, err)
	}
	if err := s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: idemstore.ReservedScope, Key: key, Token: p.Token,
		Response: &idem.Response{Status: 200, Body: body}, TTL: idem.MaxTTL}); err != nil {
		t.Fatal(err)
	}
}

func testStateConcurrentWriters(t *testing.T, h Harness) {
	b := setup(t, h)
	start, err := idem.ReadStoreState(b.ctx, b.s)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const writers = 8
	var wg sync.WaitGroup
	seqs := make([]int, writers)
	for i := range writers {
		wg.Go(func() {
			st, err := idem.UpdateStoreState(b.ctx, b.s, func(s *idem.StoreState) error {
				at := s.Sealing.At
				if at.IsZero() {
					at = base
				}
				s.Sealing = idem.SealingState{Phase: idem.SealingBegun, At: at.Add(time.Second)}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
			seqs[i] = st.Seq
		})
	}
	wg.Wait()
	seen := map[int]bool{}
	for _, s := range seqs {
		if s <= start.Seq || s > start.Seq+writers || seen[s] {
			t.Fatalf("the writers wrote states %v after state-%d: want each of the next %d once", seqs, start.Seq, writers)
		}
		seen[s] = true
	}
	st, err := idem.ReadStoreState(b.ctx, b.s)
	if err != nil {
		t.Fatal(err)
	}
	if st.Seq != start.Seq+writers || !st.Sealing.At.Equal(base.Add(writers*time.Second)) || st.Level != start.Level {
		t.Fatalf("the store's state after %d writers: %+v, want state-%d with every writer's second added, at level %d",
			writers, st, start.Seq+writers, start.Level)
	}
}

func testStateNewerRefused(t *testing.T, h Harness) {
	b := setup(t, h)
	writeFutureState(t, b.s, idem.CurrentFormatLevel+1, "9.9.9")
	_, err := idem.CheckStore(b.ctx, b.s)
	var tooNew *idem.StoreTooNewError
	if !errors.As(err, &tooNew) || tooNew.State.Level != idem.CurrentFormatLevel+1 || tooNew.State.Release != "9.9.9" ||
		tooNew.Known != idem.CurrentFormatLevel || tooNew.Release != idem.Release {
		t.Fatalf("CheckStore on a store one level newer: %v, want a StoreTooNewError naming 9.9.9 and %s", err, idem.Release)
	}
	if _, err := idem.FinalizeUpgrade(b.ctx, b.s, idem.FinalizeOptions{}); !errors.Is(err, idem.ErrStoreTooNew) {
		t.Fatalf("FinalizeUpgrade on a store one level newer: %v, want ErrStoreTooNew", err)
	}
}

func testStateLazyRefresh(t *testing.T, h Harness) {
	b := setup(t, h)
	g, clock := b.guard()
	var runs int
	do := func(key string) error {
		_, _, err := idem.Do(b.ctx, g, idem.Call{Scope: b.scope, Key: key, Fingerprint: b.fp}, func(context.Context) (charge, error) {
			runs++
			return charge{ID: "ch_" + key}, nil
		})
		return err
	}
	if err := do("before"); err != nil {
		t.Fatal(err)
	}
	writeFutureState(t, b.s, idem.CurrentFormatLevel+1, "9.9.9")
	clock.Advance(idem.StoreStateRefresh)
	err := do("after")
	if !errors.Is(err, idem.ErrStoreUnavailable) || !errors.Is(err, idem.ErrStoreTooNew) {
		t.Fatalf("a call StoreStateRefresh after the level was raised: %v, want ErrStoreUnavailable (ErrStoreTooNew)", err)
	}
	if runs != 1 {
		t.Fatalf("%d runs, want 1: the call on a store whose level is newer ran", runs)
	}
	if _, err := b.s.RecordGet(b.ctx, &idemstore.GetParams{Scope: b.scope, Key: "after", Now: clock.Now()}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("the refused call left a record: %v", err)
	}
}

func testStateReservedRecords(t *testing.T, h Harness) {
	b := setup(t, h)
	if _, err := idem.UpdateStoreState(b.ctx, b.s, func(s *idem.StoreState) error {
		s.Sealing = idem.SealingState{Phase: idem.SealingBegun, At: time.Now().UTC()}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.CheckStore(b.ctx, b.s); err != nil {
		t.Fatal(err)
	}
	want, err := idem.ReadStoreState(b.ctx, b.s)
	if err != nil {
		t.Fatal(err)
	}
	// A year on: every record of requests would have expired; the state has not.
	later := time.Now().AddDate(1, 0, 0)
	if b.s.Capabilities().BatchedCleanup {
		if _, err := b.s.RecordDeleteExpired(b.ctx, &idemstore.DeleteExpiredParams{Limit: 1000, Now: later}); err != nil {
			t.Fatal(err)
		}
	}
	for seq := 1; seq <= want.Seq; seq++ {
		if _, err := b.s.RecordGet(b.ctx, &idemstore.GetParams{Scope: idemstore.ReservedScope, Key: fmt.Sprintf("state-%d", seq), Now: later}); err != nil {
			t.Fatalf("state-%d a year on, after a cleanup: %v, want it kept (it never expires)", seq, err)
		}
	}
	if b.s.Capabilities().RecoveryPoints {
		n, err := b.s.RecordCountUnfinished(b.ctx, &idemstore.CountUnfinishedParams{Now: later})
		if err != nil || n.Count != 0 {
			t.Fatalf("unfinished operations: %+v, %v; want none (idem's own records are completed)", n, err)
		}
		recs, err := b.s.RecordListResumable(b.ctx, &idemstore.ListResumableParams{Limit: 100, Now: later})
		if err != nil || len(recs) != 0 {
			t.Fatalf("resumable records: %d, %v; want none", len(recs), err)
		}
	}
}
