package idem

// The gates (SPEC §20): every record format that a release writes and the previous
// release cannot read, or misreads, is a gate of this one list, at the format level
// from which processes may write it. Code that writes such a format asks whether the
// store's state allows the gate ([StoreState.Allows]) and otherwise writes what the
// previous release reads, or refuses. Readers accept every format since the oldest
// release that may share the store (the previous one). docs/operations.md lists
// these gates beside the formats shown to be read correctly by the previous release.

// Gate is a record format written only once a store's format level reaches the
// gate's ([Gate.Level]).
type Gate int

const (
	// GateSealedRecords: records sealed under a keyring (SPEC §19): a response's
	// status, headers and body sealed into its body, sealed step results, and keyed
	// fingerprints (version 1000 and up). idem 0.2.0 replays a sealed body as it is
	// (ciphertext answered as the stored status), its completer fails on sealed step
	// results, and it takes a keyed fingerprint of another version for a match.
	// Sealing begins only at level 2.
	GateSealedRecords Gate = iota + 1
	// GateNoExpiryIndex: PostgreSQL without idem_records_expires_at_idx (issue 41),
	// which this release's cleaner never reads. idem 0.2.0's cleaner orders its
	// batches by expires_at: without the index each batch reads the whole table. Not a
	// record format but a schema change a rollback must not cross: the store's Migrate
	// drops the index only at level 2.
	GateNoExpiryIndex
)

// gates describes each Gate, in order.
var gates = [...]struct {
	name  string
	level FormatLevel
}{
	GateSealedRecords: {"sealed records", FormatLevel2},
	GateNoExpiryIndex: {"PostgreSQL without the index of expiry", FormatLevel2},
}

// Gates returns every gate, in order.
func Gates() []Gate {
	out := make([]Gate, 0, len(gates)-1)
	for g := range gates[1:] {
		out = append(out, Gate(g+1))
	}
	return out
}

// Level is the format level from which the gate's format may be written.
func (g Gate) Level() FormatLevel {
	if g <= 0 || int(g) >= len(gates) {
		return CurrentFormatLevel + 1 // unknown: never
	}
	return gates[g].level
}

// String names the gate.
func (g Gate) String() string {
	if g <= 0 || int(g) >= len(gates) {
		return "unknown gate"
	}
	return gates[g].name
}
