package storetest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/seal/cloudkeys"
)

// The sealed records' case (SPEC §19): with a keyring, what the store holds after
// traffic that carries a card number and a token holds neither, nor a fingerprint
// that can be recomputed without the key, on every path the store offers (Do, the
// middleware, steps, and the SPEC §7 helpers); and every repeat is answered byte for
// byte.

func init() {
	register(
		testCase{"SealedRecordsHoldNoPlaintextAndReplayByteForByte", testSealed},
		testCase{"ASealedResponseCopiedOntoAnotherRecordDoesNotOpenThere", testSealedCopied},
	)
}

// Secrets is what the sealed records' case sends and answers; none may be found in
// what the store holds (Harness.Raw), in clear, hex or base64.
var Secrets = []string{"4111111111111111", "tok_live_1"}

// SealKeyURL is the local key the suite seals under.
const SealKeyURL = "base64key://AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

// HoldsSecret returns the first of secrets that raw holds in clear, in hex or in
// base64, and "" when it holds none.
func HoldsSecret(raw []byte, secrets ...string) string {
	lower := bytes.ToLower(raw)
	for _, s := range secrets {
		for _, form := range []string{s, hex.EncodeToString([]byte(s)), base64.StdEncoding.EncodeToString([]byte(s))[:len(s)]} {
			if bytes.Contains(raw, []byte(form)) || bytes.Contains(lower, []byte(strings.ToLower(form))) {
				return s
			}
		}
	}
	return ""
}

// sealedCard is the result the case's operations return.
type sealedCard struct {
	Card  string `json:"card_number"`
	Token string `json:"access_token"`
}

func testSealed(t *testing.T, h Harness) {
	if h.Raw == nil {
		t.Skip("storetest: Harness.Raw is nil: the case cannot read what the store holds")
	}
	b := setup(t, h)
	key, ring, g := b.sealedGuard()
	card := sealedCard{Card: Secrets[0], Token: Secrets[1]}
	input := []byte(`{"card_number":"` + Secrets[0] + `"}`)
	plain := []idem.Fingerprint{idem.FingerprintInput("payment_methods.create", input)}
	var runs int
	op := func(ctx context.Context) (sealedCard, error) { runs++; return card, nil }
	calls := []idem.Call{{Scope: b.scope, Key: b.key + "-do", Fingerprint: plain[0]}}
	if _, _, err := idem.Do(b.ctx, g, calls[0], op); err != nil {
		t.Fatal(err)
	}

	if b.s.Capabilities().RecoveryPoints {
		c := idem.Call{Scope: b.scope, Key: b.key + "-step", Fingerprint: plain[0]}
		calls = append(calls, c)
		if _, _, err := idem.Do(b.ctx, g, c, func(ctx context.Context) (sealedCard, error) {
			return idem.Step(ctx, "tokenised", op)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if h.Tx != nil {
		c := idem.Call{Scope: b.scope, Key: b.key + "-tx", Fingerprint: plain[0]}
		calls = append(calls, c)
		if _, _, err := idem.DoTx(b.ctx, g, c, b.inTx(h), func(ctx context.Context, write writer) (sealedCard, error) {
			runs++
			return card, write("sealed-tx")
		}); err != nil {
			t.Fatal(err)
		}
		c = idem.Call{Scope: b.scope, Key: b.key + "-txstep", Fingerprint: plain[0]}
		calls = append(calls, c)
		if _, _, err := idem.Do(b.ctx, g, c, func(ctx context.Context) (sealedCard, error) {
			runs++
			if _, err := h.Tx.Step(ctx, b.s, "tokenised", func(ctx context.Context, write writer) (string, error) {
				return Secrets[1], write("sealed-step")
			}); err != nil {
				return sealedCard{}, err
			}
			return card, nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	mw := idem.New(idem.Config{Store: b.s, Lease: lease, TTL: ttl, Seal: ring, Logger: slog.New(slog.DiscardHandler),
		Scope: func(*http.Request) (string, error) { return b.scope, nil }})
	srv := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/payment_methods/"+Secrets[1])
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"card_number":"`+Secrets[0]+`","access_token":"`+Secrets[1]+`"}`)
	}))
	post := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/payment_methods", strings.NewReader(string(input)))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", b.key+"-http")
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		return w
	}
	first := post()
	if first.Code != http.StatusCreated {
		t.Fatalf("the request got %d %s", first.Code, first.Body)
	}
	jsonReq := httptest.NewRequest("POST", "/v1/payment_methods", nil)
	jsonReq.Header.Set("Content-Type", "application/json")
	plain = append(plain, idem.FingerprintRequest(jsonReq, input))

	raw := h.Raw(t, b.s)
	if len(raw) == 0 {
		t.Fatal("Harness.Raw returned nothing: the case proves nothing")
	}
	if s := HoldsSecret(raw, Secrets...); s != "" {
		t.Errorf("the store holds %q", s)
	}
	if !bytes.Contains(raw, []byte(key.ID())) {
		t.Errorf("Harness.Raw does not show the id of the key the records are sealed under (%s): it does not read what the store holds", key.ID())
	}
	for _, fp := range plain {
		if bytes.Contains(raw, fp.Sum[:]) || bytes.Contains(bytes.ToLower(raw), []byte(hex.EncodeToString(fp.Sum[:]))) {
			t.Errorf("the store holds the plain fingerprint %x: it can be recomputed without the key", fp.Sum)
		}
	}

	before := runs
	for _, c := range calls {
		got, replayed, err := idem.Do(b.ctx, g, c, op)
		if err != nil || !replayed || got != card {
			t.Errorf("repeat of %s: %+v, replayed %v, %v; want the stored result", c.Key, got, replayed, err)
		}
	}
	again := post()
	if again.Code != first.Code || again.Body.String() != first.Body.String() ||
		again.Header().Get("Location") != first.Header().Get("Location") || again.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay %d %q %v; want %d %q %v", again.Code, again.Body, again.Header(), first.Code, first.Body, first.Header())
	}
	if runs != before {
		t.Errorf("repeats ran the operations %d more times", runs-before)
	}
	// Another process: its own data key, the same store's MAC secret.
	other, err := idem.OpenKeyring(b.ctx, b.s, key)
	if err != nil || other.SecretID() != ring.SecretID() {
		t.Fatalf("a second process's keyring: %v; want the same MAC secret", err)
	}
	g2 := idem.NewGuard(idem.GuardConfig{Store: b.s, Lease: lease, TTL: ttl, Seal: other, Logger: slog.New(slog.DiscardHandler)})
	if got, replayed, err := idem.Do(b.ctx, g2, calls[0], op); err != nil || !replayed || got != card {
		t.Errorf("another process's repeat: %+v, replayed %v, %v", got, replayed, err)
	}
}

func testSealedCopied(t *testing.T, h Harness) {
	if h.CopyResponse == nil {
		t.Skip("storetest: Harness.CopyResponse is nil: the case cannot write the store behind its back")
	}
	b := setup(t, h)
	_, _, g := b.sealedGuard()
	runs := 0
	op := func(who string) func(context.Context) (sealedCard, error) {
		return func(context.Context) (sealedCard, error) { runs++; return sealedCard{Card: who}, nil }
	}
	mine := idem.Call{Scope: b.scope, Key: b.key + "-mine", Fingerprint: b.fp}
	theirs := idem.Call{Scope: b.scope, Key: b.key + "-theirs", Fingerprint: b.fp}
	if _, _, err := idem.Do(b.ctx, g, mine, op("mine")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := idem.Do(b.ctx, g, theirs, op(Secrets[0])); err != nil {
		t.Fatal(err)
	}
	h.CopyResponse(t, b.s, b.scope, theirs.Key, mine.Key)
	got, _, err := idem.Do(b.ctx, g, mine, op("again"))
	if !errors.Is(err, idem.ErrRecordUnreadable) || got.Card != "" || runs != 2 {
		t.Errorf("the record with another's response: %+v, %v after %d runs; want ErrRecordUnreadable, no run, nothing of theirs", got, err, runs)
	}
	if got, replayed, err := idem.Do(b.ctx, g, theirs, op("again")); err != nil || !replayed || got.Card != Secrets[0] {
		t.Errorf("the record copied from: %+v, %v, %v; want it replayed", got, replayed, err)
	}
}

// sealedGuard opens the suite's key and a keyring on the bundle's store, and returns
// them with a Guard that seals under it.
func (b *bundle) sealedGuard() (*cloudkeys.Key, *seal.Keyring, *idem.Guard) {
	key, err := cloudkeys.Open(b.ctx, SealKeyURL)
	if err != nil {
		b.t.Fatal(err)
	}
	ring, err := idem.OpenKeyring(b.ctx, b.s, key)
	if err != nil {
		b.t.Fatal(err)
	}
	// A store this release created seals from its first request; one it did not (a
	// Redis store, which has no schema to create) is finalized and its sealing begun,
	// the handoff past, as an operator would (SPEC §20).
	if st, err := idem.ReadStoreState(b.ctx, b.s); err != nil {
		b.t.Fatal(err)
	} else if !st.Sealing.Unused && st.Sealing.Phase != idem.SealingBegun {
		if _, err := idem.FinalizeUpgrade(b.ctx, b.s, idem.FinalizeOptions{Force: true}); err != nil {
			b.t.Fatal(err)
		}
		if _, err := idem.BeginSealing(b.ctx, b.s, ring, idem.SealingChange{At: time.Now().Add(-idem.SealingHandoff - time.Minute)}); err != nil {
			b.t.Fatal(err)
		}
	}
	return key, ring, idem.NewGuard(idem.GuardConfig{Store: b.s, Lease: lease, TTL: ttl, Seal: ring, Logger: slog.New(slog.DiscardHandler)})
}
