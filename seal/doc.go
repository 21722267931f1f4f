// Package seal is the contract of sealed records (SPEC §19): what the idem core calls
// to seal what a record holds that came from the application (a stored response's
// status, headers and body, the results its steps saved), and to key the fingerprints
// and scopes it stores, so that a store never sees plaintext and a stolen store yields
// no card number, token or password.
//
// A [Keyring] does the sealing with keys that never leave the process: one data key
// per Keyring (per process), a random AES-256-GCM key, wrapped once, when the Keyring
// is made, by the first of its [KeyWrapper]s, the key-encryption keys that a key
// manager (AWS KMS, Google Cloud KMS, Azure Key Vault, HashiCorp Vault) or a local key
// holds. Every sealed value carries its data key so wrapped, and the Keyring unwraps
// each data key once and keeps it, so the key manager is called once per process
// start to seal, and once per (process, data key met) to open: never per request.
//
// A sealed value is bound to its record: its associated data is the record's scope,
// key and record id and what the value is ([Purpose]), so a ciphertext copied onto
// another record, or a response's onto a record's steps, does not open there.
//
// The keyed fingerprint and scope are HMAC-SHA-256 under keys derived (HKDF) from a
// MAC secret that every process sharing a store must hold alike and that must not
// change when the sealing keys rotate: the idem core keeps it in the store itself,
// wrapped under every configured key (idem.OpenKeyring), where it lives and dies with
// the records that depend on it.
//
// Package seal imports the standard library only; seal/cloudkeys makes KeyWrappers of
// key URLs (base64key://, awskms://, gcpkms://, azurekeyvault://, hashivault://)
// through gocloud.dev/secrets. docs/security.md says what is sealed, in which store,
// and how keys rotate.
package seal
