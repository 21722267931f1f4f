package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/seal/cloudkeys"
)

// Sealed records (SPEC §19): --encryption-key on every command that reads or writes
// records' content.

// keyURLs is --encryption-key: repeatable, each value one or several key URLs,
// comma-separated (IDEM_ENCRYPTION_KEY=B,A). A value is never printed: a
// base64key:// URL is the key itself.
type keyURLs struct{ urls []string }

func (k *keyURLs) String() string { return "" }

func (k *keyURLs) Set(s string) error {
	n := len(k.urls)
	for u := range strings.SplitSeq(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			k.urls = append(k.urls, u)
		}
	}
	if len(k.urls) == n {
		return errors.New("want a key URL: base64key://…, awskms://…, gcpkms://…, azurekeyvault://… or hashivault://…")
	}
	return nil
}

const encryptionKeyUsage = "a key `URL` that seals the records' content (SPEC §19, docs/security.md): " +
	"base64key://<32 random bytes, URL-safe base64> (openssl rand 32 | base64 | tr '+/' '-_'), " +
	"awskms://<key or alias>?region=…, gcpkms://projects/…/cryptoKeys/…, azurekeyvault://<vault>.vault.azure.net/keys/…, hashivault://<transit key>; " +
	"repeatable, or several comma-separated: the first seals new records, every one opens (to rotate, put the new key first and keep the old one until its records expire). " +
	"Prefer IDEM_ENCRYPTION_KEY: a command line is visible to every user of the host"

func (k *keyURLs) register(fs *flag.FlagSet) { fs.Var(k, "encryption-key", encryptionKeyUsage) }

// open opens the keys, or none without --encryption-key; close closes them.
func (k *keyURLs) open(ctx context.Context) (keys []seal.KeyWrapper, close func(), err error) {
	if len(k.urls) == 0 {
		return nil, func() {}, nil
	}
	keys, err = cloudkeys.OpenAll(ctx, k.urls...)
	if err != nil {
		return nil, nil, fmt.Errorf("--encryption-key: %w", err)
	}
	return keys, func() { cloudkeys.CloseAll(keys) }, nil
}

// keyring opens the keys and the keyring of the store (its MAC secret, made by the
// first process that seals it), or returns nil without --encryption-key, after a WARN
// that records are stored in clear and how to seal them (the start line says under
// which key they are sealed: sealedAttrs).
func (k *keyURLs) keyring(ctx context.Context, store idemstore.Store, logger *slog.Logger) (*seal.Keyring, func(), error) {
	keys, closeKeys, err := k.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	if keys == nil {
		logger.Warn("records are stored in clear: the stored responses (card numbers, tokens…) and fingerprints are readable by anyone who reads the store or its backups; " +
			"seal them with --encryption-key (IDEM_ENCRYPTION_KEY) base64key://<32 random bytes> or a key manager's URL (docs/security.md)")
		return nil, closeKeys, nil
	}
	ring, err := idem.OpenKeyring(ctx, store, keys...)
	if err != nil {
		closeKeys()
		return nil, nil, fmt.Errorf("--encryption-key: %w", err)
	}
	return ring, closeKeys, nil
}

// checkSealing checks the store's sealing state at start (idem.CheckSealing) and says
// what it means for this process: without a key, a store whose sealing began is
// refused (naming the keys it needs) unless sealingOff, which is then said in a WARN;
// with one, a store whose sealing has not begun is said in a WARN (ready mode: records
// in clear until idem keys seal --begin).
func checkSealing(ctx context.Context, store idemstore.Store, ring *seal.Keyring, sealingOff bool, logger *slog.Logger) (idem.SealingState, error) {
	st, err := idem.CheckSealing(ctx, store, ring, sealingOff)
	if err != nil {
		return st, err
	}
	switch {
	case ring != nil && st.Phase == idem.SealingNone:
		logger.Warn("sealing has not begun on this store: this process has a key but writes records in clear (ready mode), and opens sealed ones, "+
			"until an operator runs idem keys seal --begin once every process that serves the store runs with a key (docs/security.md)",
			"sealed_under", ring.SealingKeyID())
	case ring == nil && st.Phase != idem.SealingNone:
		logger.Warn("the store's sealing " + st.String() + "; serving it without a key because --sealing-off says sealing is being turned off: " +
			"sealed records fail closed (500 record_unreadable), and records under a keyed scope (idem proxy's, idem payments') are not found, " +
			"so their retries run again: start processes without a key only after the last sealed record expired (docs/security.md)")
	}
	return st, nil
}

// sealingMode names the start line's sealing mode: off (no key, nothing sealed),
// ready (a key, sealing not begun), handoff (begun, not in effect yet), sealed,
// ending (ended, not in effect yet), ended (records in clear again), or
// turning-off (no key, --sealing-off).
func sealingMode(st idem.SealingState, ring *seal.Keyring) string {
	now := time.Now()
	switch {
	case ring == nil && st.Phase == idem.SealingNone:
		return "off"
	case ring == nil:
		return "turning-off"
	case st.Phase == idem.SealingNone:
		return "ready"
	case st.Phase == idem.SealingBegun && now.Before(st.SealsFrom()):
		return "handoff"
	case st.Phase == idem.SealingBegun:
		return "sealed"
	case now.Before(st.ClearFrom()):
		return "ending"
	}
	return "ended"
}

// sealedAttrs are the start line's attributes of a keyring: the key that seals, every
// key that opens, and the MAC secret's id (the same in every process of the store);
// none without one.
func sealedAttrs(ring *seal.Keyring) []any {
	if ring == nil {
		return nil
	}
	return []any{"sealed_under", ring.SealingKeyID(), "keys", strings.Join(ring.KeyIDs(), ","), "mac_secret", ring.SecretID()}
}

// opener opens the keys into a keyring that seals and opens records' content, for
// `idem keys`, which keys no fingerprint (and so needs no MAC secret); nil without
// --encryption-key.
func (k *keyURLs) opener(ctx context.Context) (*seal.Keyring, func(), error) {
	keys, closeKeys, err := k.open(ctx)
	if err != nil || keys == nil {
		return nil, closeKeys, err
	}
	ring, err := seal.NewKeyring(ctx, nil, keys...)
	if err != nil {
		closeKeys()
		return nil, nil, fmt.Errorf("--encryption-key: %w", err)
	}
	return ring, closeKeys, nil
}

// storeRecord is the store's record that an operator's record shows (its response
// and steps as the store keeps them), for admin.OpenRecord.
func storeRecord(r *admin.Record) *idemstore.Record {
	rec := &idemstore.Record{Scope: r.Scope, Key: r.Key, ID: r.ID, Fingerprint: r.Fingerprint, State: r.State, Steps: r.Steps}
	if r.State == idemstore.StateCompleted {
		rec.Response = &idemstore.Response{Status: r.Status, NotStored: r.NotStored, OutcomeUnknown: r.OutcomeUnknown, Header: r.Header, Body: r.Body}
	}
	return rec
}

// openShown opens the sealed response and steps of r with ring (nil: none given) in
// place. It returns what to say instead when it cannot: the key the record is sealed
// under, and that --encryption-key must hold it.
func openShown(ctx context.Context, ring *seal.Keyring, r *admin.Record) error {
	rec := storeRecord(r)
	if !admin.IsSealed(rec) {
		return nil
	}
	open, err := admin.OpenRecord(ctx, ring, rec)
	if err != nil {
		if ring == nil {
			return fmt.Errorf("the record is sealed (SPEC §19): give --encryption-key with the key it is sealed under to read its body (%v)", err)
		}
		return err
	}
	r.Steps = open.Steps
	if open.Response != nil {
		r.Header, r.Body, r.BodySize = open.Response.Header, open.Response.Body, len(open.Response.Body)
	}
	return nil
}
