// Package storetest is the conformance suite that every [idem.Store] runs unchanged:
// store/memory, store/sqlite, store/postgres and store/redis call [Run] from their
// tests with a [Harness] that hands out fresh stores. The suite exercises the contract
// of [idem.Store] and SPEC §5 (states, fencing, leases), §7 (completion inside the
// application's transaction), §8 (expiry and cleanup) and §14 (many processes).
//
// Every case runs in parallel in its own store, injects time through the params' Now
// (it never sleeps), and uses random scopes, keys and tokens. A case that needs a
// capability the store does not declare in [idem.Capabilities] is skipped with a log
// line that names the capability; the list of cases is the same for every store.
//
// # Usage
//
// A store package runs the suite from one test:
//
//	func TestConformance(t *testing.T) {
//		t.Parallel()
//		storetest.Run(t, storetest.Harness{
//			NewStore: func(t *testing.T) idem.Store {
//				s := openInFreshSchema(t) // private to t, closed at t.Cleanup
//				return s
//			},
//			Tx: txHarness{}, // SQL stores only: see TxHarness
//		})
//	}
//
// Stores that several processes may share (Capabilities.MultiProcess) also prove that
// claims are exclusive across processes, and that migrations started at the same
// instant by several processes all succeed, with [RunMultiProcess] and
// [RunMigrateConcurrently]. Both re-execute the test binary, running the calling test
// again in each child; the test needs no TestMain and no special code:
//
//	func TestClaimIsExclusiveAcrossProcesses(t *testing.T) {
//		storetest.RunMultiProcess(t, storetest.MultiProcess{
//			NewDSN: func(t testing.TB) string { return createSchema(t) }, // parent only
//			Open: func(t testing.TB, dsn string) idem.Store {
//				s, err := postgres.Open(t.Context(), dsn, postgres.Config{})
//				if err != nil {
//					t.Fatal(err)
//				}
//				t.Cleanup(s.Close)
//				return s
//			},
//			Migrate: func(dsn string) error { return migrate(dsn) },
//		})
//	}
package storetest
