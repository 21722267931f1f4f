package idemstore

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"strings"
)

// Derived keys (SPEC §13, §17). An operation that calls an outside system (a card
// processor, a bank, the upstream of idem proxy) sends it a key derived from its
// record, so that the outside system recognises a call repeated after a crash, a
// takeover or a release, and deduplicates it.
//
// A record made by this version has an id that starts with [RecordIDPrefix]; its
// derived keys come from what the client sent and the record cannot lose: the scope,
// the key, the request's fingerprint and the step. When the record itself is lost (a
// store failover that dropped its last commits, a released key), the retry makes a
// new record with a new id, but the same request derives the same keys, and an
// outside system that deduplicates absorbs the repeat. A record made before has an
// id without the prefix; its keys stay hex SHA-256(record id ‖ step), as they were
// when its operation began, so that an operation in flight across the upgrade keeps
// its keys.

// RecordIDPrefix starts the id of every record whose derived keys come from its
// request ([Record.DerivedKey]). A record id is this prefix and 32 hex digits
// ([NewRecordID]).
const RecordIDPrefix = "r2"

// NewRecordID returns a fresh record id: [RecordIDPrefix] and 16 random bytes in hex.
func NewRecordID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return RecordIDPrefix + hex.EncodeToString(b[:])
}

// derivedKeyLabel separates these sums from every other SHA-256 idem computes.
const derivedKeyLabel = "idem derived key v2\x00"

// DerivedKey returns the idempotency key of the outside call made at step by the
// operation of record r (SPEC §13): for a record whose id starts with
// [RecordIDPrefix], hex SHA-256 over a label and the length-prefixed scope, key,
// fingerprint (version and sum) and step; for an older record, hex SHA-256(id ‖ step).
//
// It is the same for every holder of the record (a takeover keeps scope, key,
// fingerprint and id), and for a new record made by the same request after the
// record was lost or released, so that the outside system deduplicates the call. A
// key reused with the same parameters after its record expired derives the same key
// again: the outside system answers from its memory of the first call, if it still
// has one. When fingerprints are keyed, the derived key is keyed through them.
func (r *Record) DerivedKey(step string) string {
	return DeriveKey(r.Scope, r.Key, r.ID, r.Fingerprint, step)
}

// DeriveKey is [Record.DerivedKey] for a record known by its parts.
func DeriveKey(scope, key, recordID string, fp Fingerprint, step string) string {
	if !strings.HasPrefix(recordID, RecordIDPrefix) {
		sum := sha256.Sum256([]byte(recordID + step))
		return hex.EncodeToString(sum[:])
	}
	h := sha256.New()
	h.Write([]byte(derivedKeyLabel))
	writeField(h, scope)
	writeField(h, key)
	var v [4]byte
	binary.BigEndian.PutUint32(v[:], uint32(fp.Version))
	h.Write(v[:])
	h.Write(fp.Sum[:])
	writeField(h, step)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0]))
}

// writeField writes s to h after its length, so that no two field lists hash alike.
func writeField(h hash.Hash, s string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}
