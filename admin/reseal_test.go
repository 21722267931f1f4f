package admin_test

import (
	"bytes"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/seal/cloudkeys"
	"github.com/idem-go/idem/store/memory"
)

func localKey(t *testing.T, b byte) seal.KeyWrapper {
	t.Helper()
	k, err := cloudkeys.Open(t.Context(), "base64key://"+base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	return k
}

// sealedRecords writes, under ring, a completed record with a sealed response and an
// unfinished one with sealed step results, as the core writes them.
func sealedRecords(t *testing.T, st *memory.Store, ring *seal.Keyring) {
	t.Helper()
	ctx := t.Context()
	fp := idem.Fingerprint{Version: idemstore.KeyedVersionOffset + idemstore.FingerprintVersion, Sum: [32]byte{1}}
	claim := func(key, id string) string {
		p := &idemstore.ClaimParams{Scope: "scope-a", Key: key, Fingerprint: fp, Token: "tok-" + key, RecordID: id, Lease: time.Minute, TTL: time.Hour}
		if res, err := st.RecordClaim(ctx, p); err != nil || res.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("claim %s: %v", key, err)
		}
		return p.Token
	}
	tok := claim("key-done", "rec-done")
	resp, err := admin.SealResponse(ring, "scope-a", "key-done", "rec-done", &idem.Response{Status: 201, Body: []byte(`{"card":"4111111111111111"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RecordComplete(ctx, &idemstore.CompleteParams{Scope: "scope-a", Key: "key-done", Token: tok, Response: resp, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	tok = claim("key-unfinished", "rec-unfinished")
	steps, err := ring.Seal(seal.PurposeSteps, seal.Binding{Scope: "scope-a", Key: "key-unfinished", RecordID: "rec-unfinished"}, []byte(`[{"step":"s","result":{"cvc":"123"}}]`))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RecordStep(ctx, &idemstore.StepParams{Scope: "scope-a", Key: "key-unfinished", Token: tok, RecoveryPoint: "s", Steps: steps, Operation: "op"}); err != nil {
		t.Fatal(err)
	}
}

// everyRecord returns every record of the store, idem's own included, with its body.
func everyRecord(t *testing.T, st *memory.Store) []*admin.Record {
	t.Helper()
	var out []*admin.Record
	for _, scope := range []string{"", idemstore.ReservedScope} {
		list, err := st.RecordList(t.Context(), &admin.RecordListParams{Scope: scope, Limit: admin.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range list.Records {
			res, err := st.RecordInspect(t.Context(), &admin.RecordInspectParams{Scope: l.Scope, Key: l.Key, Body: true})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, res.Record)
		}
	}
	return out
}

// After the documented rotation (A, then B,A) and a rewrap with B first, the retired
// key A opens nothing current in the store: neither the MAC secret (of any
// generation) nor any record's data key is wrapped under it, and B alone opens all.
// (Before, the MAC secret stayed wrapped under A for a hundred years, issue 46.)
func TestAKeyRetiredByRewrapOpensNothingCurrent(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a, b := localKey(t, 'a'), localKey(t, 'b')
	st := memory.New()
	ringA, err := idem.OpenKeyring(ctx, st, a)
	if err != nil {
		t.Fatal(err)
	}
	sealedRecords(t, st, ringA)
	// A record sealed under a key that is gone (C): left as it is, counted.
	lost, err := seal.NewKeyring(ctx, nil, localKey(t, 'c'))
	if err != nil {
		t.Fatal(err)
	}
	lostBody, _ := admin.SealResponse(lost, "scope-b", "key-lost", "rec-lost", &idem.Response{Status: 201, Body: []byte("x")})
	tok := "tok-lost"
	if _, err := st.RecordClaim(ctx, &idemstore.ClaimParams{Scope: "scope-b", Key: "key-lost", Fingerprint: idem.Fingerprint{Version: 1001}, Token: tok,
		RecordID: "rec-lost", Lease: time.Minute, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordComplete(ctx, &idemstore.CompleteParams{Scope: "scope-b", Key: "key-lost", Token: tok, Response: lostBody, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if _, err := idem.OpenKeyring(ctx, st, b, a); err != nil { // the rotation's first step
		t.Fatal(err)
	}

	res, err := admin.Rewrap(ctx, st, b, a)
	if err != nil {
		t.Fatal(err)
	}
	if res.Secrets != 2 || res.Records != 2 || res.Changed != 0 || res.Unreadable != 1 {
		t.Fatalf("Rewrap = %+v, want 2 secret generations and 2 records re-wrapped, 1 unreadable", res)
	}

	onlyA, err := seal.NewKeyring(ctx, nil, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.OpenKeyring(ctx, st, a); err == nil {
		t.Fatal("A alone opens the store's MAC secret after the rewrap")
	}
	ringB, err := idem.OpenKeyring(ctx, st, b)
	if err != nil {
		t.Fatalf("B alone after the rewrap: %v", err)
	}
	secrets := 0
	for _, r := range everyRecord(t, st) {
		if r.Scope == idemstore.ReservedScope {
			if ids, err := seal.SecretKeyIDs(r.Body); err == nil {
				secrets++
				if len(ids) != 1 || ids[0] != b.ID() {
					t.Errorf("the MAC secret's record %s is wrapped under %v, want %s alone", r.Key, ids, b.ID())
				}
			}
			continue
		}
		if r.Key == "key-lost" {
			continue
		}
		for _, v := range [][]byte{r.Body, r.Steps} {
			if !seal.Sealed(v) {
				continue
			}
			if id := seal.KeyIDOf(v); id != b.ID() {
				t.Errorf("record %s holds a value sealed under %s", r.Key, id)
			}
			bind := seal.Binding{Scope: r.Scope, Key: r.Key, RecordID: r.ID}
			for _, p := range []seal.Purpose{seal.PurposeResponse, seal.PurposeSteps} {
				if _, err := onlyA.Open(ctx, p, bind, v); !errors.Is(err, seal.ErrUnreadable) {
					t.Errorf("A opens record %s's value: %v", r.Key, err)
				}
			}
		}
		rec := &idemstore.Record{Scope: r.Scope, Key: r.Key, ID: r.ID, State: r.State, Fingerprint: r.Fingerprint, Steps: r.Steps}
		if r.State == idemstore.StateCompleted {
			rec.Response = &idemstore.Response{Status: r.Status, Body: r.Body}
		}
		open, err := admin.OpenRecord(ctx, ringB, rec)
		switch {
		case err != nil:
			t.Errorf("B alone cannot open record %s: %v", r.Key, err)
		case r.Key == "key-done" && string(open.Response.Body) != `{"card":"4111111111111111"}`,
			r.Key == "key-unfinished" && string(open.Steps) != `[{"step":"s","result":{"cvc":"123"}}]`:
			t.Errorf("record %s opens to other content: %+v", r.Key, open)
		}
	}
	if secrets != 2 {
		t.Fatalf("the store holds %d generations of the MAC secret, want 2", secrets)
	}
	if again, err := admin.Rewrap(ctx, st, b); err != nil || again != (admin.RewrapResult{Unreadable: 1}) {
		t.Fatalf("a second Rewrap = %+v, %v; want nothing left to do", again, err)
	}
}

// A store that cannot replace records in place (Redis) is refused with a reason.
func TestRewrapRefusesAStoreThatCannotReseal(t *testing.T) {
	t.Parallel()
	st := memory.New()
	type records = idemstore.Store
	type operator = admin.Store
	type plain struct {
		records
		operator
	}
	_, err := admin.Rewrap(t.Context(), plain{st, st}, localKey(t, 'b'))
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "cannot re-wrap") {
		t.Fatalf("Rewrap = %v, want errors.ErrUnsupported saying why", err)
	}
}
