// Package admintest is the conformance suite of [admin.Store]: every store package
// runs it unchanged against stores of its own, next to store/storetest's suite for
// [idemstore.Store]. A case that needs what a store declares it cannot do
// ([admin.Capabilities]) is skipped with a log line.
//
//	func TestAdminConformance(t *testing.T) {
//		admintest.Run(t, admintest.Harness{
//			NewStore: func(t *testing.T) admintest.Store { return openStore(t) },
//		})
//	}
package admintest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
)

// Store is a store under test: the request path's [idemstore.Store] writes the records
// that the [admin.Store] reads and deletes.
type Store interface {
	idemstore.Store
	admin.Store
}

// Harness is what a store package hands to [Run].
type Harness struct {
	// NewStore returns a fresh, empty store private to the calling test (its own
	// schema, file or key prefix), closed at t.Cleanup. The suite calls it once per
	// case, from parallel tests. Required.
	NewStore func(t *testing.T) Store
}

// Run runs the suite: one parallel subtest per case, named for the behaviour it
// checks.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.NewStore == nil {
		t.Fatal("admintest: Harness.NewStore is nil")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, setup(t, h))
		})
	}
}

const (
	lease = 10 * time.Second
	ttl   = time.Hour
)

// bundle is what one case works with: a fresh store, a random scope and the time t0 at
// which the case starts (near the real clock, in whole milliseconds, so that Redis's key
// TTLs stay sane and every store keeps the times exactly).
type bundle struct {
	t     *testing.T
	s     Store
	ctx   context.Context
	t0    time.Time
	scope string
}

func setup(t *testing.T, h Harness) *bundle {
	return &bundle{
		t: t, s: h.NewStore(t), ctx: t.Context(),
		t0:    time.Now().UTC().Truncate(time.Millisecond),
		scope: "scope-" + rand.Text(),
	}
}

func (b *bundle) at(d time.Duration) time.Time { return b.t0.Add(d) }

// claim claims (scope, key) at now and returns the claim's params (with its token).
func (b *bundle) claim(scope, key string, now time.Time) *idemstore.ClaimParams {
	b.t.Helper()
	fp := idem.Fingerprint{Version: idemstore.FingerprintVersion}
	_, _ = rand.Read(fp.Sum[:])
	p := &idemstore.ClaimParams{
		Scope: scope, Key: key, Fingerprint: fp, Token: "tok-" + rand.Text(),
		RecordID: "rec-" + rand.Text(), Lease: lease, TTL: ttl, Now: now,
	}
	res, err := b.s.RecordClaim(b.ctx, p)
	if err != nil {
		b.t.Fatalf("RecordClaim(%q, %q): %v", scope, key, err)
	}
	if res.Outcome != idemstore.ClaimAcquired {
		b.t.Fatalf("RecordClaim(%q, %q) = %v, want acquired", scope, key, res.Outcome)
	}
	return p
}

// complete claims (scope, key) at now and completes it with resp.
func (b *bundle) complete(scope, key string, now time.Time, resp *idem.Response) *idemstore.ClaimParams {
	b.t.Helper()
	p := b.claim(scope, key, now)
	err := b.s.RecordComplete(b.ctx, &idemstore.CompleteParams{
		Scope: scope, Key: key, Token: p.Token, Response: resp, TTL: ttl, Now: now,
	})
	if err != nil {
		b.t.Fatalf("RecordComplete(%q, %q): %v", scope, key, err)
	}
	return p
}

func (b *bundle) inspect(scope, key string, now time.Time, body bool) (*admin.RecordInspectResult, error) {
	return b.s.RecordInspect(b.ctx, &admin.RecordInspectParams{Scope: scope, Key: key, Body: body, Now: now})
}

// mustExist fails unless (scope, key) is still there.
func (b *bundle) mustExist(scope, key string) {
	b.t.Helper()
	if _, err := b.inspect(scope, key, b.t0, false); err != nil {
		b.t.Fatalf("RecordInspect(%q, %q): %v, want the record still there", scope, key, err)
	}
}

// mustBeGone fails unless (scope, key) is absent.
func (b *bundle) mustBeGone(scope, key string) {
	b.t.Helper()
	if res, err := b.inspect(scope, key, b.t0, false); !errors.Is(err, idemstore.ErrNotFound) {
		b.t.Fatalf("RecordInspect(%q, %q) = %+v, %v; want idem.ErrNotFound", scope, key, res, err)
	}
}

func okResponse(body string) *idem.Response {
	return &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(body)}
}

type testCase struct {
	name string
	run  func(t *testing.T, b *bundle)
}

var cases = []testCase{
	{"InspectShowsAnInFlightRecordAndItsLease", inspectInFlight},
	{"InspectShowsTheResponseSizeAndTheBodyOnlyWhenAsked", inspectCompleted},
	{"InspectFindsAnExpiredRecordUntilItIsDeleted", inspectExpired},
	{"InspectOfAnAbsentRecordIsNotFound", inspectAbsent},
	{"DeleteRemovesOneKeyAndTheKeyStartsAfresh", deleteOne},
	{"DeleteOfAnAbsentRecordIsNotFound", deleteAbsent},
	{"DeleteRefusesALiveLeaseUnlessForcedAndFencesTheHolder", deleteLive},
	{"DeleteOfALapsedLeaseNeedsNoForce", deleteLapsed},
	{"DeleteScopeLeavesOtherScopesUntouched", deleteScope},
	{"DeleteScopeRefusesAnEmptyScope", deleteScopeEmpty},
	{"ListPagesThroughAScopeInKeyOrder", listPages},
	{"ListFiltersByStateAndAcrossScopes", listFilters},
	{"ListLeavesOutIdemsOwnRecordsUnlessAskedForTheirScope", listReserved},
	{"ListSaysWhyWhenTheStoreCannotList", listUnsupported},
	{"ResolveReleasesAnOutcomeUnknownKey", resolveRelease},
	{"ResolveCompletesAnOutcomeUnknownKeyWithTheGivenResponse", resolveComplete},
	{"ResolveRefusesKeysWhoseOutcomeIsKnown", resolveRefuses},
	{"ListFindsTheKeysWhoseOutcomeIsUnknown", listUnknown},
	{"DeleteRefusesAnUnfinishedOperationUnlessAbandoned", deleteUnfinished},
	{"DeleteScopeKeepsUnfinishedOperationsUnlessAbandoned", deleteScopeUnfinished},
	{"ResolveSettlesAnUnfinishedOperation", resolveUnfinished},
	{"ListFindsTheUnfinishedOperations", listUnfinished},
	{"ResealReplacesSealedContentOnlyWhileItIsUnchanged", reseal},
}

// reseal: admin.Resealer.RecordReseal is a compare-and-swap of a record's body and
// steps, by its id, that changes nothing else.
func reseal(t *testing.T, b *bundle) {
	rs, ok := b.s.(admin.Resealer)
	if !ok {
		t.Skip("the store is not an admin.Resealer: idem keys rewrap refuses it")
	}
	p := b.complete(b.scope, "key-done", b.t0, okResponse(`old-body`))
	do := func(key, id string, oldBody, body, oldSteps, steps string) error {
		bs := func(s string) []byte {
			if s == "" {
				return nil
			}
			return []byte(s)
		}
		return rs.RecordReseal(b.ctx, &admin.RecordResealParams{Scope: b.scope, Key: key, ID: id,
			OldBody: bs(oldBody), Body: bs(body), OldSteps: bs(oldSteps), Steps: bs(steps)})
	}
	body := func(key string) *admin.Record {
		t.Helper()
		res, err := b.inspect(b.scope, key, b.t0, true)
		if err != nil {
			t.Fatal(err)
		}
		return res.Record
	}
	for _, bad := range []struct{ id, old string }{{p.RecordID, "other-body"}, {"rec-other", "old-body"}} {
		if err := do(p.Key, bad.id, bad.old, "new-body", "", ""); !errors.Is(err, admin.ErrRecordChanged) {
			t.Fatalf("RecordReseal of id %q over %q = %v, want admin.ErrRecordChanged", bad.id, bad.old, err)
		}
	}
	if r := body(p.Key); string(r.Body) != "old-body" {
		t.Fatalf("after refused reseals the body is %q", r.Body)
	}
	if err := do(p.Key, p.RecordID, "old-body", "new-body", "", ""); err != nil {
		t.Fatalf("RecordReseal: %v", err)
	}
	r := body(p.Key)
	if string(r.Body) != "new-body" || r.State != idemstore.StateCompleted || r.Status != 201 || !r.ExpiresAt.Equal(b.at(ttl)) ||
		r.Header.Get("Content-Type") != "application/json" || r.Fingerprint != p.Fingerprint {
		t.Fatalf("after RecordReseal: %+v; want the new body and nothing else changed", r)
	}

	u := b.unfinished(b.scope, "key-unfinished", b.t0)
	old := `[{"step":"charge_pending","result":{"id":"ch_1"}}]`
	if err := do(u.Key, u.RecordID, "", "", "other", "new-steps"); !errors.Is(err, admin.ErrRecordChanged) {
		t.Fatalf("RecordReseal of changed steps = %v, want admin.ErrRecordChanged", err)
	}
	if err := do(u.Key, u.RecordID, "", "", old, "new-steps"); err != nil {
		t.Fatalf("RecordReseal of steps: %v", err)
	}
	if r := body(u.Key); string(r.Steps) != "new-steps" || r.RecoveryPoint != "charge_pending" || r.State != idemstore.StateInFlight {
		t.Fatalf("after RecordReseal of steps: %+v", r)
	}
	if err := do("key-absent", "rec-x", "a", "b", "", ""); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordReseal of an absent record = %v, want idemstore.ErrNotFound", err)
	}
}

func inspectInFlight(t *testing.T, b *bundle) {
	p := b.claim(b.scope, "key-inflight", b.t0)
	res, err := b.inspect(b.scope, p.Key, b.at(time.Second), false)
	if err != nil {
		t.Fatal(err)
	}
	r := res.Record
	want := admin.Record{
		Scope: b.scope, Key: p.Key, ID: p.RecordID, State: idemstore.StateInFlight, Fingerprint: p.Fingerprint,
		CreatedAt: b.t0, ExpiresAt: b.at(ttl), LeaseEnd: b.at(lease),
	}
	if r.Scope != want.Scope || r.Key != want.Key || r.ID != want.ID || r.State != want.State ||
		r.Fingerprint != want.Fingerprint || !r.CreatedAt.Equal(want.CreatedAt) ||
		!r.ExpiresAt.Equal(want.ExpiresAt) || !r.LeaseEnd.Equal(want.LeaseEnd) || r.Status != 0 || r.BodySize != 0 {
		t.Fatalf("RecordInspect = %+v\nwant %+v", r, want)
	}
	if !res.Now.Equal(b.at(time.Second)) || !r.LeaseLive(res.Now) || r.Expired(res.Now) {
		t.Fatalf("at %v: live lease %v, expired %v; want the injected now, a live lease, not expired", res.Now, r.LeaseLive(res.Now), r.Expired(res.Now))
	}
}

func inspectCompleted(t *testing.T, b *bundle) {
	resp := okResponse(`{"id":"ch_1"}`)
	p := b.complete(b.scope, "key-done", b.t0, resp)
	res, err := b.inspect(b.scope, p.Key, b.t0, false)
	if err != nil {
		t.Fatal(err)
	}
	r := res.Record
	if r.State != idemstore.StateCompleted || r.Status != 201 || r.BodySize != len(resp.Body) || r.NotStored ||
		!r.LeaseEnd.IsZero() || !r.ExpiresAt.Equal(b.at(ttl)) {
		t.Fatalf("RecordInspect = %+v, want completed, 201, %d bytes, no lease, expiring after the TTL", r, len(resp.Body))
	}
	if r.Body != nil || r.Header != nil {
		t.Fatalf("RecordInspect without Body returned the body %q and headers %v", r.Body, r.Header)
	}
	res, err = b.inspect(b.scope, p.Key, b.t0, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Record; string(got.Body) != string(resp.Body) || got.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("RecordInspect with Body: body %q, headers %v; want %q and the stored Content-Type", got.Body, got.Header, resp.Body)
	}
}

func inspectExpired(t *testing.T, b *bundle) {
	p := b.complete(b.scope, "key-expired", b.t0, okResponse("x"))
	later := b.at(ttl + time.Minute)
	res, err := b.inspect(b.scope, p.Key, later, false)
	if err != nil {
		t.Fatalf("RecordInspect of an expired record not deleted yet: %v", err)
	}
	if !res.Record.Expired(res.Now) {
		t.Fatalf("record expiring at %v is not expired at %v", res.Record.ExpiresAt, res.Now)
	}
}

func inspectAbsent(t *testing.T, b *bundle) {
	b.mustBeGone(b.scope, "key-never")
}

func deleteOne(t *testing.T, b *bundle) {
	other := b.scope + "-other"
	p := b.complete(b.scope, "key-a", b.t0, okResponse("a"))
	b.complete(b.scope, "key-b", b.t0, okResponse("b"))
	b.complete(other, "key-a", b.t0, okResponse("a"))
	if err := b.s.RecordDelete(b.ctx, &admin.RecordDeleteParams{Scope: b.scope, Key: p.Key, Now: b.t0}); err != nil {
		t.Fatal(err)
	}
	b.mustBeGone(b.scope, "key-a")
	b.mustExist(b.scope, "key-b")
	b.mustExist(other, "key-a")
	// The key is free: the next request executes afresh.
	b.claim(b.scope, "key-a", b.t0)
}

func deleteAbsent(t *testing.T, b *bundle) {
	err := b.s.RecordDelete(b.ctx, &admin.RecordDeleteParams{Scope: b.scope, Key: "key-never", Now: b.t0})
	if !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("RecordDelete of an absent record: %v, want idem.ErrNotFound", err)
	}
}

func deleteLive(t *testing.T, b *bundle) {
	p := b.claim(b.scope, "key-live", b.t0)
	err := b.s.RecordDelete(b.ctx, &admin.RecordDeleteParams{Scope: b.scope, Key: p.Key, Now: b.at(time.Second)})
	if !errors.Is(err, admin.ErrLeaseLive) {
		t.Fatalf("RecordDelete under a live lease: %v, want admin.ErrLeaseLive", err)
	}
	b.mustExist(b.scope, p.Key)
	err = b.s.RecordDelete(b.ctx, &admin.RecordDeleteParams{Scope: b.scope, Key: p.Key, Force: true, Now: b.at(time.Second)})
	if err != nil {
		t.Fatalf("RecordDelete forced: %v", err)
	}
	b.mustBeGone(b.scope, p.Key)
	err = b.s.RecordComplete(b.ctx, &idemstore.CompleteParams{
		Scope: b.scope, Key: p.Key, Token: p.Token, Response: okResponse("late"), TTL: ttl, Now: b.at(2 * time.Second),
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the holder's completion after a forced delete: %v, want idem.ErrLeaseLost", err)
	}
}

func deleteLapsed(t *testing.T, b *bundle) {
	p := b.claim(b.scope, "key-lapsed", b.t0)
	if err := b.s.RecordDelete(b.ctx, &admin.RecordDeleteParams{Scope: b.scope, Key: p.Key, Now: b.at(lease + time.Second)}); err != nil {
		t.Fatalf("RecordDelete after the lease lapsed: %v", err)
	}
	b.mustBeGone(b.scope, p.Key)
}

func deleteScope(t *testing.T, b *bundle) {
	// The other scopes share keys with the doomed one, and one has the doomed scope's
	// name as a prefix: nothing of theirs may go.
	others := []string{b.scope + "0", "other-" + rand.Text()}
	var doomed []string
	for i := range 7 {
		key := fmt.Sprintf("key-%02d", i)
		doomed = append(doomed, key)
		switch i % 3 {
		case 0:
			b.complete(b.scope, key, b.t0, okResponse("done"))
		case 1:
			b.claim(b.scope, key, b.t0.Add(-2*lease)) // lapsed lease
		case 2:
			b.complete(b.scope, key, b.t0.Add(-2*ttl), okResponse("expired")) // expired, not deleted
		}
		for _, o := range others {
			b.complete(o, key, b.t0, okResponse("keep"))
		}
	}
	live := b.claim(b.scope, "key-live", b.t0)

	res, err := b.s.RecordDeleteScope(b.ctx, &admin.RecordDeleteScopeParams{Scope: b.scope, BatchSize: 2, Now: b.at(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != len(doomed) || res.Kept != 1 {
		t.Fatalf("RecordDeleteScope = %+v, want %d deleted and the live one kept", res, len(doomed))
	}
	for _, key := range doomed {
		b.mustBeGone(b.scope, key)
		for _, o := range others {
			b.mustExist(o, key)
		}
	}
	b.mustExist(b.scope, live.Key)

	res, err = b.s.RecordDeleteScope(b.ctx, &admin.RecordDeleteScopeParams{Scope: b.scope, Force: true, Now: b.at(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 1 || res.Kept != 0 {
		t.Fatalf("RecordDeleteScope forced = %+v, want the live one deleted", res)
	}
	b.mustBeGone(b.scope, live.Key)
	for _, key := range doomed {
		for _, o := range others {
			b.mustExist(o, key)
		}
	}
}

func deleteScopeEmpty(t *testing.T, b *bundle) {
	b.complete(b.scope, "key-kept", b.t0, okResponse("x"))
	if _, err := b.s.RecordDeleteScope(b.ctx, &admin.RecordDeleteScopeParams{Now: b.t0}); err == nil {
		t.Fatal("RecordDeleteScope with no scope succeeded, want an error")
	}
	b.mustExist(b.scope, "key-kept")
}

// needList skips a case on a store that declares it cannot list.
func needList(t *testing.T, b *bundle) {
	if !b.s.AdminCapabilities().List {
		t.Skip("the store cannot list (admin.Capabilities.List is false)")
	}
}

// listAll lists with p page by page and returns the keys in order, checking that each
// page but the last is full and says More.
func listAll(t *testing.T, b *bundle, p admin.RecordListParams) []*admin.Record {
	t.Helper()
	var all []*admin.Record
	for page := 0; ; page++ {
		if page > 100 {
			t.Fatal("RecordList never ends")
		}
		res, err := b.s.RecordList(b.ctx, &p)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, res.Records...)
		if !res.More {
			return all
		}
		if len(res.Records) != p.Limit {
			t.Fatalf("page %d has %d records and More, want %d", page, len(res.Records), p.Limit)
		}
		last := res.Records[len(res.Records)-1]
		p.AfterScope, p.AfterKey = last.Scope, last.Key
	}
}

func keysOf(recs []*admin.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.Scope+"/"+r.Key)
	}
	return out
}

func listPages(t *testing.T, b *bundle) {
	needList(t, b)
	var want []string
	for i := range 5 {
		key := fmt.Sprintf("key-%02d", 4-i) // created out of order
		b.complete(b.scope, key, b.t0, okResponse("body"))
	}
	for i := range 5 {
		want = append(want, b.scope+"/"+fmt.Sprintf("key-%02d", i))
	}
	b.complete(b.scope+"0", "key-00", b.t0, okResponse("other"))

	recs := listAll(t, b, admin.RecordListParams{Scope: b.scope, Limit: 2, Now: b.t0})
	if got := keysOf(recs); !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	for _, r := range recs {
		if r.State != idemstore.StateCompleted || r.Status != 201 || r.BodySize != 4 || r.Body != nil || r.Header != nil {
			t.Fatalf("listed %+v, want completed, 201, 4 bytes and never the body", r)
		}
	}
}

func listFilters(t *testing.T, b *bundle) {
	needList(t, b)
	a, z := "a-"+b.scope, "z-"+b.scope
	b.complete(a, "key-1", b.t0, okResponse("1"))
	b.claim(a, "key-2", b.t0)
	b.complete(a, "key-3", b.t0, okResponse("3"))
	b.claim(z, "key-1", b.t0)
	b.complete(z, "key-2", b.t0, okResponse("2"))

	inFlight := listAll(t, b, admin.RecordListParams{Scope: a, State: idemstore.StateInFlight, Limit: 10, Now: b.t0})
	if got := keysOf(inFlight); !slices.Equal(got, []string{a + "/key-2"}) || !inFlight[0].LeaseEnd.Equal(b.at(lease)) {
		t.Fatalf("in flight in %s: %v, want key-2 with its lease", a, got)
	}
	// The store is the case's own: without a scope it lists exactly these, across
	// scopes in (scope, key) order, page boundaries between scopes included.
	all := listAll(t, b, admin.RecordListParams{Limit: 2, Now: b.t0})
	want := []string{a + "/key-1", a + "/key-2", a + "/key-3", z + "/key-1", z + "/key-2"}
	if got := keysOf(all); !slices.Equal(got, want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	done := listAll(t, b, admin.RecordListParams{State: idemstore.StateCompleted, Limit: 10, Now: b.t0})
	if got := keysOf(done); !slices.Equal(got, []string{a + "/key-1", a + "/key-3", z + "/key-2"}) {
		t.Fatalf("completed: %v", got)
	}
}

// listReserved: idem's own records (the store's state, the releases that served it,
// SPEC §20) are not records of requests: a list of every scope leaves them out, a
// list of the reserved scope shows them.
func listReserved(t *testing.T, b *bundle) {
	needList(t, b)
	if _, err := idem.CheckStore(b.ctx, b.s); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.FinalizeUpgrade(b.ctx, b.s, idem.FinalizeOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	b.complete(b.scope, "key-1", b.t0, okResponse("1"))
	all := listAll(t, b, admin.RecordListParams{Limit: 1, Now: b.t0})
	if got := keysOf(all); !slices.Equal(got, []string{b.scope + "/key-1"}) {
		t.Fatalf("a list of every scope: %q, want the request's record only", got)
	}
	own := listAll(t, b, admin.RecordListParams{Scope: idemstore.ReservedScope, Limit: 10, Now: b.t0})
	if len(own) < 2 {
		t.Fatalf("a list of the reserved scope: %q, want the store's state and the release that served it", keysOf(own))
	}
}

func listUnsupported(t *testing.T, b *bundle) {
	if b.s.AdminCapabilities().List {
		t.Skip("the store can list")
	}
	_, err := b.s.RecordList(b.ctx, &admin.RecordListParams{Scope: b.scope, Now: b.t0})
	if !errors.Is(err, errors.ErrUnsupported) || err.Error() == errors.ErrUnsupported.Error() {
		t.Fatalf("RecordList on a store that cannot list: %v, want an error wrapping errors.ErrUnsupported that says why", err)
	}
}

// unknown leaves (scope, key) completed as outcome unknown: its holder claimed it at
// t0 and died, and a claim under the policy unknown found its lease lapsed.
func (b *bundle) unknown(scope, key string) *idemstore.ClaimParams {
	b.t.Helper()
	dead := b.claim(scope, key, b.t0)
	p := *dead
	p.Token, p.OnLapse, p.Now = "tok-"+rand.Text(), idem.LapseUnknown, b.at(lease+time.Second)
	res, err := b.s.RecordClaim(b.ctx, &p)
	if err != nil || res.Outcome != idemstore.ClaimCompleted || !res.MarkedUnknown {
		b.t.Fatalf("claim under the policy unknown after the lease lapsed = %+v, %v; want the record marked outcome unknown", res, err)
	}
	return dead
}

// resolve resolves (scope, key) with resp (nil: release) at now.
func (b *bundle) resolve(scope, key string, resp *idem.Response, now time.Time) error {
	return b.s.RecordResolve(b.ctx, &admin.RecordResolveParams{Scope: scope, Key: key, Response: resp, Now: now})
}

func resolveRelease(t *testing.T, b *bundle) {
	dead := b.unknown(b.scope, "key")
	now := b.at(lease + 2*time.Second)
	res, err := b.inspect(b.scope, "key", now, false)
	if err != nil || !res.Record.OutcomeUnknown || res.Record.State != idemstore.StateCompleted || res.Record.Status != 500 {
		t.Fatalf("inspected %+v, %v; want completed, 500, outcome unknown", res, err)
	}
	if err := b.resolve(b.scope, "key", nil, now); err != nil {
		t.Fatalf("RecordResolve (release): %v", err)
	}
	if _, err := b.inspect(b.scope, "key", now, false); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("record after the release: %v, want gone", err)
	}
	// The next request executes afresh: a new record.
	retry := *dead
	retry.Token, retry.RecordID, retry.Now = "tok-"+rand.Text(), "rec-"+rand.Text(), now
	got, err := b.s.RecordClaim(b.ctx, &retry)
	if err != nil || got.Outcome != idemstore.ClaimAcquired || got.TookOver || got.Record.ID != retry.RecordID {
		t.Fatalf("claim after the release = %+v, %v; want a fresh claim", got, err)
	}
}

func resolveComplete(t *testing.T, b *bundle) {
	dead := b.unknown(b.scope, "key")
	now := b.at(lease + 2*time.Second)
	resp := okResponse(`{"id":"ch_1","status":"succeeded"}`)
	if err := b.resolve(b.scope, "key", resp, now); err != nil {
		t.Fatalf("RecordResolve (complete): %v", err)
	}
	// Every repeat gets the operator's response, under any policy.
	retry := *dead
	retry.Token, retry.OnLapse, retry.Now = "tok-"+rand.Text(), idem.LapseUnknown, now
	got, err := b.s.RecordClaim(b.ctx, &retry)
	if err != nil || got.Outcome != idemstore.ClaimCompleted || got.MarkedUnknown || !got.Record.Response.Equal(resp) {
		t.Fatalf("claim after the resolution = %+v, %v; want the resolved response replayed", got, err)
	}
	res, err := b.inspect(b.scope, "key", now, true)
	if err != nil || res.Record.OutcomeUnknown || !res.Record.ExpiresAt.Equal(b.at(ttl)) {
		t.Fatalf("inspected %+v, %v; want its outcome known, expiring at created + TTL still", res, err)
	}
	if err := b.resolve(b.scope, "key", nil, now); !errors.Is(err, admin.ErrNotOutcomeUnknown) {
		t.Fatalf("resolving it again = %v, want admin.ErrNotOutcomeUnknown", err)
	}
}

func resolveRefuses(t *testing.T, b *bundle) {
	b.complete(b.scope, "done", b.t0, okResponse("1"))
	b.claim(b.scope, "running", b.t0)
	b.unknown(b.scope, "expiring")
	for key, want := range map[string]error{"done": admin.ErrNotOutcomeUnknown, "running": admin.ErrNotOutcomeUnknown, "absent": idemstore.ErrNotFound} {
		for _, resp := range []*idem.Response{nil, okResponse("x")} {
			if err := b.resolve(b.scope, key, resp, b.at(time.Second)); !errors.Is(err, want) {
				t.Errorf("RecordResolve of %s (response %v) = %v, want %v", key, resp != nil, err, want)
			}
		}
	}
	if err := b.resolve(b.scope, "expiring", nil, b.at(ttl)); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("RecordResolve of an expired record = %v, want idem.ErrNotFound", err)
	}
	if err := b.resolve(b.scope+"-other", "expiring", nil, b.at(time.Minute)); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("RecordResolve in another scope = %v, want idem.ErrNotFound", err)
	}
	res, err := b.inspect(b.scope, "done", b.at(time.Second), true)
	if err != nil || string(res.Record.Body) != "1" || res.Record.OutcomeUnknown {
		t.Fatalf("completed record after refused resolutions: %+v, %v", res, err)
	}
	b.mustExist(b.scope, "running")
}

func listUnknown(t *testing.T, b *bundle) {
	needList(t, b)
	b.unknown(b.scope, "key-1")
	b.complete(b.scope, "key-2", b.t0, okResponse("2"))
	b.unknown(b.scope, "key-3")
	b.claim(b.scope, "key-4", b.t0)
	now := b.at(lease + 2*time.Second)
	got := listAll(t, b, admin.RecordListParams{Scope: b.scope, State: admin.StateOutcomeUnknown, Limit: 10, Now: now})
	if keys := keysOf(got); !slices.Equal(keys, []string{b.scope + "/key-1", b.scope + "/key-3"}) {
		t.Fatalf("outcome unknown: %v, want key-1 and key-3", keys)
	}
	for _, r := range got {
		if !r.OutcomeUnknown || r.State != idemstore.StateCompleted || r.Status != 500 {
			t.Fatalf("listed %+v, want completed, 500, outcome unknown", r)
		}
	}
	all := listAll(t, b, admin.RecordListParams{State: admin.StateOutcomeUnknown, Limit: 1, Now: now})
	if len(all) != 2 {
		t.Fatalf("outcome unknown across scopes, a page of 1 at a time: %v", keysOf(all))
	}
	done := listAll(t, b, admin.RecordListParams{Scope: b.scope, State: idemstore.StateCompleted, Limit: 10, Now: now})
	if len(done) != 3 {
		t.Fatalf("completed: %v, want the 3 completed records, outcome unknown or not", keysOf(done))
	}
}

// needRecoveryPoints skips a case on a store that keeps no recovery points: it has no
// unfinished operations.
func needRecoveryPoints(t *testing.T, b *bundle) {
	if !b.s.Capabilities().RecoveryPoints {
		t.Skip("the store keeps no recovery points (idem.Capabilities.RecoveryPoints is false): no operation is ever unfinished")
	}
}

// unfinished leaves (scope, key) an unfinished operation (SPEC §13): claimed at now,
// its step charge_pending committed; its holder's lease lapses at now + lease.
func (b *bundle) unfinished(scope, key string, now time.Time) *idemstore.ClaimParams {
	b.t.Helper()
	p := b.claim(scope, key, now)
	err := b.s.RecordStep(b.ctx, &idemstore.StepParams{Scope: scope, Key: key, Token: p.Token,
		RecoveryPoint: "charge_pending", Steps: []byte(`[{"step":"charge_pending","result":{"id":"ch_1"}}]`), Operation: "charges.create"})
	if err != nil {
		b.t.Fatalf("RecordStep(%q, %q): %v", scope, key, err)
	}
	return p
}

func (b *bundle) delete(key string, now time.Time, force, abandon bool) error {
	return b.s.RecordDelete(b.ctx, &admin.RecordDeleteParams{Scope: b.scope, Key: key, Force: force, Abandon: abandon, Now: now})
}

func deleteUnfinished(t *testing.T, b *bundle) {
	needRecoveryPoints(t, b)
	lapsed := b.unfinished(b.scope, "key-lapsed", b.t0)
	live := b.unfinished(b.scope, "key-live", b.at(ttl))
	now := b.at(ttl + time.Second) // past the first one's TTL: it never expires

	for _, force := range []bool{false, true} {
		if err := b.delete(lapsed.Key, now, force, false); !errors.Is(err, admin.ErrUnfinished) {
			t.Fatalf("RecordDelete of an unfinished operation (force %v) = %v, want admin.ErrUnfinished", force, err)
		}
	}
	b.mustExist(b.scope, lapsed.Key)
	if err := b.delete(lapsed.Key, now, false, true); err != nil {
		t.Fatalf("RecordDelete abandoning the unfinished operation: %v", err)
	}
	b.mustBeGone(b.scope, lapsed.Key)
	// The key starts a new operation: a new record id.
	if fresh := b.claim(b.scope, lapsed.Key, now); fresh.RecordID == lapsed.RecordID {
		t.Fatal("test bug: the fresh claim reused the record id")
	}

	// Under a live lease it needs both.
	if err := b.delete(live.Key, now, false, true); !errors.Is(err, admin.ErrLeaseLive) {
		t.Fatalf("RecordDelete abandoning an unfinished operation at work = %v, want admin.ErrLeaseLive", err)
	}
	if err := b.delete(live.Key, now, true, false); !errors.Is(err, admin.ErrUnfinished) {
		t.Fatalf("RecordDelete forcing an unfinished operation at work = %v, want admin.ErrUnfinished", err)
	}
	b.mustExist(b.scope, live.Key)
	if err := b.delete(live.Key, now, true, true); err != nil {
		t.Fatalf("RecordDelete forcing and abandoning: %v", err)
	}
	b.mustBeGone(b.scope, live.Key)
}

func deleteScopeUnfinished(t *testing.T, b *bundle) {
	needRecoveryPoints(t, b)
	now := b.at(2 * ttl)
	b.complete(b.scope, "key-done", now, okResponse("done"))
	b.unfinished(b.scope, "key-unfinished", b.t0)
	b.unfinished(b.scope, "key-unfinished-live", now)
	b.claim(b.scope, "key-live", now)
	other := b.scope + "-other"
	b.unfinished(other, "key-unfinished", b.t0)

	for _, step := range []struct {
		force, abandon bool
		want           admin.RecordDeleteScopeResult
	}{
		{false, false, admin.RecordDeleteScopeResult{Deleted: 1, Kept: 1, Unfinished: 2}},
		{true, false, admin.RecordDeleteScopeResult{Deleted: 1, Unfinished: 2}},
		{false, true, admin.RecordDeleteScopeResult{Deleted: 1, Kept: 1}},
		{true, true, admin.RecordDeleteScopeResult{Deleted: 1}},
	} {
		res, err := b.s.RecordDeleteScope(b.ctx, &admin.RecordDeleteScopeParams{Scope: b.scope, Force: step.force, Abandon: step.abandon, Now: now})
		if err != nil || *res != step.want {
			t.Fatalf("RecordDeleteScope (force %v, abandon %v) = %+v, %v; want %+v", step.force, step.abandon, res, err, step.want)
		}
	}
	b.mustExist(other, "key-unfinished")
}

func resolveUnfinished(t *testing.T, b *bundle) {
	needRecoveryPoints(t, b)
	released := b.unfinished(b.scope, "key-released", b.t0)
	completed := b.unfinished(b.scope, "key-completed", b.t0)
	live := b.unfinished(b.scope, "key-live", b.at(ttl))
	now := b.at(ttl + time.Second)

	if err := b.resolve(b.scope, released.Key, nil, now); err != nil {
		t.Fatalf("RecordResolve (release) of an unfinished operation: %v", err)
	}
	b.mustBeGone(b.scope, released.Key)

	resp := okResponse(`{"id":"ch_1","status":"succeeded"}`)
	if err := b.resolve(b.scope, completed.Key, resp, now); err != nil {
		t.Fatalf("RecordResolve (complete) of an unfinished operation: %v", err)
	}
	retry := *completed
	retry.Token, retry.Now = "tok-"+rand.Text(), now
	got, err := b.s.RecordClaim(b.ctx, &retry)
	if err != nil || got.Outcome != idemstore.ClaimCompleted || !got.Record.Response.Equal(resp) || got.Record.ID != completed.RecordID {
		t.Fatalf("claim after the resolution = %+v, %v; want the operator's response replayed", got, err)
	}
	res, err := b.inspect(b.scope, completed.Key, now, false)
	if err != nil || res.Record.State != idemstore.StateCompleted || !res.Record.LeaseEnd.IsZero() || !res.Record.ExpiresAt.Equal(now.Add(ttl)) {
		t.Fatalf("inspected %+v, %v; want completed, expiring a TTL after the resolution (%v)", res, err, now.Add(ttl))
	}

	for _, resp := range []*idem.Response{nil, okResponse("x")} {
		if err := b.resolve(b.scope, live.Key, resp, now); !errors.Is(err, admin.ErrLeaseLive) {
			t.Fatalf("RecordResolve of an unfinished operation at work = %v, want admin.ErrLeaseLive", err)
		}
	}
	if res, err := b.inspect(b.scope, live.Key, now, false); err != nil || !res.Record.Unfinished() {
		t.Fatalf("the operation at work after refused resolutions: %+v, %v; want it unfinished still", res, err)
	}
}

func listUnfinished(t *testing.T, b *bundle) {
	needList(t, b)
	needRecoveryPoints(t, b)
	a, z := "a-"+b.scope, "z-"+b.scope
	now := b.at(ttl + time.Second)
	b.unfinished(a, "key-1", b.t0) // past its TTL
	b.claim(a, "key-2", now)
	b.unfinished(a, "key-3", now) // at work
	done := b.unfinished(a, "key-4", b.t0)
	if err := b.s.RecordComplete(b.ctx, &idemstore.CompleteParams{Scope: a, Key: done.Key, Token: done.Token,
		Response: okResponse("4"), TTL: ttl, Now: b.t0}); err != nil {
		t.Fatal(err)
	}
	b.unfinished(z, "key-1", b.t0)

	got := listAll(t, b, admin.RecordListParams{Scope: a, State: admin.StateUnfinished, Limit: 10, Now: now})
	if keys := keysOf(got); !slices.Equal(keys, []string{a + "/key-1", a + "/key-3"}) {
		t.Fatalf("unfinished in %s: %v, want key-1 and key-3", a, keys)
	}
	for _, r := range got {
		if !r.Unfinished() || r.RecoveryPoint != "charge_pending" || r.Operation != "charges.create" || r.LeaseEnd.IsZero() || r.Expired(now) {
			t.Fatalf("listed %+v, want unfinished at charge_pending of charges.create, with its lease, never expired", r)
		}
	}
	all := listAll(t, b, admin.RecordListParams{State: admin.StateUnfinished, Limit: 1, Now: now})
	if keys := keysOf(all); !slices.Equal(keys, []string{a + "/key-1", a + "/key-3", z + "/key-1"}) {
		t.Fatalf("unfinished across scopes, a page of 1 at a time: %v", keys)
	}
	after := listAll(t, b, admin.RecordListParams{Scope: z, State: admin.StateUnfinished, AfterScope: a, AfterKey: "key-9", Limit: 10, Now: now})
	if keys := keysOf(after); !slices.Equal(keys, []string{z + "/key-1"}) {
		t.Fatalf("unfinished in %s after a cursor of another scope: %v", z, keys)
	}
}
