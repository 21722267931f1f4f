package seal

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// KeyWrapper is a key-encryption key: it wraps and unwraps the Keyring's data keys and
// the MAC secret, and never sees a record. seal/cloudkeys makes them of key URLs
// (a key manager's, or a local base64key://); the key itself need never leave the key
// manager.
type KeyWrapper interface {
	// ID names the key, the same in every process and across restarts, and is not
	// secret: it is written beside every value sealed under the key, so that the key
	// that opens it is found, and named in logs when it is missing. At most 255 bytes.
	ID() string
	// Wrap encrypts a data key (an authenticated encryption: Unwrap fails on anything
	// Wrap did not make under this key).
	Wrap(ctx context.Context, key []byte) ([]byte, error)
	// Unwrap decrypts what Wrap made. A failure to reach the key manager (a timeout,
	// an outage) wraps [ErrKeyUnavailable], so that it is told apart from a value that
	// this key cannot open.
	Unwrap(ctx context.Context, wrapped []byte) ([]byte, error)
}

// Purpose says what a sealed value is; it is part of the value's associated data, so
// that one kind never opens as another.
type Purpose byte

const (
	// PurposeResponse: a stored response (status, headers and body).
	PurposeResponse Purpose = 'r'
	// PurposeSteps: the results a record's steps saved (SPEC §13).
	PurposeSteps Purpose = 's'
)

// Binding names the record a sealed value belongs to: its associated data.
type Binding struct {
	Scope    string
	Key      string
	RecordID string
}

// AnyRecord, as a Binding's RecordID, opens a value sealed for any record of the
// binding's scope and key: for a copy of a record's response kept outside the record
// (the backstop's table, which outlives the record it answered for). The scope and
// key still bind.
const AnyRecord = "*"

// UnwrapTimeout bounds the key manager's unwrapping of a data key met for the first
// time (Open's ctx may end it sooner): past it the value is not opened now, with an
// error wrapping [ErrKeyUnavailable]. Data keys met before need no key manager.
const UnwrapTimeout = 5 * time.Second

// ErrUnreadable is matched by the error of [Keyring.Open] for a value that can never
// be opened with this Keyring: sealed under a key that is not configured, altered,
// sealed for another record, or malformed. An [*UnreadableError] says which.
var ErrUnreadable = errors.New("seal: the sealed value cannot be opened")

// ErrKeyUnavailable is wrapped by a [KeyWrapper]'s error when the key manager could
// not be reached or did not answer in time: the value may open later.
var ErrKeyUnavailable = errors.New("seal: the key manager is unavailable")

// ErrNotSealed is the error of [Keyring.Open] for a value that is not sealed.
var ErrNotSealed = errors.New("seal: the value is not sealed")

// UnreadableError says why a sealed value cannot be opened. It matches
// [ErrUnreadable].
type UnreadableError struct {
	// KeyID is the key the value says it was sealed under ("" when malformed).
	KeyID string
	// Reason says what is wrong, in words for a log line.
	Reason string
	// Err is the key wrapper's error, when unwrapping the data key failed.
	Err error
}

func (e *UnreadableError) Error() string {
	s := "seal: the sealed value cannot be opened: " + e.Reason
	if e.KeyID != "" {
		s += " (key " + e.KeyID + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports whether target is [ErrUnreadable].
func (e *UnreadableError) Is(target error) bool { return target == ErrUnreadable }

// Unwrap returns the key wrapper's error.
func (e *UnreadableError) Unwrap() error { return e.Err }

// Keyring seals and opens record values, and keys fingerprints and scopes (SPEC §19).
// Its first KeyWrapper seals (its data key is wrapped under it); every one of them
// opens. It is safe for concurrent use. Make one with [NewKeyring] (idem.OpenKeyring
// makes one with the store's MAC secret).
type Keyring struct {
	keys []KeyWrapper
	byID map[string]KeyWrapper

	// The data key values are sealed with: a random AES-256-GCM key of this Keyring,
	// wrapped under keys[0]. Nonces are a random prefix and a counter, never repeated
	// under this key, which no other Keyring has.
	aead    cipher.AEAD
	header  []byte // magic, key id and wrapped data key: the start of every value sealed here
	prefix  [4]byte
	counter atomic.Uint64

	// Data keys unwrapped so far, by key id and wrapped key: an AEAD, or the
	// failure of unwrapping it, until its retry is due.
	mu     sync.RWMutex
	opened map[string]openedKey
	now    func() time.Time // the clock of the retries; tests inject one

	// The MAC keys, derived from the MAC secret; nil without one.
	fpKey, scopeKey, stateKey []byte
	secretID                  string
	macs, scopeMACs           sync.Pool // of *macState, under fpKey and scopeKey
}

type openedKey struct {
	aead cipher.AEAD
	err  error
	// A failure is remembered until retryAt, then the key manager is asked again
	// (its refusal may be lifted: a key disabled, then enabled again); wait is the
	// pause before that retry, doubled at each failure from UnwrapRetryMin up to
	// UnwrapRetryMax.
	retryAt time.Time
	wait    time.Duration
}

// UnwrapRetryMin and UnwrapRetryMax bound how long a Keyring remembers that a key
// manager refused to unwrap a data key (a key disabled, a permission withdrawn): the
// values sealed under it fail as unreadable meanwhile, without a call to the key
// manager; then it is asked again. The pause starts at UnwrapRetryMin and doubles at
// each refusal up to UnwrapRetryMax, so that a key enabled again opens its values
// within a minute, without a restart.
const (
	UnwrapRetryMin = time.Second
	UnwrapRetryMax = time.Minute
)

// maxOpened bounds the data keys a Keyring keeps unwrapped: one per process start
// that sealed a record still alive, in practice a handful. Past it the map is
// emptied, and keys are unwrapped again as they are met.
const maxOpened = 4096

// macState is a pooled HMAC of the fingerprint key.
type macState struct {
	h   hash.Hash
	buf [64]byte
	sum [32]byte
}

// NewKeyring returns a Keyring that seals under keys[0] and opens under every key. It
// makes its data key and wraps it under keys[0] (one call to its key manager).
// macSecret is the MAC secret that keys fingerprints and scopes ([NewMACSecret],
// which idem.OpenKeyring keeps in the store); nil makes a Keyring that seals and opens
// only (for operator tools), whose [Keyring.Keyed] is false. Key ids must be distinct,
// not empty, and at most 255 bytes.
func NewKeyring(ctx context.Context, macSecret []byte, keys ...KeyWrapper) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("seal: a Keyring needs at least one key")
	}
	k := &Keyring{keys: keys, byID: make(map[string]KeyWrapper, len(keys)), opened: make(map[string]openedKey), now: time.Now}
	for _, w := range keys {
		id := w.ID()
		switch {
		case id == "" || len(id) > 255:
			return nil, fmt.Errorf("seal: a key id must be 1 to 255 bytes, got %q", id)
		case k.byID[id] != nil:
			return nil, fmt.Errorf("seal: the key %s is configured twice", id)
		}
		k.byID[id] = w
	}
	if macSecret != nil {
		if len(macSecret) != secretSize {
			return nil, fmt.Errorf("seal: a MAC secret is %d bytes, got %d", secretSize, len(macSecret))
		}
		var err error
		if k.fpKey, err = hkdf.Key(sha256.New, macSecret, nil, "idem fingerprint v1", 32); err != nil {
			return nil, err
		}
		if k.scopeKey, err = hkdf.Key(sha256.New, macSecret, nil, "idem scope v1", 32); err != nil {
			return nil, err
		}
		if k.stateKey, err = hkdf.Key(sha256.New, macSecret, nil, "idem state v1", 32); err != nil {
			return nil, err
		}
		k.secretID = secretID(macSecret)
		k.macs.New = func() any { return &macState{h: hmac.New(sha256.New, k.fpKey)} }
		k.scopeMACs.New = func() any { return &macState{h: hmac.New(sha256.New, k.scopeKey)} }
	}
	dek := make([]byte, 32)
	_, _ = rand.Read(dek)
	_, _ = rand.Read(k.prefix[:])
	aead, err := newAEAD(dek)
	if err != nil {
		return nil, err
	}
	wrapped, err := keys[0].Wrap(ctx, dek)
	if err != nil {
		return nil, fmt.Errorf("seal: wrapping the data key under %s: %w", keys[0].ID(), err)
	}
	if len(wrapped) > 0xffff {
		return nil, fmt.Errorf("seal: the key %s wrapped a data key into %d bytes, more than 65535", keys[0].ID(), len(wrapped))
	}
	k.aead = aead
	k.header = appendHeader(nil, keys[0].ID(), wrapped)
	k.opened[string(k.header[len(magic):])] = openedKey{aead: aead}
	return k, nil
}

func newAEAD(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// SealingKeyID is the id of the key this Keyring seals under (its first).
func (k *Keyring) SealingKeyID() string { return k.keys[0].ID() }

// KeyIDs are the ids of the Keyring's keys, the sealing one first.
func (k *Keyring) KeyIDs() []string {
	ids := make([]string, len(k.keys))
	for i, w := range k.keys {
		ids[i] = w.ID()
	}
	return ids
}

// Keyed reports whether the Keyring keys fingerprints and scopes (it was made with a
// MAC secret).
func (k *Keyring) Keyed() bool { return k.fpKey != nil }

// SecretID is a short id of the MAC secret (a hash of it, not secret), for logs: every
// process sharing a store shows the same one. "" without a MAC secret.
func (k *Keyring) SecretID() string { return k.secretID }

// Sealed reports whether v is a sealed value (it starts with the sealed values'
// header). A plaintext that starts so is taken for a sealed one and fails to open:
// none does that idem stores under a Keyring, which seals them all.
func Sealed(v []byte) bool { return len(v) >= len(magic) && string(v[:len(magic)]) == magic }

// magic starts every sealed value: a byte no UTF-8 text starts with, a name, and the
// format's version.
const magic = "\xffidemS1\x00"

// nonceSize is AES-GCM's.
const nonceSize = 12

// appendHeader appends a sealed value's header: magic, the key id and the wrapped data
// key, each length-prefixed.
func appendHeader(b []byte, keyID string, wrapped []byte) []byte {
	b = append(b, magic...)
	b = append(b, byte(len(keyID)))
	b = append(b, keyID...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(wrapped)))
	return append(b, wrapped...)
}

// Seal seals plaintext for the record b as purpose p: the header, the record id, a
// nonce, and the AES-256-GCM ciphertext under the Keyring's data key, whose associated
// data is p, b and everything before the ciphertext. It calls no key manager.
func (k *Keyring) Seal(p Purpose, b Binding, plaintext []byte) ([]byte, error) {
	if b.RecordID == "" || b.RecordID == AnyRecord || len(b.RecordID) > 255 {
		return nil, fmt.Errorf("seal: a value is sealed for one record, with a record id of 1 to 255 bytes; got %q", b.RecordID)
	}
	n := len(k.header) + 1 + len(b.RecordID) + nonceSize
	out := make([]byte, 0, n+len(plaintext)+k.aead.Overhead())
	out = append(out, k.header...)
	out = append(out, byte(len(b.RecordID)))
	out = append(out, b.RecordID...)
	out = append(out, k.prefix[:]...)
	out = binary.BigEndian.AppendUint64(out, k.counter.Add(1))
	ad := associatedData(p, b, out)
	return k.aead.Seal(out, out[n-nonceSize:n], plaintext, ad), nil
}

// associatedData is what binds a sealed value: the format, its purpose, its record
// (each length-prefixed), and its header up to the ciphertext.
func associatedData(p Purpose, b Binding, head []byte) []byte {
	ad := make([]byte, 0, 16+len(b.Scope)+len(b.Key)+len(b.RecordID)+len(head))
	ad = append(ad, "idem seal 1"...)
	ad = append(ad, byte(p))
	for _, s := range [...]string{b.Scope, b.Key, b.RecordID} {
		ad = binary.AppendUvarint(ad, uint64(len(s)))
		ad = append(ad, s...)
	}
	return append(ad, head...)
}

// envelope is a sealed value taken apart (its fields alias the value).
type envelope struct {
	keyID    []byte
	dataKey  []byte // key id and wrapped data key, as the header holds them: the cache's key
	wrapped  []byte
	recordID []byte
	head     []byte // everything before the ciphertext
	nonce    []byte
	sealed   []byte
}

func parse(v []byte) (e envelope, err error) {
	if !Sealed(v) {
		return e, ErrNotSealed
	}
	rest := v[len(magic):]
	start := rest
	if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
		return e, &UnreadableError{Reason: "malformed"}
	}
	e.keyID = rest[1 : 1+rest[0]]
	rest = rest[1+rest[0]:]
	malformed := func() (envelope, error) {
		return envelope{}, &UnreadableError{KeyID: string(e.keyID), Reason: "malformed"}
	}
	if len(rest) < 2 {
		return malformed()
	}
	n := int(binary.BigEndian.Uint16(rest))
	if len(rest) < 2+n+1 {
		return malformed()
	}
	e.wrapped = rest[2 : 2+n]
	e.dataKey = start[:len(start)-len(rest)+2+n]
	rest = rest[2+n:]
	m := int(rest[0])
	if len(rest) < 1+m+nonceSize {
		return malformed()
	}
	e.recordID = rest[1 : 1+m]
	rest = rest[1+m:]
	e.nonce = rest[:nonceSize]
	e.sealed = rest[nonceSize:]
	e.head = v[:len(v)-len(e.sealed)]
	return e, nil
}

// KeyIDOf returns the id of the key the sealed value v says it was sealed under, or ""
// when v is not a sealed value.
func KeyIDOf(v []byte) string {
	e, err := parse(v)
	if err != nil {
		return ""
	}
	return string(e.keyID)
}

// Open opens a value sealed for the record b as purpose p. A value sealed for another
// record (another scope, key or record id, unless b.RecordID is [AnyRecord]) or
// purpose, or altered, or sealed under a key the Keyring does not hold, fails with an
// [*UnreadableError]; a key manager that did not answer, with an error wrapping
// [ErrKeyUnavailable] (ctx bounds the call). The first value met of every data key
// unwraps it (one call to its key manager); later ones use it unwrapped.
func (k *Keyring) Open(ctx context.Context, p Purpose, b Binding, v []byte) ([]byte, error) {
	e, err := parse(v)
	if err != nil {
		return nil, err
	}
	switch {
	case b.RecordID == AnyRecord:
		b.RecordID = string(e.recordID)
	case string(e.recordID) != b.RecordID:
		return nil, &UnreadableError{KeyID: string(e.keyID), Reason: "sealed for another record"}
	}
	aead, err := k.dataKey(ctx, &e)
	if err != nil {
		return nil, err
	}
	plain, err := aead.Open(nil, e.nonce, e.sealed, associatedData(p, b, e.head))
	if err != nil {
		return nil, &UnreadableError{KeyID: string(e.keyID), Reason: "altered, or sealed for another record"}
	}
	return plain, nil
}

// dataKey returns the AEAD of e's data key, unwrapping it the first time, and again
// once the retry of a refusal is due (one caller retries; the others get the
// refusal meanwhile).
func (k *Keyring) dataKey(ctx context.Context, e *envelope) (cipher.AEAD, error) {
	k.mu.RLock()
	o, ok := k.opened[string(e.dataKey)]
	k.mu.RUnlock()
	if ok && (o.err == nil || k.now().Before(o.retryAt)) {
		return o.aead, o.err
	}
	if ok {
		if o, ok = k.claimRetry(string(e.dataKey)); !ok {
			return o.aead, o.err
		}
	}
	keyID := string(e.keyID)
	w := k.byID[keyID]
	if w == nil {
		return nil, &UnreadableError{KeyID: keyID, Reason: "sealed under a key that is not configured (configured: " +
			strings.Join(k.KeyIDs(), ", ") + ")"}
	}
	uctx, cancel := context.WithTimeout(ctx, UnwrapTimeout)
	dek, err := w.Unwrap(uctx, e.wrapped)
	cancel()
	switch {
	case errors.Is(err, ErrKeyUnavailable):
		return nil, fmt.Errorf("seal: unwrapping a data key under %s: %w", keyID, err)
	case err != nil:
		o.err = &UnreadableError{KeyID: keyID, Reason: "its data key does not unwrap", Err: err}
	case len(dek) != 32:
		o.err = &UnreadableError{KeyID: keyID, Reason: fmt.Sprintf("its data key unwraps to %d bytes, not 32", len(dek))}
	default:
		o.aead, o.err = newAEAD(dek)
	}
	if o.err != nil {
		o.wait = min(max(2*o.wait, UnwrapRetryMin), UnwrapRetryMax)
		o.retryAt = k.now().Add(o.wait)
	}
	k.mu.Lock()
	if len(k.opened) >= maxOpened {
		clear(k.opened)
	}
	k.opened[string(e.dataKey)] = o
	k.mu.Unlock()
	return o.aead, o.err
}

// claimRetry takes the due retry of a refused data key for its caller (true), pushing
// the next retry back for the others meanwhile; false, with what is remembered, when
// another caller took it or it is not due.
func (k *Keyring) claimRetry(dataKey string) (openedKey, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	o, ok := k.opened[dataKey]
	now := k.now()
	if !ok {
		return openedKey{}, true
	}
	if o.err == nil || now.Before(o.retryAt) {
		return o, false
	}
	held := o
	held.retryAt = now.Add(UnwrapTimeout)
	k.opened[dataKey] = held
	return o, true
}

// FingerprintSum returns the keyed form of a fingerprint's version and sum: their
// HMAC-SHA-256 under the fingerprint key. It panics on a Keyring without a MAC secret.
func (k *Keyring) FingerprintSum(version int, sum [32]byte) [32]byte {
	if k.fpKey == nil {
		panic("seal: Keyring.FingerprintSum on a Keyring without a MAC secret")
	}
	m := k.macs.Get().(*macState)
	m.h.Reset()
	b := binary.AppendUvarint(m.buf[:0], uint64(version))
	b = append(b, sum[:]...)
	m.h.Write(b)
	out := [32]byte(m.h.Sum(m.sum[:0]))
	k.macs.Put(m)
	return out
}

// Scope returns the keyed scope of a principal (a credential, a cookie): the hex
// HMAC-SHA-256 of principal under the scope key. It panics on a Keyring without a MAC
// secret.
func (k *Keyring) Scope(principal string) string {
	if k.scopeKey == nil {
		panic("seal: Keyring.Scope on a Keyring without a MAC secret")
	}
	m := k.scopeMACs.Get().(*macState)
	m.h.Reset()
	m.h.Write([]byte(principal))
	var out [64]byte
	hex.Encode(out[:], m.h.Sum(m.sum[:0]))
	k.scopeMACs.Put(m)
	return string(out[:])
}

// StateMAC returns the HMAC-SHA-256 of msg under the state key, which derives from
// the MAC secret like the fingerprint and scope keys: it binds what idem records of a
// store's state (the sealing state, SPEC §20) to the store's MAC secret, so that
// nobody without a configured key can write or alter it. It panics on a Keyring
// without a MAC secret.
func (k *Keyring) StateMAC(msg []byte) []byte {
	if k.stateKey == nil {
		panic("seal: Keyring.StateMAC on a Keyring without a MAC secret")
	}
	h := hmac.New(sha256.New, k.stateKey)
	h.Write(msg)
	return h.Sum(nil)
}

// VerifyStateMAC reports whether mac is [Keyring.StateMAC] of msg, in constant time.
func (k *Keyring) VerifyStateMAC(msg, mac []byte) bool {
	return hmac.Equal(k.StateMAC(msg), mac)
}
