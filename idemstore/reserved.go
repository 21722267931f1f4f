package idemstore

// ReservedScope is the scope of the records idem keeps for itself in a store, beside
// the records of requests: the MAC secret of a keyring (SPEC §19) and the store's
// state and the releases that served it lately (SPEC §20). It starts with a control
// character, which no HTTP header carries, and idem refuses it as the scope of a
// call or a request. Stores keep these records as they keep any other (they are
// completed records with long TTLs); admin listings leave them out unless asked for
// this scope by name, and nothing in idem deletes them but their expiry.
const ReservedScope = "\x1fidem"
