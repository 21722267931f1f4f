// Package cloudkeys makes the key-encryption keys of sealed records ([seal.KeyWrapper])
// of key URLs, through gocloud.dev/secrets, which wraps and unwraps with them: no key
// wrapping is written here.
//
//	base64key://<32 bytes, URL-safe base64>     a local key (gocloud.dev/secrets/localsecrets)
//	awskms://<key id or alias>?region=…         AWS KMS (gocloud.dev/secrets/awskms)
//	gcpkms://projects/…/cryptoKeys/<key>        Google Cloud KMS (gocloud.dev/secrets/gcpkms)
//	azurekeyvault://<vault>.vault.azure.net/keys/<key>   Azure Key Vault
//	hashivault://<transit key>                  HashiCorp Vault's transit engine
//
// This package registers base64key:// only. A program that takes a key manager's URL
// imports its driver for its side effect, as `idem` does for all four:
//
//	import _ "gocloud.dev/secrets/awskms"
//
// and each driver finds its credentials as its SDK does (environment, instance role,
// VAULT_SERVER_URL and VAULT_SERVER_TOKEN…); see gocloud.dev/secrets.
//
// A key's id ([seal.KeyWrapper.ID]), written beside everything sealed under it, is its
// URL without the query (awskms://alias/idem), and for base64key:// a hash of the key
// (base64key:3fa9…), never the key.
package cloudkeys

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"gocloud.dev/gcerrors"
	"gocloud.dev/secrets"
	"gocloud.dev/secrets/localsecrets"

	"github.com/idem-go/idem/seal"
)

// Key is a key-encryption key opened from a URL: a [seal.KeyWrapper] on a
// gocloud.dev/secrets Keeper. Close it when done.
type Key struct {
	id     string
	local  bool
	keeper *secrets.Keeper
}

// Open opens the key at rawURL. The URL's secret part (a base64key's key) never shows
// in an error.
func Open(ctx context.Context, rawURL string) (*Key, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error holds the URL, and so perhaps a key.
		return nil, errors.New("cloudkeys: the key URL does not parse (want base64key://…, awskms://…, gcpkms://…, azurekeyvault://… or hashivault://…)")
	}
	k := &Key{}
	switch u.Scheme {
	case localsecrets.Scheme:
		if u.Host == "" {
			// gocloud would make a random key: one per process, which no other
			// process, and no restart, could open.
			return nil, errors.New("cloudkeys: base64key:// needs its key: base64key://<32 random bytes in URL-safe base64> (openssl rand 32 | base64 | tr '+/' '-_')")
		}
		raw, err := localsecrets.Base64Key(u.Host)
		if err != nil {
			return nil, errors.New("cloudkeys: a base64key:// URL holds 32 bytes in URL-safe base64 (base64.URLEncoding)")
		}
		sum := sha256.Sum256(append([]byte("idem key id\x00"), raw[:]...))
		k.id, k.local = "base64key:"+hex.EncodeToString(sum[:8]), true
	case "":
		return nil, errors.New("cloudkeys: a key URL needs a scheme: base64key://, awskms://, gcpkms://, azurekeyvault:// or hashivault://")
	default:
		k.id = u.Scheme + "://" + u.Host + u.EscapedPath()
	}
	if k.keeper, err = secrets.OpenKeeper(ctx, rawURL); err != nil {
		if k.local {
			return nil, errors.New("cloudkeys: opening a base64key:// key failed")
		}
		if strings.Contains(err.Error(), "no driver registered") {
			return nil, fmt.Errorf("cloudkeys: no driver for %s:// keys in this program (import gocloud.dev/secrets/%s)", u.Scheme, driverOf(u.Scheme))
		}
		return nil, fmt.Errorf("cloudkeys: opening %s: %w", k.id, err)
	}
	return k, nil
}

func driverOf(scheme string) string {
	switch scheme {
	case "awskms", "gcpkms", "azurekeyvault", "hashivault":
		return scheme
	}
	return "<driver>"
}

// OpenAll opens the keys at urls, in order (the first seals), closing those opened
// when one fails.
func OpenAll(ctx context.Context, urls ...string) ([]seal.KeyWrapper, error) {
	keys := make([]seal.KeyWrapper, 0, len(urls))
	for _, u := range urls {
		k, err := Open(ctx, u)
		if err != nil {
			CloseAll(keys)
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// CloseAll closes the keys OpenAll opened.
func CloseAll(keys []seal.KeyWrapper) {
	for _, k := range keys {
		if c, ok := k.(*Key); ok {
			_ = c.Close()
		}
	}
}

// ID is the key's id: its URL without the query, or for base64key:// "base64key:"
// and the first 8 bytes of a SHA-256 of the key, in hex.
func (k *Key) ID() string { return k.id }

// Wrap encrypts key with the key manager (or the local key).
func (k *Key) Wrap(ctx context.Context, key []byte) ([]byte, error) {
	b, err := k.keeper.Encrypt(ctx, key)
	return b, k.classify(err)
}

// Unwrap decrypts what Wrap made. A key manager that did not answer (a timeout, an
// outage, an error it does not classify) wraps [seal.ErrKeyUnavailable]; a value it
// refuses (not its own, altered), or one the local key does not open, does not.
func (k *Key) Unwrap(ctx context.Context, wrapped []byte) ([]byte, error) {
	b, err := k.keeper.Decrypt(ctx, wrapped)
	return b, k.classify(err)
}

// classify marks the errors of a key manager that may pass: every one but a refusal.
func (k *Key) classify(err error) error {
	if err == nil || k.local {
		return err
	}
	switch gcerrors.Code(err) {
	case gcerrors.InvalidArgument, gcerrors.NotFound, gcerrors.FailedPrecondition, gcerrors.PermissionDenied, gcerrors.Unimplemented:
		return err
	}
	return fmt.Errorf("%w: %w", seal.ErrKeyUnavailable, err)
}

// Close releases the key manager's client.
func (k *Key) Close() error { return k.keeper.Close() }
