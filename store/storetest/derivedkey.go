package storetest

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/idem-go/idem/idemstore"
)

// The cases of record ids and derived keys (SPEC §13, §17, §20): the key an operation
// sends to an outside system is hex SHA-256(record id ‖ step), as every release of
// idem derives it, so that a record begun by one release and resumed by another keeps
// its keys; and the record id is derived from the request, so that every record the
// same request makes (after a release, a failover that lost one, an expiry) has the
// same id and sends the same keys.

func init() {
	register(
		testCase{"RecordIDAndDerivedKeyAreTheSameForEveryHolderAndEveryRecordOfOneRequest", testDerivedKeySurvivesTheRecord},
		testCase{"RecordIDDiffersByScopeKeyAndParameters", testDerivedKeyDiffers},
		testCase{"DerivedKeyOfARecordMadeByAnEarlierReleaseStaysDerivedFromItsRandomID", testDerivedKeyOfOldRecord},
	)
}

// releasedDerivedKey is the derived key as idem 0.1.0 and 0.2.0 compute it
// (idem.ForeignKey): hex SHA-256(record id ‖ step).
func releasedDerivedKey(recordID, step string) string {
	sum := sha256.Sum256([]byte(recordID + step))
	return hex.EncodeToString(sum[:])
}

// derivedKey is the derived key of the operation that claim p made or takes over.
func derivedKey(p *idemstore.ClaimParams, step string) string {
	return idemstore.DeriveKey(p.RecordID, step)
}

// earlierReleaseRecordID is a record id as idem 0.2.0 and older make them: 16 random
// bytes in hex.
func earlierReleaseRecordID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func testDerivedKeySurvivesTheRecord(t *testing.T, h Harness) {
	b := setup(t, h)
	g, clock := b.guard()
	first, _, err := g.Begin(b.ctx, b.call())
	if err != nil || first == nil {
		t.Fatalf("Begin = %v, %v", first, err)
	}
	wantID := idemstore.RecordIDFor(b.scope, b.key, b.fp)
	want := first.DerivedKey("processor")
	if first.RecordID() != wantID || want != releasedDerivedKey(wantID, "processor") {
		t.Fatalf("a new record's id %q and derived key %q: want the id of the request %q and hex SHA-256(id ‖ step)",
			first.RecordID(), want, wantID)
	}
	// The store keeps the id: a process of an earlier release that resumes the record
	// (a rollback) reads it and derives the same key.
	rec, err := b.s.RecordGet(b.ctx, &idemstore.GetParams{Scope: b.scope, Key: b.key, Now: clock.Now()})
	if err != nil || rec.ID != wantID || releasedDerivedKey(rec.ID, "processor") != want {
		t.Fatalf("the stored record: %+v, %v; want id %q", rec, err, wantID)
	}

	clock.Advance(lease + ms(1)) // its holder died
	taker, _, err := g.Begin(b.ctx, b.call())
	if err != nil || taker == nil || !taker.TookOver() {
		t.Fatalf("Begin after the lease lapsed = %v, %v; want a takeover", taker, err)
	}
	if taker.RecordID() != wantID || taker.DerivedKey("processor") != want {
		t.Fatalf("after a takeover: record %q, derived key %q; want the same record and key %q", taker.RecordID(), taker.DerivedKey("processor"), want)
	}
	if err := taker.Release(); err != nil { // it answered 503: nothing happened, says the handler
		t.Fatal(err)
	}

	// The retry makes a new record (as after a failover that lost the first): the
	// same id, the same derived key.
	retry, _, err := g.Begin(b.ctx, b.call())
	if err != nil || retry == nil || retry.TookOver() {
		t.Fatalf("Begin after the release = %v, %v; want a fresh claim", retry, err)
	}
	if retry.RecordID() != wantID || retry.DerivedKey("processor") != want {
		t.Fatalf("the retry's record %q, derived key %q; want the first's id %q and key %q",
			retry.RecordID(), retry.DerivedKey("processor"), wantID, want)
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
	if again.RecordID() != wantID || again.DerivedKey("processor") != want {
		t.Fatalf("after expiry: record %q, derived key %q; want the same id and key %q", again.RecordID(), again.DerivedKey("processor"), want)
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
	id, k := hd.RecordID(), hd.DerivedKey("processor")
	other := b.fp
	other.Sum[0] ^= 1
	version := b.fp
	version.Version++
	if hd.DerivedKey("refund") == k {
		t.Errorf("another step derives the same key %q", k)
	}
	for name, got := range map[string]string{
		"another scope":               idemstore.RecordIDFor(b.scope+"x", b.key, b.fp),
		"another key":                 idemstore.RecordIDFor(b.scope, b.key+"x", b.fp),
		"another parameters":          idemstore.RecordIDFor(b.scope, b.key, other),
		"another fingerprint version": idemstore.RecordIDFor(b.scope, b.key, version),
		// No two field lists hash alike: the fields are length-prefixed.
		"the scope's end moved to the key": idemstore.RecordIDFor(b.scope[:len(b.scope)-1], b.scope[len(b.scope)-1:]+b.key, b.fp),
	} {
		if got == id {
			t.Errorf("%s makes the same record id %q", name, id)
		}
	}
}

func testDerivedKeyOfOldRecord(t *testing.T, h Harness) {
	b := setup(t, h)
	g, clock := b.guard()
	old := b.claimParams(clock.Now())
	old.RecordID = earlierReleaseRecordID() // made by idem 0.2.0, whose holder died
	b.claimWant(old, idemstore.ClaimAcquired)
	clock.Advance(lease + ms(1))
	hd, _, err := g.Begin(b.ctx, b.call())
	if err != nil || hd == nil || !hd.TookOver() {
		t.Fatalf("Begin after the old holder's lease lapsed = %v, %v; want a takeover", hd, err)
	}
	defer hd.Release()
	if hd.RecordID() != old.RecordID {
		t.Fatalf("the takeover's record id %q, want the earlier release's %q kept", hd.RecordID(), old.RecordID)
	}
	if got, want := hd.DerivedKey("processor"), releasedDerivedKey(old.RecordID, "processor"); got != want {
		t.Fatalf("the derived key of a record made by an earlier release = %q, want hex SHA-256(record id ‖ step) = %q, as its first holder sent", got, want)
	}
}
