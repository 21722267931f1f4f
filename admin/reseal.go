package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/seal"
)

// Resealer is a [Store] that can replace a record's sealed content in place, for
// [Rewrap]. SQLite, PostgreSQL, MySQL and the memory store are; a store that is not (Redis)
// cannot retire a key by re-wrapping.
type Resealer interface {
	// RecordReseal replaces the sealed response body (params.Body, when not nil) and
	// the sealed step results (params.Steps, when not nil) of the record (Scope, Key)
	// whose id is ID, provided they are still exactly OldBody and OldSteps: a
	// compare-and-swap, so that a record changed since it was read (completed,
	// stepped, deleted, claimed anew) is left as it is, with [ErrRecordChanged]. It
	// changes nothing else (state, lease, expiry, fingerprint). An absent record is
	// [idemstore.ErrNotFound]. (The database's free pages, logs and backups may keep
	// the old value until they are reused or expire.)
	RecordReseal(ctx context.Context, params *RecordResealParams) error
}

// RecordResealParams are the arguments of [Resealer.RecordReseal].
type RecordResealParams struct {
	Scope, Key, ID  string
	OldBody, Body   []byte
	OldSteps, Steps []byte
}

// ErrRecordChanged is returned by [Resealer.RecordReseal] for a record whose id or
// sealed content is no longer what the caller read.
var ErrRecordChanged = errors.New("idem admin: the record changed since it was read")

// RewrapResult says what [Rewrap] did.
type RewrapResult struct {
	// Secrets is how many generations of the MAC secret were re-wrapped.
	Secrets int
	// Records is how many records were re-sealed under the keyring's data key.
	Records int
	// Changed is how many records changed while they were re-sealed (left as they
	// are: run Rewrap again).
	Changed int
	// Unreadable is how many records none of the keys opens (sealed under a key that
	// is not given, or lost; altered): left as they are, they still fail closed.
	Unreadable int
}

// Rewrap retires every key but keys[0] from store's current data (SPEC §19,
// `idem keys rewrap`): it re-wraps every generation of the MAC secret under keys[0]
// alone, and re-seals every live record's response and step results whose data key is
// wrapped under another key under a keyring whose data key is wrapped under keys[0];
// each value is overwritten in place (compare-and-swap: a record that changes
// meanwhile is counted in Changed and left as it is; one that no key opens, in
// Unreadable). Afterwards a key retired from
// keys opens nothing current in the store: only backups and records made meanwhile by
// a process that still seals under it. Run it once every process seals under keys[0]
// (its start line says sealed_under=keys[0]), with the retired keys after keys[0] so
// that what they wrapped can be opened. It needs a store that lists ([Capabilities]
// List) and reseals ([Resealer]).
func Rewrap(ctx context.Context, st idemstore.Store, keys ...seal.KeyWrapper) (RewrapResult, error) {
	var res RewrapResult
	store, ok := st.(Store)
	rs, ok2 := st.(Resealer)
	if !ok || !ok2 || !store.AdminCapabilities().List {
		return res, fmt.Errorf("idem admin: this store cannot re-wrap (it cannot list its records, or replace them in place: Redis): %w", errors.ErrUnsupported)
	}
	if len(keys) == 0 {
		return res, errors.New("idem admin: Rewrap needs the keys: the one to keep first, the retired ones after it")
	}
	ring, err := idem.OpenKeyring(ctx, st, keys...)
	if err != nil {
		return res, err
	}
	primary := keys[0].ID()
	var after RecordListParams
	for {
		page, err := store.RecordList(ctx, &RecordListParams{AfterScope: after.AfterScope, AfterKey: after.AfterKey, Limit: MaxListLimit})
		if err != nil {
			return res, err
		}
		for _, r := range page.Records {
			changed, err := resealRecord(ctx, store, rs, ring, primary, r.Scope, r.Key)
			switch {
			case errors.Is(err, ErrRecordChanged) || errors.Is(err, idemstore.ErrNotFound):
				res.Changed++
			case errors.Is(err, idem.ErrRecordUnreadable):
				res.Unreadable++
			case err != nil:
				return res, fmt.Errorf("idem admin: re-sealing the record %s: %w", r.ID, err)
			case changed:
				res.Records++
			}
		}
		if !page.More || len(page.Records) == 0 {
			break
		}
		last := page.Records[len(page.Records)-1]
		after.AfterScope, after.AfterKey = last.Scope, last.Key
	}
	n, err := rewrapSecrets(ctx, store, rs, keys)
	res.Secrets = n
	return res, err
}

// resealRecord re-seals what the record (scope, key) holds sealed under a data key
// that primary did not wrap: true when it did.
func resealRecord(ctx context.Context, store Store, rs Resealer, ring *seal.Keyring, primary, scope, key string) (bool, error) {
	got, err := store.RecordInspect(ctx, &RecordInspectParams{Scope: scope, Key: key, Body: true})
	if err != nil {
		return false, err
	}
	r := got.Record
	retired := func(v []byte) bool { return seal.Sealed(v) && seal.KeyIDOf(v) != primary }
	if !retired(r.Body) && !retired(r.Steps) {
		return false, nil
	}
	rec := &idemstore.Record{Scope: r.Scope, Key: r.Key, ID: r.ID, State: r.State, Fingerprint: r.Fingerprint, Steps: r.Steps}
	if r.State == idemstore.StateCompleted {
		rec.Response = &idemstore.Response{Status: r.Status, Header: r.Header, Body: r.Body, NotStored: r.NotStored, OutcomeUnknown: r.OutcomeUnknown}
	}
	open, err := OpenRecord(ctx, ring, rec)
	if err != nil {
		return false, err
	}
	p := &RecordResealParams{Scope: r.Scope, Key: r.Key, ID: r.ID}
	if retired(r.Body) {
		sealed, err := SealResponse(ring, r.Scope, r.Key, r.ID, open.Response)
		if err != nil {
			return false, err
		}
		p.OldBody, p.Body = r.Body, sealed.Body
	}
	if retired(r.Steps) {
		p.OldSteps = r.Steps
		if p.Steps, err = ring.Seal(seal.PurposeSteps, seal.Binding{Scope: r.Scope, Key: r.Key, RecordID: r.ID}, open.Steps); err != nil {
			return false, err
		}
	}
	return true, rs.RecordReseal(ctx, p)
}

// macSecretPrefix starts the keys of the MAC secret's generations in the reserved
// scope (idem.OpenKeyring keeps them).
const macSecretPrefix = "mac-secret-"

// rewrapSecrets re-wraps every generation of the MAC secret that is wrapped under
// another key than keys[0] under keys[0] alone, and returns how many it re-wrapped.
func rewrapSecrets(ctx context.Context, store Store, rs Resealer, keys []seal.KeyWrapper) (int, error) {
	n := 0
	list, err := store.RecordList(ctx, &RecordListParams{Scope: idemstore.ReservedScope, Limit: MaxListLimit})
	if err != nil {
		return n, err
	}
	for _, l := range list.Records {
		if len(l.Key) <= len(macSecretPrefix) || l.Key[:len(macSecretPrefix)] != macSecretPrefix {
			continue
		}
		got, err := store.RecordInspect(ctx, &RecordInspectParams{Scope: l.Scope, Key: l.Key, Body: true})
		if err != nil {
			return n, err
		}
		r := got.Record
		ids, err := seal.SecretKeyIDs(r.Body)
		if err != nil {
			return n, fmt.Errorf("idem admin: the MAC secret's record %q: %w", l.Key, err)
		}
		if slices.Equal(ids, []string{keys[0].ID()}) {
			continue
		}
		secret, err := seal.UnwrapSecret(ctx, r.Body, keys...)
		if err != nil {
			return n, fmt.Errorf("idem admin: the MAC secret's record %q: %w", l.Key, err)
		}
		blob, err := seal.WrapSecret(ctx, secret, keys[0])
		clear(secret)
		if err != nil {
			return n, err
		}
		if bytes.Equal(blob, r.Body) {
			continue
		}
		if err := rs.RecordReseal(ctx, &RecordResealParams{Scope: l.Scope, Key: l.Key, ID: r.ID, OldBody: r.Body, Body: blob}); err != nil {
			return n, fmt.Errorf("idem admin: re-wrapping the MAC secret's record %q: %w", l.Key, err)
		}
		n++
	}
	return n, nil
}
