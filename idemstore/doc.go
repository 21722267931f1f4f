// Package idemstore is the contract between idem and the stores that keep its
// records, as database/sql/driver is database/sql's: the [Store] interface, the record
// it keeps ([Record], [State], [Response], [Fingerprint]), the params and results of
// its methods, the pure state machine every store carries out atomically ([Decide],
// [ClaimParams.Decide]), the expiry rules ([InFlightExpiresAt], [CompletedExpiresAt])
// and the errors a store normalises to at its edge ([ErrNotFound], [ErrLeaseLost]).
//
// Store authors import it, and the conformance suite in store/storetest proves an
// implementation against it (SPEC §5, §8, §13). A handler author needs none of it:
// package idem re-exports the few names a handler writes ([Response], [Fingerprint],
// [LapsePolicy], [ErrLeaseLost]) as aliases. It imports the standard library only.
// docs/architecture.md shows where it sits among idem's layers.
package idemstore
