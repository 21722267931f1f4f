// Package storetest is the conformance suite that every [idemstore.Store] runs unchanged:
// store/memory, store/sqlite, store/postgres and store/redis call [Run] from their
// tests with a [Harness] that hands out fresh stores. The suite checks the contract of
// [idemstore.Store] and SPEC §5 (states, fencing, leases), §7 (completion inside the
// application's transaction), §8 (expiry and cleanup) and §3/§6 (what keys, scopes and
// responses must survive a round trip).
//
// Every case runs in parallel in its own store, injects time through the params' Now
// (it never sleeps), and uses random scopes, keys and tokens. The list of cases is the
// same for every store; a case that needs a capability the store does not declare in
// [idemstore.Capabilities] skips with a log line naming the capability:
// Capabilities.BatchedCleanup for the cleanup cases, Capabilities.Transactions for the
// §7 cases (which fail, rather than skip, when the store declares the capability but
// the Harness has no Tx).
//
// # Running the suite
//
//	func TestConformance(t *testing.T) {
//		t.Parallel()
//		storetest.Run(t, storetest.Harness{
//			// A fresh, empty store private to t (own schema, file or key prefix),
//			// closed at t.Cleanup.
//			NewStore: func(t *testing.T) idem.Store { return openInFreshSchema(t) },
//			// SQL stores only: the SPEC §7 cases.
//			Tx: txHarness{},
//		})
//	}
//
// A SQL store's txHarness needs a tiny application table in the store's private
// schema, say `CREATE TABLE app_marker (name text PRIMARY KEY)`:
//
//	type txHarness struct{}
//
//	func (txHarness) WriteAndComplete(ctx context.Context, s idemstore.Store, p *idemstore.CompleteParams, marker string) error {
//		st := s.(*postgres.Store)
//		return pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
//			if _, err := tx.Exec(ctx, `INSERT INTO app_marker (name) VALUES ($1)`, marker); err != nil {
//				return err
//			}
//			return st.CompleteTx(ctx, tx, p) // ErrLeaseLost rolls the insert back
//		})
//	}
//
//	func (txHarness) MarkerCommitted(ctx context.Context, s idem.Store, marker string) (bool, error) {
//		var n int
//		err := s.(*postgres.Store).Pool().QueryRow(ctx,
//			`SELECT count(*) FROM app_marker WHERE name = $1`, marker).Scan(&n)
//		return n == 1, err
//	}
//
// # Many processes
//
// Stores that several processes may share (Capabilities.MultiProcess) also prove, with
// [RunMultiProcess], that a claim is exclusive across processes, and, with
// [RunMigrateConcurrently], that migrations started by several processes at the same
// instant all succeed. Both re-execute the test binary (os.Args[0] with
// -test.run=^TestName$), so the calling test runs again in every child, where the same
// call acts as the child. No TestMain is needed; [IsChild] tells a TestMain that wants
// to skip parent-only set-up. Children and parent share the DSN through the
// environment, start together at a barrier (each child announces itself on stdout and
// waits for its stdin to close), and report back on stdout.
//
//	func multiProcess() storetest.MultiProcess {
//		return storetest.MultiProcess{
//			// Parent only: a fresh database, not yet migrated.
//			NewDSN: func(t testing.TB) string { return createSchema(t) },
//			// Parent and children: open the migrated store, closed at t.Cleanup.
//			Open: func(t testing.TB, dsn string) idem.Store {
//				s, err := postgres.Open(context.Background(), dsn, postgres.Config{})
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(s.Close)
//				return s
//			},
//			Migrate: func(dsn string) error { return migrate(dsn) },
//			// Optional: the migrations table holds each version once.
//			CheckSchema: func(t testing.TB, dsn string) { checkVersions(t, dsn) },
//		}
//	}
//
//	func TestClaimIsExclusiveAcrossProcesses(t *testing.T) {
//		storetest.RunMultiProcess(t, multiProcess()) // 4 processes × 200 keys
//	}
//
//	func TestConcurrentMigrationsAllSucceed(t *testing.T) {
//		storetest.RunMigrateConcurrently(t, multiProcess())
//	}
//
// Anything the test does before the call also runs in every child, so keep it cheap;
// NewDSN runs in the parent only.
package storetest
