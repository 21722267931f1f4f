// Package idem makes non-idempotent operations safe to retry: a client sends
// `Idempotency-Key: <random id>` with a POST or PATCH (or a job carries its id), and the
// server executes the operation at most once per (scope, key) and returns the same
// result to every retry, across restarts, crashes and any number of processes sharing
// one [idemstore.Store].
//
// The package holds the pieces that do not depend on any database, in two layers. It
// imports the standard library only; the stores live in their own packages
// (store/sqlite, store/postgres, store/redis, store/memory) so that importing idem
// links none of their drivers.
//
// # Getting started
//
// Pick a store: package store/sqlite (the embedded default: any number of processes on
// one host), store/postgres (any number of hosts) or store/redis (with package backstop
// for writes that must not happen twice); store/memory is for tests. Open it (the SQL
// stores then clean expired records in the background until Close), migrate it, and
// put the middleware inside your authentication:
//
//	store, err := sqlite.Open(ctx, "app.db", sqlite.Config{})
//	// …
//	err = store.Migrate(ctx)
//	mw := idem.New(idem.Config{Store: store, Scope: principalOf}) // the authenticated principal
//	http.Handle("/v1/", authenticate(mw.Handler(api)))
//
// A handler whose writes all go to the store's database returns its response from the
// store's Respond, with the request: store/sqlite's (*Store).Respond (a *sql.Tx),
// store/postgres's (*Store).Respond (statements on a pgx.Batch, one round trip on a
// [RouteOptions.ClaimInHandler] route) or (*Store).RespondSQL (a *sql.Tx, for
// database/sql code), or package backstop's (*Backstop).Respond with Redis. The writes,
// the response and the key's record commit together, or none of them does, and the
// request is answered with that response, or with what the key calls for (a replay,
// 409, key_reused); an error comes back only when the writes failed:
//
//	mux.Handle("POST /v1/charges", mw.Route(idem.RouteOptions{ClaimInHandler: true})(createCharge))
//	// in createCharge:
//	err := store.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
//		if _, err := tx.ExecContext(ctx, `INSERT INTO charges …`, …); err != nil {
//			return nil, err
//		}
//		return idem.JSONResponse(http.StatusCreated, charge)
//	})
//
// A handler that calls something outside the database first (a card processor) takes
// the lease path instead: the middleware holds the key while it runs, and it writes its
// response inside the store's InTx (SPEC §13's steps build on it).
//
// Without HTTP, [Do] and [DoTx] run a function at most once per (scope, key). The
// README's quick start (examples/sqlite, examples/postgres, examples/postgres-sql,
// examples/redis) has whole programs; [DefaultStorePolicy] says which responses are
// stored and which free the key (SPEC §6).
//
// # The pieces
//
// The core, without HTTP (SPEC §5, §16; guard.go, handle.go, lease.go, do.go):
//
//   - [Guard] runs the record state machine: [Guard.Begin] claims (scope, key) in one
//     atomic store operation ([idemstore.Decide] says what a claim finds), waits a bounded time
//     for an operation in flight, takes over a lapsed lease, and answers a replay,
//     [ErrKeyReused], [ErrKeyInProgress] or [ErrStoreUnavailable];
//   - [Handle] is an acquired claim: the operation runs under its context while a
//     heartbeat renews the lease (and cancels the operation with [ErrLeaseLost] when
//     the lease ends), then [Handle.Complete] stores its result or [Handle.Release]
//     frees the key, both fenced by the lock token. SQL stores complete the record
//     inside the application's own transaction (SPEC §7) through the Handle, so the
//     business writes and the stored result commit together or not at all;
//   - [Do] and [DoTx] run a function at most once and return its stored result to
//     every repeat; [FingerprintInput] fingerprints its input;
//   - an [observe.Observer] (observer.go), when set, is told of every claim outcome,
//     completion, release, failed renewal, lost lease and store call (SPEC §15).
//
// Foreign side effects (SPEC §13; step.go, completer.go, policy.go): an operation that
// calls a foreign system runs as named steps, each committing its writes with the
// record's recovery point and a saved result (store/sqlite's Step, store/postgres's
// Step, or [Step] for a result alone); a holder that takes the key over runs it again
// and every committed step returns its saved result instead of running. The foreign
// call carries [Handle.ForeignKey], the same for every holder of the record. A
// [Completer] finishes, in the background, operations whose holder died after a step,
// through the resume function their name registered ([Guard.RegisterResume]). Under the
// policy [LapseUnknown] a key whose holder died answers [ErrOutcomeUnknown] (500
// outcome_unknown) until an operator resolves it. docs/foreign-effects.md walks
// through a payment.
//
// The net/http middleware, an adapter of the core (middleware.go, config.go,
// capture.go, key.go, fingerprint.go, errors.go): [New] builds a [Middleware] on a
// Guard. A request goes through these steps (see docs/state-machine.md):
//
//  1. The key is parsed ([ParseKey]) and the request fingerprinted
//     ([FingerprintRequest]: method, path, sorted query, canonical body).
//  2. The guard claims (scope, key); a request that does not acquire it gets the
//     stored response or a §9 error ([WriteError]).
//  3. The handler runs under the claim, with the [Handle] in its context
//     ([FromContext]); its response is captured.
//  4. The response is stored (completing the record) or the key is released (SPEC
//     §6), and only then sent.
package idem
