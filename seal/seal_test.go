package seal_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/seal/cloudkeys"
)

// keyURL returns a base64key:// URL of a key made of b.
func keyURL(b byte) string {
	return "base64key://" + base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32))
}

// counting is a KeyWrapper that counts its calls and can be made to fail.
type counting struct {
	seal.KeyWrapper
	unwraps     atomic.Int32
	unavailable atomic.Bool
	refused     atomic.Bool
}

func (c *counting) Unwrap(ctx context.Context, w []byte) ([]byte, error) {
	c.unwraps.Add(1)
	if c.unavailable.Load() {
		return nil, seal.ErrKeyUnavailable
	}
	if c.refused.Load() {
		return nil, errors.New("DisabledException: the key is disabled") // a key manager's refusal
	}
	return c.KeyWrapper.Unwrap(ctx, w)
}

func openKey(t *testing.T, b byte) *counting {
	t.Helper()
	k, err := cloudkeys.Open(context.Background(), keyURL(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return &counting{KeyWrapper: k}
}

func newKeyring(t *testing.T, secret []byte, keys ...seal.KeyWrapper) *seal.Keyring {
	t.Helper()
	k, err := seal.NewKeyring(context.Background(), secret, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var rec = seal.Binding{Scope: "scope-a", Key: "key-0001", RecordID: "0123456789abcdef0123456789abcdef"}

const card = `{"card_number":"4111111111111111","cvc":"123","access_token":"tok_live_1"}`

func TestSealedValueOpensInAnotherProcessAndHoldsNoPlaintext(t *testing.T) {
	a := openKey(t, 1)
	sealer := newKeyring(t, nil, a)
	v, err := sealer.Seal(seal.PurposeResponse, rec, []byte(card))
	if err != nil {
		t.Fatal(err)
	}
	if !seal.Sealed(v) || bytes.Contains(v, []byte("4111")) || bytes.Contains(v, []byte("tok_live")) {
		t.Fatalf("sealed value shows its plaintext or no header: %q", v)
	}
	if got := seal.KeyIDOf(v); got != a.ID() || !strings.HasPrefix(got, "base64key:") || strings.Contains(keyURL(1), got[len("base64key:"):]) {
		t.Fatalf("KeyIDOf = %q, want the key's id %q, which is no part of its URL", got, a.ID())
	}
	// Another process: another Keyring (another data key) with the same key.
	other := newKeyring(t, nil, a)
	before := a.unwraps.Load()
	for range 3 {
		plain, err := other.Open(context.Background(), seal.PurposeResponse, rec, v)
		if err != nil || string(plain) != card {
			t.Fatalf("Open = %q, %v; want the plaintext", plain, err)
		}
	}
	if n := a.unwraps.Load() - before; n != 1 {
		t.Errorf("three opens of one data key unwrapped it %d times, want once (the key manager is not called per request)", n)
	}
}

func TestSealedValueDoesNotOpenForAnotherRecordOrPurpose(t *testing.T) {
	k := newKeyring(t, nil, openKey(t, 1))
	v, err := k.Seal(seal.PurposeResponse, rec, []byte(card))
	if err != nil {
		t.Fatal(err)
	}
	others := map[string]func(b *seal.Binding) seal.Purpose{
		"scope":     func(b *seal.Binding) seal.Purpose { b.Scope += "x"; return seal.PurposeResponse },
		"key":       func(b *seal.Binding) seal.Purpose { b.Key = "key-0002"; return seal.PurposeResponse },
		"record id": func(b *seal.Binding) seal.Purpose { b.RecordID = strings.Repeat("f", 32); return seal.PurposeResponse },
		"purpose":   func(*seal.Binding) seal.Purpose { return seal.PurposeSteps },
		"any record of another key": func(b *seal.Binding) seal.Purpose {
			b.Key, b.RecordID = "key-0002", seal.AnyRecord
			return seal.PurposeResponse
		},
	}
	for name, change := range others {
		b := rec
		p := change(&b)
		if _, err := k.Open(context.Background(), p, b, v); !errors.Is(err, seal.ErrUnreadable) {
			t.Errorf("another %s: Open = %v, want ErrUnreadable", name, err)
		}
	}
	any := rec
	any.RecordID = seal.AnyRecord
	if plain, err := k.Open(context.Background(), seal.PurposeResponse, any, v); err != nil || string(plain) != card {
		t.Errorf("AnyRecord of the same scope and key: Open = %q, %v", plain, err)
	}
}

func TestEveryAlteredByteFailsToOpen(t *testing.T) {
	k := newKeyring(t, nil, openKey(t, 1))
	v, err := k.Seal(seal.PurposeSteps, rec, []byte(card))
	if err != nil {
		t.Fatal(err)
	}
	for i := range v {
		w := bytes.Clone(v)
		w[i] ^= 0x01
		plain, err := k.Open(context.Background(), seal.PurposeSteps, rec, w)
		if err == nil {
			t.Fatalf("byte %d altered: opened to %q", i, plain)
		}
		if i >= 8 && !errors.Is(err, seal.ErrUnreadable) { // the first 8 are the header's magic: then it is not sealed at all
			t.Fatalf("byte %d altered: %v, want ErrUnreadable", i, err)
		}
	}
	for n := range len(v) {
		if _, err := k.Open(context.Background(), seal.PurposeSteps, rec, v[:n]); err == nil {
			t.Fatalf("cut to %d bytes: opened", n)
		}
	}
}

func TestRotationOpensUnderEveryKeyAndSealsUnderTheFirst(t *testing.T) {
	a, b := openKey(t, 1), openKey(t, 2)
	old, err := newKeyring(t, nil, a).Seal(seal.PurposeResponse, rec, []byte(card))
	if err != nil {
		t.Fatal(err)
	}
	both := newKeyring(t, nil, b, a)
	if plain, err := both.Open(context.Background(), seal.PurposeResponse, rec, old); err != nil || string(plain) != card {
		t.Fatalf("B,A opens A's value: %q, %v", plain, err)
	}
	fresh, _ := both.Seal(seal.PurposeResponse, rec, []byte(card))
	if seal.KeyIDOf(fresh) != b.ID() {
		t.Errorf("B,A seals under %s, want B (%s)", seal.KeyIDOf(fresh), b.ID())
	}
	onlyB := newKeyring(t, nil, b)
	_, err = onlyB.Open(context.Background(), seal.PurposeResponse, rec, old)
	var u *seal.UnreadableError
	if !errors.As(err, &u) || u.KeyID != a.ID() || !strings.Contains(err.Error(), "not configured") {
		t.Errorf("B alone opens A's value: %v; want an UnreadableError naming A (%s)", err, a.ID())
	}
	if _, err := onlyB.Open(context.Background(), seal.PurposeResponse, rec, fresh); err != nil {
		t.Errorf("B alone opens B's value: %v", err)
	}
}

func TestAnUnavailableKeyManagerIsNotUnreadableAndIsAskedAgain(t *testing.T) {
	a := openKey(t, 1)
	v, _ := newKeyring(t, nil, a).Seal(seal.PurposeResponse, rec, []byte(card))
	k := newKeyring(t, nil, a)
	a.unavailable.Store(true)
	_, err := k.Open(context.Background(), seal.PurposeResponse, rec, v)
	if !errors.Is(err, seal.ErrKeyUnavailable) || errors.Is(err, seal.ErrUnreadable) {
		t.Fatalf("Open with the key manager away = %v, want ErrKeyUnavailable only", err)
	}
	a.unavailable.Store(false)
	if plain, err := k.Open(context.Background(), seal.PurposeResponse, rec, v); err != nil || string(plain) != card {
		t.Fatalf("Open once the key manager is back = %q, %v", plain, err)
	}
}

// A key manager's refusal (a key disabled, a permission withdrawn) is remembered for
// a pause that doubles from a second up to a minute, then the key manager is asked
// again: a key enabled again opens its values without a restart.
func TestARefusedKeyIsAskedAgainWithBackoffAndOpensOnceEnabled(t *testing.T) {
	a := openKey(t, 1)
	v, _ := newKeyring(t, nil, a).Seal(seal.PurposeResponse, rec, []byte(card))
	k := newKeyring(t, nil, a)
	now := time.Unix(1_800_000_000, 0)
	seal.SetClock(k, func() time.Time { return now })
	open := func(step string, wantCalls int32, wantOpen bool) {
		t.Helper()
		before := a.unwraps.Load()
		plain, err := k.Open(context.Background(), seal.PurposeResponse, rec, v)
		if calls := a.unwraps.Load() - before; calls != wantCalls {
			t.Fatalf("%s: %d calls to the key manager, want %d", step, calls, wantCalls)
		}
		switch {
		case wantOpen && (err != nil || string(plain) != card):
			t.Fatalf("%s: Open = %q, %v; want the value", step, plain, err)
		case !wantOpen && !errors.Is(err, seal.ErrUnreadable):
			t.Fatalf("%s: Open = %v, want ErrUnreadable", step, err)
		}
	}
	a.refused.Store(true)
	open("refused", 1, false)
	open("refused, remembered", 0, false)
	now = now.Add(seal.UnwrapRetryMin - time.Millisecond)
	open("a moment before the first retry", 0, false)
	now = now.Add(time.Millisecond)
	open("the first retry, refused again", 1, false)
	a.refused.Store(false) // the key is enabled again
	now = now.Add(2*seal.UnwrapRetryMin - time.Millisecond)
	open("before the second retry (the pause doubled)", 0, false)
	now = now.Add(time.Millisecond)
	open("the second retry", 1, true)
	open("opened, remembered", 0, true)

	// The pause stops doubling at UnwrapRetryMax.
	b := openKey(t, 2)
	w, _ := newKeyring(t, nil, b).Seal(seal.PurposeResponse, rec, []byte(card))
	kb := newKeyring(t, nil, b)
	seal.SetClock(kb, func() time.Time { return now })
	b.refused.Store(true)
	for range 12 {
		_, _ = kb.Open(context.Background(), seal.PurposeResponse, rec, w)
		now = now.Add(seal.UnwrapRetryMax)
	}
	b.refused.Store(false)
	before := b.unwraps.Load()
	if _, err := kb.Open(context.Background(), seal.PurposeResponse, rec, w); err != nil || b.unwraps.Load() != before+1 {
		t.Fatalf("a minute after the twelfth refusal: %v after %d calls, want the value after one", err, b.unwraps.Load()-before)
	}
}

func TestAnotherKeyWithTheSameIDDoesNotOpen(t *testing.T) {
	// A key replaced under the same id (a KMS key recreated under its alias): its data
	// keys no longer unwrap, and the failure is kept, not asked again per request.
	a, b := openKey(t, 1), openKey(t, 2)
	v, _ := newKeyring(t, nil, a).Seal(seal.PurposeResponse, rec, []byte(card))
	impostor := &counting{KeyWrapper: sameID{b, a.ID()}}
	k := newKeyring(t, nil, impostor)
	for range 2 {
		if _, err := k.Open(context.Background(), seal.PurposeResponse, rec, v); !errors.Is(err, seal.ErrUnreadable) {
			t.Fatalf("Open = %v, want ErrUnreadable", err)
		}
	}
	if n := impostor.unwraps.Load(); n != 1 {
		t.Errorf("two opens asked the key manager %d times, want once", n)
	}
}

type sameID struct {
	seal.KeyWrapper
	id string
}

func (s sameID) ID() string { return s.id }

func TestNoncesNeverRepeat(t *testing.T) {
	k := newKeyring(t, nil, openKey(t, 1))
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 500 {
				v, _ := k.Seal(seal.PurposeResponse, rec, nil)
				nonce := string(v[len(v)-16-12 : len(v)-16])
				mu.Lock()
				if seen[nonce] {
					t.Error("a nonce repeated")
				}
				seen[nonce] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

func TestFingerprintsAndScopesAreKeyedAlikeInEveryProcess(t *testing.T) {
	secret := seal.NewMACSecret()
	a, b := openKey(t, 1), openKey(t, 2)
	p1, p2 := newKeyring(t, secret, a), newKeyring(t, secret, b, a) // a rotation keeps the MAC secret
	sum := sha256.Sum256([]byte("POST /v1/charges {...}"))
	if p1.FingerprintSum(1, sum) != p2.FingerprintSum(1, sum) || p1.Scope("Bearer x") != p2.Scope("Bearer x") {
		t.Fatal("two keyrings of one MAC secret key differently")
	}
	if p1.FingerprintSum(1, sum) == sum || p1.FingerprintSum(1, sum) == p1.FingerprintSum(2, sum) {
		t.Error("the keyed sum is the sum, or does not depend on the version")
	}
	plain := sha256.Sum256([]byte("Bearer x"))
	if p1.Scope("Bearer x") == string(plain[:]) || len(p1.Scope("Bearer x")) != 64 {
		t.Errorf("keyed scope %q", p1.Scope("Bearer x"))
	}
	other := newKeyring(t, seal.NewMACSecret(), a)
	if other.FingerprintSum(1, sum) == p1.FingerprintSum(1, sum) || other.SecretID() == p1.SecretID() {
		t.Error("another MAC secret keys alike")
	}
	if newKeyring(t, nil, a).Keyed() || !p1.Keyed() {
		t.Error("Keyed is wrong")
	}
}

func TestTheMACSecretUnwrapsUnderAnyKeyItIsWrappedUnder(t *testing.T) {
	ctx := context.Background()
	a, b, c := openKey(t, 1), openKey(t, 2), openKey(t, 3)
	secret := seal.NewMACSecret()
	blob, err := seal.WrapSecret(ctx, secret, b, a)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(blob, secret) || bytes.Contains(blob, []byte(base64.StdEncoding.EncodeToString(secret))) {
		t.Fatal("the kept secret shows the secret")
	}
	for _, keys := range [][]seal.KeyWrapper{{a}, {b}, {c, a}} {
		got, err := seal.UnwrapSecret(ctx, blob, keys...)
		if err != nil || !bytes.Equal(got, secret) {
			t.Fatalf("UnwrapSecret = %x, %v", got, err)
		}
	}
	_, err = seal.UnwrapSecret(ctx, blob, c)
	if !errors.Is(err, seal.ErrSecretLocked) || !strings.Contains(err.Error(), a.ID()) {
		t.Fatalf("UnwrapSecret with another key = %v, want ErrSecretLocked naming the keys", err)
	}
	ids, err := seal.SecretKeyIDs(blob)
	if err != nil || len(ids) != 2 || ids[0] != b.ID() || ids[1] != a.ID() {
		t.Fatalf("SecretKeyIDs = %v, %v", ids, err)
	}
}

func TestKeyURLsAreCheckedAndTheirSecretsNeverShow(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{"base64key://", "base64key://c2hvcnQ=", "nokms://x", "alias/foo", ":"} {
		_, err := cloudkeys.Open(ctx, u)
		if err == nil {
			t.Errorf("Open(%q) opened", u)
			continue
		}
		if strings.Contains(err.Error(), "c2hvcnQ") {
			t.Errorf("Open(%q): the error shows the key: %v", u, err)
		}
	}
	if _, err := cloudkeys.Open(ctx, "awskms://alias/idem?region=us-east-1"); err == nil || !strings.Contains(err.Error(), "gocloud.dev/secrets/awskms") {
		t.Errorf("a KMS URL without its driver: %v, want the driver to import", err)
	}
	if _, err := seal.NewKeyring(ctx, nil, openKey(t, 1), openKey(t, 1)); err == nil {
		t.Error("a key configured twice is accepted")
	}
}
