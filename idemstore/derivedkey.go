package idemstore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
)

// Record ids and derived keys (SPEC §13, §17, §20). An operation that calls an
// outside system (a card processor, a bank, the upstream of idem proxy) sends it a
// key derived from its record, hex SHA-256(record id ‖ step) ([DeriveKey]), so that
// the outside system recognises a call repeated after a crash, a takeover or a
// release, and deduplicates it. Every release of idem computes this same formula,
// whichever made the record: a record begun by one release and resumed by another
// (a rolling upgrade, a rollback) keeps its derived keys.
//
// The id of a record this release makes is derived from the request
// ([RecordIDFor]): its scope, key and fingerprint. So the retry that makes a new
// record after the first was lost (a store failover that dropped its last commits)
// or released makes the same id, and derives the same keys. A record made by idem
// 0.2.0 or older has a random id (32 hex digits); it keeps it, and its keys, when
// this release takes it over.

// RecordIDPrefix starts the id of every record whose id is derived from its request
// ([RecordIDFor]); the ids of earlier releases are 32 hex digits, without it.
const RecordIDPrefix = "rd"

// recordIDLabel separates these sums from every other SHA-256 idem computes.
const recordIDLabel = "idem record id v1\x00"

// RecordIDFor returns the id of the record a claim of (scope, key) by a request
// fingerprinted fp creates: [RecordIDPrefix] and the hex of the first 16 bytes of
// SHA-256 over a label and the length-prefixed scope and key, the fingerprint's
// version and its sum. It is the same for every claim of one request, and differs
// for another scope, key or request. Under a keyring the fingerprint is keyed (an
// HMAC under the store's MAC secret), so the id reveals nothing the stored
// fingerprint does not.
func RecordIDFor(scope, key string, fp Fingerprint) string {
	h := sha256.New()
	h.Write([]byte(recordIDLabel))
	writeField(h, scope)
	writeField(h, key)
	var v [4]byte
	binary.BigEndian.PutUint32(v[:], uint32(fp.Version))
	h.Write(v[:])
	h.Write(fp.Sum[:])
	var sum [sha256.Size]byte
	var out [len(RecordIDPrefix) + 32]byte
	copy(out[:], RecordIDPrefix)
	hex.Encode(out[len(RecordIDPrefix):], h.Sum(sum[:0])[:16])
	return string(out[:])
}

// DerivedKey returns the idempotency key of the outside call made at step by the
// operation of record r (SPEC §13): [DeriveKey] of its id and step.
func (r *Record) DerivedKey(step string) string { return DeriveKey(r.ID, step) }

// DeriveKey returns hex SHA-256(recordID ‖ step): the idempotency key of the outside
// call made at step by the operation of the record recordID, as every release of
// idem derives it. It is the same for every holder of the record (a takeover keeps
// its id), and, for a record of this release, for every record of the same request
// ([RecordIDFor]). An operator uses it to find the call in the outside system's
// records (`idem keys get --step`).
func DeriveKey(recordID, step string) string {
	sum := sha256.Sum256([]byte(recordID + step))
	return hex.EncodeToString(sum[:])
}

// writeField writes s to h after its length, so that no two field lists hash alike.
func writeField(h hash.Hash, s string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}
