package seal

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// The MAC secret keys fingerprints and scopes. Every process that shares a store must
// hold the same one, and it must outlive every rotation of the sealing keys: a retry
// whose fingerprint or scope changed with a rotation would miss its record (and
// execute again) or be refused. Key managers only encrypt and decrypt, at random, so
// nothing can derive it from them alike in every process: it is made once, at random,
// and kept wrapped under each configured key (idem.OpenKeyring keeps it in the store).

// secretSize is the MAC secret's length.
const secretSize = 32

// NewMACSecret returns a new random MAC secret.
func NewMACSecret() []byte {
	s := make([]byte, secretSize)
	_, _ = rand.Read(s)
	return s
}

// secretID is a short, non-secret id of a MAC secret: the first 8 bytes of an HMAC of
// a constant under it, in hex.
func secretID(secret []byte) string {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("idem secret id"))
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// wrappedSecret is the MAC secret wrapped under each of several keys, as it is kept.
type wrappedSecret struct {
	Format int `json:"format"`
	// ID is the secret's id: a check that what a key unwrapped is the secret.
	ID      string         `json:"id"`
	Wrapped []wrappedUnder `json:"wrapped"`
}

type wrappedUnder struct {
	KeyID  string `json:"key_id"`
	Secret []byte `json:"secret"`
}

// WrapSecret wraps the MAC secret under each of keys (one call to each key manager),
// in the form that [UnwrapSecret] reads: a small JSON document, not secret.
func WrapSecret(ctx context.Context, secret []byte, keys ...KeyWrapper) ([]byte, error) {
	if len(secret) != secretSize {
		return nil, fmt.Errorf("seal: a MAC secret is %d bytes, got %d", secretSize, len(secret))
	}
	doc := wrappedSecret{Format: 1, ID: secretID(secret)}
	for _, k := range keys {
		w, err := k.Wrap(ctx, secret)
		if err != nil {
			return nil, fmt.Errorf("seal: wrapping the MAC secret under %s: %w", k.ID(), err)
		}
		doc.Wrapped = append(doc.Wrapped, wrappedUnder{KeyID: k.ID(), Secret: w})
	}
	return json.Marshal(doc)
}

// SecretKeyIDs returns the ids of the keys a MAC secret kept by [WrapSecret] is
// wrapped under.
func SecretKeyIDs(blob []byte) ([]string, error) {
	var doc wrappedSecret
	if err := json.Unmarshal(blob, &doc); err != nil || doc.Format != 1 {
		return nil, fmt.Errorf("seal: the kept MAC secret is malformed (format %d): %v", doc.Format, err)
	}
	ids := make([]string, len(doc.Wrapped))
	for i, w := range doc.Wrapped {
		ids[i] = w.KeyID
	}
	return ids, nil
}

// ErrSecretLocked is matched by the error of [UnwrapSecret] when none of the keys
// opens the kept MAC secret: it was wrapped under keys none of which is configured.
var ErrSecretLocked = errors.New("seal: none of the configured keys opens the kept MAC secret")

// UnwrapSecret opens a MAC secret kept by [WrapSecret] with the first of keys it is
// wrapped under, and checks it against its id. It fails with an error matching
// [ErrSecretLocked] when it is wrapped under none of them, or none opens it, and with
// one wrapping [ErrKeyUnavailable] when a key manager did not answer.
func UnwrapSecret(ctx context.Context, blob []byte, keys ...KeyWrapper) ([]byte, error) {
	var doc wrappedSecret
	if err := json.Unmarshal(blob, &doc); err != nil || doc.Format != 1 {
		return nil, fmt.Errorf("seal: the kept MAC secret is malformed (format %d): %v", doc.Format, err)
	}
	var failures []string
	for _, k := range keys {
		i := slices.IndexFunc(doc.Wrapped, func(w wrappedUnder) bool { return w.KeyID == k.ID() })
		if i < 0 {
			continue
		}
		s, err := k.Unwrap(ctx, doc.Wrapped[i].Secret)
		switch {
		case errors.Is(err, ErrKeyUnavailable):
			return nil, fmt.Errorf("seal: unwrapping the MAC secret under %s: %w", k.ID(), err)
		case err != nil:
			failures = append(failures, k.ID()+": "+err.Error())
		case len(s) != secretSize || !hmac.Equal([]byte(secretID(s)), []byte(doc.ID)):
			failures = append(failures, k.ID()+": it unwraps to another secret")
		default:
			return s, nil
		}
	}
	ids := make([]string, len(doc.Wrapped))
	for i, w := range doc.Wrapped {
		ids[i] = w.KeyID
	}
	err := fmt.Errorf("%w: it is wrapped under %s", ErrSecretLocked, strings.Join(ids, ", "))
	if len(failures) > 0 {
		err = fmt.Errorf("%w; %s", err, strings.Join(failures, "; "))
	}
	return nil, err
}
