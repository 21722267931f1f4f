package idemstore

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
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
	var out [RecordIDLen]byte
	return string(AppendRecordID(out[:0], scope, key, fp))
}

// RecordIDLen is the length of the ids [RecordIDFor] makes.
const RecordIDLen = len(RecordIDPrefix) + 32

// AppendRecordID appends [RecordIDFor](scope, key, fp) to dst: for a caller that
// makes the id with other strings in one allocation (the claim's token and id).
func AppendRecordID(dst []byte, scope, key string, fp Fingerprint) []byte {
	// One buffer hashed at once, on the stack for the usual scope and key: a claim
	// computes it, and hashing through hash.Hash would allocate for every field.
	var in [256]byte
	b := append(in[:0], recordIDLabel...)
	b = appendField(b, scope)
	b = appendField(b, key)
	b = binary.BigEndian.AppendUint32(b, uint32(fp.Version))
	b = append(b, fp.Sum[:]...)
	sum := sha256.Sum256(b)
	dst = append(dst, RecordIDPrefix...)
	return hex.AppendEncode(dst, sum[:16])
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

// appendField appends s to b after its length, so that no two field lists hash alike.
func appendField(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}
