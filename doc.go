// Package idem makes non-idempotent operations safe to retry: a client sends
// `Idempotency-Key: <random id>` with a POST or PATCH (or a job carries its id), and the
// server executes the operation at most once per (scope, key) and returns the same
// result to every retry, across restarts, crashes and any number of processes sharing
// one store. The behaviour contract is docs/spec.md; every §N here is one of its
// sections.
//
// This package is what a handler author, a job author and an operator's program
// write. It imports the standard library and idem's two contracts only: the stores
// (store/sqlite, the embedded default; store/postgres; store/redis; store/memory for
// tests) live in their own packages, so importing idem links none of their drivers.
// docs/architecture.md is the map of the layers and of what each may import.
//
// # Handlers
//
// [New] builds a [Middleware] from a [Config] (the store, and who is calling: Scope).
// Mount [Middleware.Handler] inside your authentication, or [Middleware.Route] with
// [RouteOptions] per route. A handler whose writes all go to the store's database
// returns its response from the store's Respond on a [RouteOptions.ClaimInHandler]
// route: the writes, the [Response] and the key's record commit together (§7). A
// handler that calls something outside the database first (a card processor) takes
// the lease path: the middleware holds the key while it runs, and it writes its
// response inside the store's InTx. [FromContext] gives a handler its [Handle];
// [DefaultStorePolicy] says which responses are stored and which free the key (§6).
//
//	mw := idem.New(idem.Config{Store: store, Scope: principalOf})
//	mux.Handle("POST /v1/charges", mw.Route(idem.RouteOptions{ClaimInHandler: true})(createCharge))
//	// in createCharge:
//	err := store.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
//		// … the charge's INSERT on tx …
//		return idem.JSONResponse(http.StatusCreated, charge)
//	})
//
// # Jobs
//
// Without HTTP, [Do] and [DoTx] run a function at most once per [Call] (scope, key,
// input fingerprint) on a [Guard] ([NewGuard], or [Middleware.Guard]) and return its
// stored result to every repeat. An operation that calls a foreign system runs as
// named steps ([Step], or the SQL stores' Step inside their transaction): a holder that
// takes the key over after a crash resumes after the last committed step, and the
// foreign call carries [Handle.DerivedKey], the same for every holder (§13).
//
// # Operators
//
// A [Completer] finishes, in the background, operations whose holder died, or
// answered an error, after a step, through the [ResumeFunc] their name registered
// ([Guard.RegisterResume], [RouteOptions.Resume]), which ends with [Finish] as the
// handler does; a
// [Cleaner] deletes expired records from a store that does not expire them itself.
//
// # Errors
//
// A call that does not run its operation says why: [ErrKeyReused],
// [ErrKeyInProgress], [ErrStoreUnavailable] (a [*StoreError] with the cause),
// [ErrOutcomeUnknown]; the middleware answers each with its §9 code ([WriteError],
// [Problem], in the seed or the IETF [Profile]).
//
// # Elsewhere
//
// Store authors implement package idemstore's Store and run store/storetest;
// observers are written on package observe (idemprom and idemotel are two); gRPC,
// queue consumers and `idem proxy` are adapters on the same core (grpcidem, consume,
// cmd/idem). The library guide, docs/library.md, has whole programs.
package idem
