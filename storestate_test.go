package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/memory"
)

// writeNewerState writes the store's next state record as a later release would: at
// level, by release.
func writeNewerState(t *testing.T, st idemstore.Store, level int, release string) {
	t.Helper()
	ctx := context.Background()
	cur, err := idem.ReadStoreState(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"level": level, "release": release, "written_at": time.Now().UTC(), "a_field_0.3.0_does_not_know": true})
	key := fmt.Sprintf("state-%d", cur.Seq+1)
	fp := idem.Fingerprint{Version: 1, Sum: [32]byte{'i', 'd', 'e', 'm', ' ', 's', 't', 'o', 'r', 'e', ' ', 's', 't', 'a', 't', 'e'}}
	res, err := st.RecordClaim(ctx, &idemstore.ClaimParams{Scope: idemstore.ReservedScope, Key: key, Fingerprint: fp,
		Token: "tok", RecordID: "rid", Lease: time.Minute, TTL: idem.MaxTTL})
	if err != nil || res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("claiming %s: %v %v", key, res, err)
	}
	if err := st.RecordComplete(ctx, &idemstore.CompleteParams{Scope: idemstore.ReservedScope, Key: key, Token: "tok",
		Response: &idem.Response{Status: 200, Body: body}, TTL: idem.MaxTTL}); err != nil {
		t.Fatal(err)
	}
}

// dropState deletes the store's state records, leaving it as idem 0.2.0 made it.
func dropState(t *testing.T, st *memory.Store) {
	t.Helper()
	for i := 1; ; i++ {
		err := st.RecordDelete(context.Background(), &admin.RecordDeleteParams{Scope: idemstore.ReservedScope, Key: fmt.Sprintf("state-%d", i), Force: true})
		if errors.Is(err, idemstore.ErrNotFound) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestANewStoreIsAtThisReleasesFormatLevel(t *testing.T) {
	t.Parallel()
	st, err := idem.ReadStoreState(context.Background(), memory.New())
	if err != nil {
		t.Fatal(err)
	}
	if st.Seq != 1 || st.Level != idem.CurrentFormatLevel || st.Release != idem.Release || st.WrittenAt.IsZero() {
		t.Fatalf("a new store's state: %+v, want state-1 at level %d written by %s", st, idem.CurrentFormatLevel, idem.Release)
	}
}

func TestAStoreWithoutStateIsAtFormatLevel1(t *testing.T) {
	t.Parallel()
	ms := memory.New()
	dropState(t, ms)
	st, err := idem.CheckStore(context.Background(), ms)
	if err != nil {
		t.Fatal(err)
	}
	if st.Seq != 0 || st.Level != idem.FormatLevel1 || !strings.Contains(st.WrittenBy(), "0.2.0") {
		t.Fatalf("a store without state: %+v (%s), want level 1 and no state record", st, st.WrittenBy())
	}
	if st.Allows(idem.GateSealedRecords) {
		t.Fatal("level 1 allows sealed records, which idem 0.2.0 replays as ciphertext")
	}
}

func TestEveryGateIsAtALevelAboveTheFirstThatThisReleaseKnows(t *testing.T) {
	t.Parallel()
	names := map[string]bool{}
	for _, g := range idem.Gates() {
		if g.Level() <= idem.FormatLevel1 || g.Level() > idem.CurrentFormatLevel || names[g.String()] || g.String() == "unknown gate" {
			t.Errorf("gate %d (%q) at level %d: want a named gate above level 1 and at most %d", g, g, g.Level(), idem.CurrentFormatLevel)
		}
		names[g.String()] = true
	}
	if !names["sealed records"] {
		t.Error(`no gate "sealed records": sealing must wait for level 2`)
	}
}

// Of concurrent writers of the store's state, one writes each state record; the others
// read it and apply their change on top, so that no change is lost.
func TestConcurrentStateWritersEachWriteOneStateNoneLost(t *testing.T) {
	t.Parallel()
	ms := memory.New()
	ctx := context.Background()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const writers = 12
	var wg sync.WaitGroup
	seqs := make(chan int, writers)
	for range writers {
		wg.Go(func() {
			st, err := idem.UpdateStoreState(ctx, ms, func(s *idem.StoreState) error {
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
			seqs <- st.Seq
		})
	}
	wg.Wait()
	close(seqs)
	var got []int
	for s := range seqs {
		got = append(got, s)
	}
	slices.Sort(got)
	for i, s := range got {
		if s != i+2 { // state-1 is the new store's
			t.Fatalf("writers wrote states %v, want each of 2..%d once", got, writers+1)
		}
	}
	st, err := idem.ReadStoreState(ctx, ms)
	if err != nil {
		t.Fatal(err)
	}
	if st.Seq != writers+1 || !st.Sealing.At.Equal(base.Add(writers*time.Second)) || st.Level != idem.CurrentFormatLevel {
		t.Fatalf("final state %+v, want state-%d with every writer's second added", st, writers+1)
	}
}

func TestAStateChangeThatChangesNothingWritesNothing(t *testing.T) {
	t.Parallel()
	ms := memory.New()
	st, err := idem.UpdateStoreState(context.Background(), ms, func(*idem.StoreState) error { return nil })
	if err != nil || st.Seq != 1 {
		t.Fatalf("UpdateStoreState without a change: %+v, %v; want state-1 as it was", st, err)
	}
	if _, err := idem.UpdateStoreState(context.Background(), ms, func(s *idem.StoreState) error { s.Level = idem.FormatLevel1; return nil }); err == nil {
		t.Fatal("lowering the store's level: no error; levels only go up")
	}
}

func TestAProcessRefusesAStoreWhoseLevelIsNewerNamingBothVersions(t *testing.T) {
	t.Parallel()
	ms := memory.New()
	writeNewerState(t, ms, 3, "0.4.0")
	_, err := idem.CheckStore(context.Background(), ms)
	var tooNew *idem.StoreTooNewError
	if !errors.Is(err, idem.ErrStoreTooNew) || !errors.As(err, &tooNew) {
		t.Fatalf("CheckStore on a level-3 store: %v, want ErrStoreTooNew", err)
	}
	for _, want := range []string{"format level 3", "idem 0.4.0", "this is idem " + idem.Release, "up to 2"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if _, err := idem.UpdateStoreState(context.Background(), ms, func(s *idem.StoreState) error { s.Sealing.Phase = idem.SealingBegun; return nil }); !errors.Is(err, idem.ErrStoreTooNew) {
		t.Fatalf("UpdateStoreState on a level-3 store: %v, want ErrStoreTooNew", err)
	}
	if _, err := idem.FinalizeUpgrade(context.Background(), ms, idem.FinalizeOptions{}); !errors.Is(err, idem.ErrStoreTooNew) {
		t.Fatalf("FinalizeUpgrade on a level-3 store: %v, want ErrStoreTooNew", err)
	}
}

// stateReads counts the reads of the store's state records.
// stateReads counts the reads of the store's state records, each taking delay (a
// store across a slow network).
type stateReads struct {
	*memory.Store
	reads atomic.Int64
	delay time.Duration
}

func (s *stateReads) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	if p.Scope == idemstore.ReservedScope && strings.HasPrefix(p.Key, "state-") {
		s.reads.Add(1)
		time.Sleep(s.delay)
	}
	return s.Store.RecordGet(ctx, p)
}

// A running guard learns that the store's level was raised above its own within
// StoreStateRefresh, by one read per interval at most, and then fails closed: every
// call gets ErrStoreUnavailable, nothing runs and nothing is written, and one ERROR
// names both versions.
func TestAGuardMeetsANewerLevelMidRunAndFailsClosed(t *testing.T) {
	t.Parallel()
	ms := &stateReads{Store: memory.New()}
	clk := testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	logs := &testkit.Buffer{}
	g := idem.NewGuard(idem.GuardConfig{Store: ms, Clock: clk.Now, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	ctx := context.Background()
	var runs atomic.Int64
	call := func(key string) error {
		_, _, err := idem.Do(ctx, g, idem.Call{Scope: "alice", Key: key, Fingerprint: idem.FingerprintInput(key, nil)}, func(context.Context) (int, error) {
			runs.Add(1)
			return 1, nil
		})
		return err
	}
	for i := range 50 {
		if err := call(fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := ms.reads.Load(); n != 2 {
		t.Fatalf("%d reads of the state in 50 calls within StoreStateRefresh, want 2 (state-1, and state-2 absent) at the first claim", n)
	}
	writeNewerState(t, ms.Store, 3, "0.4.0")
	if err := call("before-the-refresh"); err != nil {
		t.Fatalf("a call before the state is stale: %v, want it served under the state known", err)
	}
	clk.Advance(idem.StoreStateRefresh)
	before := runs.Load()
	for i := range 5 {
		err := call(fmt.Sprintf("after-%d", i))
		if !errors.Is(err, idem.ErrStoreUnavailable) || !errors.Is(err, idem.ErrStoreTooNew) {
			t.Fatalf("call %d after the level was raised: %v, want ErrStoreUnavailable and ErrStoreTooNew", i, err)
		}
	}
	if runs.Load() != before {
		t.Fatal("an operation ran on a store whose level is newer than this release knows")
	}
	if _, err := ms.RecordGet(ctx, &idemstore.GetParams{Scope: "alice", Key: "after-0"}); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("a refused call left a record: %v", err)
	}
	if n := ms.reads.Load(); n != 2+1+1 { // the newer state-2 found, state-3 absent; none after
		t.Errorf("%d reads of the state, want 4: the refusal is kept, not read again", n)
	}
	out := logs.String()
	if c := strings.Count(out, "level=ERROR"); c != 1 || !strings.Contains(out, "0.4.0") || !strings.Contains(out, "this is idem "+idem.Release) {
		t.Fatalf("logs: %d ERROR lines, want one naming both versions:\n%s", c, out)
	}
}

// A state read that fails does not fail the call: the guard goes on under the state it
// knows and reads it again a second later.
func TestAFailedStateReadIsRetriedAndDoesNotFailTheCall(t *testing.T) {
	t.Parallel()
	ms := &failingStateReads{Store: memory.New()}
	ms.fail.Store(true)
	clk := testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	g := idem.NewGuard(idem.GuardConfig{Store: ms, Clock: clk.Now, Logger: slog.New(slog.DiscardHandler)})
	do := func(key string) error {
		_, _, err := idem.Do(context.Background(), g, idem.Call{Scope: "alice", Key: key}, func(context.Context) (int, error) { return 1, nil })
		return err
	}
	// Nothing known of the store's state: nothing is claimed (the store may be
	// sealed, or newer), and the next call reads it again at once.
	if err := do("a"); !errors.Is(err, idem.ErrStoreUnavailable) {
		t.Fatalf("a call whose first state read failed: %v, want ErrStoreUnavailable", err)
	}
	ms.fail.Store(false)
	if err := do("a"); err != nil {
		t.Fatalf("a call once the state reads: %v", err)
	}
	// A state known: a failed read does not fail the call...
	ms.fail.Store(true)
	clk.Advance(idem.StoreStateRefresh)
	if err := do("b"); err != nil {
		t.Fatalf("a call whose state read failed, with a state known: %v", err)
	}
	ms.fail.Store(false)
	writeNewerState(t, ms, 3, "0.4.0")
	if err := do("c"); err != nil {
		t.Fatalf("a call within a second of the failed read: %v", err)
	}
	clk.Advance(time.Second)
	if err := do("d"); !errors.Is(err, idem.ErrStoreTooNew) {
		t.Fatalf("a call a second after the failed read: %v, want the state read again (ErrStoreTooNew)", err)
	}
}

// A state that could not be read again for stateValidity fails the calls closed: a
// process never acts for long on a state it cannot read (the begin of sealing would
// not reach it).
func TestAStateThatCannotBeReadAgainForLongFailsCallsClosed(t *testing.T) {
	t.Parallel()
	ms := &failingStateReads{Store: memory.New()}
	clk := testkit.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	g := idem.NewGuard(idem.GuardConfig{Store: ms, Clock: clk.Now, Logger: slog.New(slog.DiscardHandler)})
	do := func(key string) error {
		_, _, err := idem.Do(context.Background(), g, idem.Call{Scope: "alice", Key: key}, func(context.Context) (int, error) { return 1, nil })
		return err
	}
	if err := do("a"); err != nil {
		t.Fatal(err)
	}
	ms.fail.Store(true)
	clk.Advance(idem.StateValidity - time.Second)
	if err := do("b"); err != nil {
		t.Fatalf("a call within the state's validity: %v", err)
	}
	clk.Advance(2 * time.Second)
	if err := do("c"); !errors.Is(err, idem.ErrStoreUnavailable) {
		t.Fatalf("a call past the state's validity with no read since: %v, want ErrStoreUnavailable", err)
	}
	ms.fail.Store(false)
	clk.Advance(time.Second)
	if err := do("c"); err != nil {
		t.Fatalf("once the state reads again: %v", err)
	}
}

type failingStateReads struct {
	*memory.Store
	fail atomic.Bool
}

func (s *failingStateReads) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	if p.Scope == idemstore.ReservedScope && s.fail.Load() {
		return nil, errors.New("state read failed")
	}
	return s.Store.RecordGet(ctx, p)
}

func TestCheckStoreRecordsTheReleaseOnceADay(t *testing.T) {
	t.Parallel()
	ms := memory.New()
	ctx := context.Background()
	for range 3 {
		if _, err := idem.CheckStore(ctx, ms); err != nil {
			t.Fatal(err)
		}
	}
	served, err := idem.ServedReleases(ctx, ms, time.Now(), 35)
	if err != nil {
		t.Fatal(err)
	}
	if len(served) != 1 || served[0].Release != idem.Release || served[0].Level != idem.CurrentFormatLevel ||
		served[0].Day != time.Now().UTC().Format(time.DateOnly) {
		t.Fatalf("served: %+v, want this release once, today", served)
	}
	list, err := ms.RecordList(ctx, &admin.RecordListParams{})
	if err != nil || len(list.Records) != 0 {
		t.Fatalf("a list of every scope: %d records (%v), want none of idem's own", len(list.Records), err)
	}
	own, err := ms.RecordList(ctx, &admin.RecordListParams{Scope: idemstore.ReservedScope})
	if err != nil || len(own.Records) != 2 {
		t.Fatalf("a list of the reserved scope: %d records (%v), want state-1 and today's served record", len(own.Records), err)
	}
}

// servedAs records release (knowing levels up to level) as serving st today, in the
// next free slot, as that release's CheckStore would.
func servedAs(t *testing.T, st idemstore.Store, release string, level int, day time.Time) {
	t.Helper()
	ctx := context.Background()
	body, _ := json.Marshal(map[string]any{"release": release, "level": level, "at": day})
	for slot := 1; ; slot++ {
		key := fmt.Sprintf("served/%s/%d", day.UTC().Format(time.DateOnly), slot)
		res, err := st.RecordClaim(ctx, &idemstore.ClaimParams{Scope: idemstore.ReservedScope, Key: key,
			Fingerprint: idem.FingerprintInput(release, nil), Token: "tok", RecordID: "rid", Lease: time.Minute, TTL: idem.ServedRetention})
		if err != nil {
			t.Fatal(err)
		}
		if res.Outcome != idemstore.ClaimAcquired {
			continue
		}
		if err := st.RecordComplete(ctx, &idemstore.CompleteParams{Scope: idemstore.ReservedScope, Key: key, Token: "tok",
			Response: &idem.Response{Status: 200, Body: body}, TTL: idem.ServedRetention}); err != nil {
			t.Fatal(err)
		}
		return
	}
}

func TestFinalizeUpgradeRefusesWhileAnOlderReleaseServedTheStoreLately(t *testing.T) {
	t.Parallel()
	ms := memory.New()
	dropState(t, ms) // as 0.2.0 left it
	ctx := context.Background()
	now := time.Now()
	servedAs(t, ms, "0.2.9", 1, now.AddDate(0, 0, -1))
	if _, err := idem.CheckStore(ctx, ms); err != nil {
		t.Fatal(err)
	}
	res, err := idem.FinalizeUpgrade(ctx, ms, idem.FinalizeOptions{})
	if !errors.Is(err, idem.ErrOlderRelease) || !strings.Contains(err.Error(), "idem 0.2.9") || len(res.Older) != 1 {
		t.Fatalf("finalizing after 0.2.9 served yesterday: %v, want ErrOlderRelease naming it", err)
	}
	if st, _ := idem.ReadStoreState(ctx, ms); st.Level != idem.FormatLevel1 {
		t.Fatalf("a refused finalization left level %d", st.Level)
	}
	res, err = idem.FinalizeUpgrade(ctx, ms, idem.FinalizeOptions{Force: true})
	if err != nil || !res.Changed() || res.After.Level != idem.CurrentFormatLevel || res.After.Seq != 1 || len(res.Older) != 1 {
		t.Fatalf("forced: %+v, %v; want level %d in state-1, the older release named", res, err, idem.CurrentFormatLevel)
	}
	res, err = idem.FinalizeUpgrade(ctx, ms, idem.FinalizeOptions{})
	if err != nil || res.Changed() {
		t.Fatalf("finalizing again: %+v, %v; want nothing to do", res, err)
	}
}

func TestFinalizeUpgradeForgetsAnOlderReleaseSeenMoreThanADayAgo(t *testing.T) {
	t.Parallel()
	ms := memory.New()
	dropState(t, ms)
	now := time.Now()
	servedAs(t, ms, "0.2.9", 1, now.AddDate(0, 0, -2))
	servedAs(t, ms, idem.Release, int(idem.CurrentFormatLevel), now)
	res, err := idem.FinalizeUpgrade(context.Background(), ms, idem.FinalizeOptions{Now: now})
	if err != nil || res.After.Level != idem.CurrentFormatLevel || len(res.Older) != 0 {
		t.Fatalf("finalizing two days after 0.2.9 was last seen: %+v, %v", res, err)
	}
}

func TestTheReservedScopeIsNoCallsScope(t *testing.T) {
	t.Parallel()
	g := idem.NewGuard(idem.GuardConfig{Store: memory.New()})
	_, _, err := g.Begin(context.Background(), idem.Call{Scope: idemstore.ReservedScope, Key: "state-2", Fingerprint: idem.FingerprintInput("x", nil)})
	if !errors.Is(err, idem.ErrScopeRequired) {
		t.Fatalf("a call in the reserved scope: %v, want ErrScopeRequired", err)
	}
}

// Behind the middleware, on both kinds of route, a request that meets a store whose
// level was raised above this release's gets 503 store_unavailable, and its handler
// never runs.
func TestTheMiddlewareAnswers503OnAStoreWhoseLevelIsNewer(t *testing.T) {
	t.Parallel()
	for _, opts := range []idem.RouteOptions{{}, {ClaimInHandler: true}} {
		b := setup(t, nil)
		c := &counter{}
		h := b.mw.Route(opts)(c)
		if w := serve(h, req("POST", "/charges", "key-level-0001", `{"amount":1}`)); c.n.Load() != 1 || w.Code == 503 {
			t.Fatalf("ClaimInHandler %v: first request %d, its handler ran %d times", opts.ClaimInHandler, w.Code, c.n.Load())
		}
		writeNewerState(t, b.store.Store, 3, "0.4.0")
		b.clock.Advance(idem.StoreStateRefresh)
		before := c.n.Load()
		w := serve(h, req("POST", "/charges", "key-level-0002", `{"amount":1}`))
		wantCode(t, w, 503, "store_unavailable")
		if c.n.Load() != before {
			t.Fatalf("ClaimInHandler %v: the handler ran on a store whose level is newer", opts.ClaimInHandler)
		}
	}
}

// A burst of calls on a new store (no state known yet, the store unused) reads the
// state, and records its first use, once: the other calls wait for that reading
// instead of each reading and writing the same state. Each doing its own, through a
// small pool and a slow network, queued the claims past their deadline (503s in
// e2e's TestStoreLatencyKeepsExactlyOnce).
func TestABurstOfFirstCallsReadsTheStoresStateOnce(t *testing.T) {
	t.Parallel()
	ms := &stateReads{Store: memory.New(), delay: 20 * time.Millisecond}
	g := idem.NewGuard(idem.GuardConfig{Store: ms, Logger: slog.New(slog.DiscardHandler)})
	const calls = 32
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Go(func() {
			_, _, err := idem.Do(context.Background(), g, idem.Call{Scope: "alice", Key: fmt.Sprintf("k%d", i)},
				func(context.Context) (int, error) { return 1, nil })
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// state-1 (unused), state-2 absent; the first use written as state-2.
	if n := ms.reads.Load(); n > 3 {
		t.Fatalf("%d reads of the store's state by %d concurrent first calls, want 3 at most", n, calls)
	}
}
