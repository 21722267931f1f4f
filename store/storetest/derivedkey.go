package storetest

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// The cases of derived keys (SPEC §13, §17): the key an operation sends to an outside
// system is the same for every holder of its record and for every record the same
// request makes, so that a record released, lost in a failover or expired does not
// make the outside system run the call twice.

func init() {
	register(
		testCase{"DerivedKeyIsTheSameForEveryHolderAndEveryRecordOfOneRequest", testDerivedKeySurvivesTheRecord},
		testCase{"DerivedKeyDiffersByStepScopeKeyAndParameters", testDerivedKeyDiffers},
		testCase{"DerivedKeyOfARecordMadeBeforeStaysDerivedFromItsID", testDerivedKeyOfOldRecord},
	)
}

// derivedKey is the derived key of the operation that claim p made or takes over.
func derivedKey(p *idemstore.ClaimParams, step string) string {
	return idemstore.DeriveKey(p.Scope, p.Key, p.RecordID, p.Fingerprint, step)
}

func testDerivedKeySurvivesTheRecord(t *testing.T, h Harness) {
	b := setup(t, h)
	g, clock := b.guard()
	first, _, err := g.Begin(b.ctx, b.call())
	if err != nil || first == nil {
		t.Fatalf("Begin = %v, %v", first, err)
	}
	want := first.DerivedKey("processor")
	if !strings.HasPrefix(first.RecordID(), idemstore.RecordIDPrefix) ||
		want != idemstore.DeriveKey(b.scope, b.key, first.RecordID(), b.fp, "processor") {
		t.Fatalf("a new record's id %q and derived key %q: want an id starting %q and the key derived from the request",
			first.RecordID(), want, idemstore.RecordIDPrefix)
	}

	clock.Advance(lease + ms(1)) // its holder died
	taker, _, err := g.Begin(b.ctx, b.call())
	if err != nil || taker == nil || !taker.TookOver() {
		t.Fatalf("Begin after the lease lapsed = %v, %v; want a takeover", taker, err)
	}
	if taker.RecordID() != first.RecordID() || taker.DerivedKey("processor") != want {
		t.Fatalf("after a takeover: record %q, derived key %q; want the same record and key %q", taker.RecordID(), taker.DerivedKey("processor"), want)
	}
	if err := taker.Release(); err != nil { // it answered 503: nothing happened, says the handler
		t.Fatal(err)
	}

	// The retry makes a new record (as after a failover that lost the first): a new
	// id, the same derived key.
	retry, _, err := g.Begin(b.ctx, b.call())
	if err != nil || retry == nil || retry.TookOver() {
		t.Fatalf("Begin after the release = %v, %v; want a fresh claim", retry, err)
	}
	if retry.RecordID() == first.RecordID() || retry.DerivedKey("processor") != want {
		t.Fatalf("the retry's record %q (first %q), derived key %q; want a new record with the first's key %q",
			retry.RecordID(), first.RecordID(), retry.DerivedKey("processor"), want)
	}
	if err := retry.SetResult(charge{ID: "ch_1"}); err != nil {
		t.Fatal(err)
	}
	if err := retry.Complete(); err != nil {
		t.Fatal(err)
	}

	clock.Advance(ttl) // expired: the same key with the same parameters derives the same key again
	again, _, err := g.Begin(b.ctx, b.call())
	if err != nil || again == nil {
		t.Fatalf("Begin after expiry = %v, %v", again, err)
	}
	defer again.Release()
	if again.RecordID() == retry.RecordID() || again.DerivedKey("processor") != want {
		t.Fatalf("after expiry: record %q, derived key %q; want a new record and the same key %q", again.RecordID(), again.DerivedKey("processor"), want)
	}
}

func testDerivedKeyDiffers(t *testing.T, h Harness) {
	b := setup(t, h)
	g, _ := b.guard()
	hd, _, err := g.Begin(b.ctx, b.call())
	if err != nil || hd == nil {
		t.Fatalf("Begin = %v, %v", hd, err)
	}
	defer hd.Release()
	k := hd.DerivedKey("processor")
	other := b.fp
	other.Sum[0] ^= 1
	for name, got := range map[string]string{
		"another step":       hd.DerivedKey("refund"),
		"another scope":      idemstore.DeriveKey(b.scope+"x", b.key, hd.RecordID(), b.fp, "processor"),
		"another key":        idemstore.DeriveKey(b.scope, b.key+"x", hd.RecordID(), b.fp, "processor"),
		"another parameters": idemstore.DeriveKey(b.scope, b.key, hd.RecordID(), other, "processor"),
		// No two field lists hash alike: the fields are length-prefixed.
		"the scope's end moved to the key": idemstore.DeriveKey(b.scope[:len(b.scope)-1], b.scope[len(b.scope)-1:]+b.key, hd.RecordID(), b.fp, "processor"),
	} {
		if got == k {
			t.Errorf("%s derives the same key %q", name, k)
		}
	}
}

func testDerivedKeyOfOldRecord(t *testing.T, h Harness) {
	b := setup(t, h)
	g, clock := b.guard()
	old := b.claimParams(clock.Now())
	old.RecordID = "0123456789abcdef0123456789abcdef" // made before derived keys came from the request
	b.claimWant(old, idemstore.ClaimAcquired)
	clock.Advance(lease + ms(1))
	hd, _, err := g.Begin(b.ctx, b.call())
	if err != nil || hd == nil || !hd.TookOver() {
		t.Fatalf("Begin after the old holder's lease lapsed = %v, %v; want a takeover", hd, err)
	}
	defer hd.Release()
	sum := sha256.Sum256([]byte(old.RecordID + "processor"))
	if got, want := hd.DerivedKey("processor"), hex.EncodeToString(sum[:]); got != want || got != idem.ForeignKey(old.RecordID, "processor") {
		t.Fatalf("the derived key of a record made before = %q, want hex SHA-256(record id ‖ step) = %q, as its first holder sent", got, want)
	}
}
