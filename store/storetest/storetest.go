package storetest

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// Harness is what a store package hands to [Run].
type Harness struct {
	// NewStore returns a fresh, empty store private to the calling test (its own
	// schema, file or key prefix), closed at t.Cleanup. The suite calls it once per
	// case, from parallel tests. Required.
	NewStore func(t *testing.T) idemstore.Store

	// Tx lets the suite check SPEC §7 on stores that declare
	// Capabilities.Transactions (the SQL stores). It is required for those stores: the
	// §7 cases fail, rather than skip, when it is nil. Others leave it nil.
	Tx TxHarness

	// NewStoreWithCleaner is for stores that start a cleaner of their own when they
	// open (the SQL stores' Config.Cleaner): it returns a fresh store like NewStore,
	// with its own cleaner started with cfg, and that cleaner. The case
	// StoreCleanerDeletesExpiredRecords skips with a log line when it is nil.
	NewStoreWithCleaner func(t *testing.T, cfg idem.CleanerConfig) (idemstore.Store, *idem.Cleaner)

	// Raw returns everything s holds, as it holds it: its database files and the rows
	// of its tables (SQL stores), every value under its prefix (Redis). The sealed
	// records' case (SPEC §19) looks there for the card number and token it sent; it
	// skips with a log line when Raw is nil.
	Raw func(t *testing.T, s idemstore.Store) []byte

	// CopyResponse copies the stored response of (scope, from) onto the record
	// (scope, onto), column by column or field by field, as someone who can write the
	// database would. The sealed records' case checks that it does not open there; it
	// skips with a log line when CopyResponse is nil.
	CopyResponse func(t *testing.T, s idemstore.Store, scope, from, onto string)
}

// TxHarness runs a fenced completion inside a transaction of the store's own database,
// next to an application write, as the SPEC §7 helpers (InTx, CompleteTx) do. A store's
// test implements it with a tiny application table, say
// `CREATE TABLE app_marker (name text PRIMARY KEY)`, created in the store's private
// schema or file.
type TxHarness interface {
	// WriteAndComplete, in ONE transaction of s's database, inserts an application row
	// named marker and runs the fenced completion p (the store's CompleteTx), then
	// commits. It returns the completion's error ([idem.ErrLeaseLost] when fenced), in
	// which case it must have rolled back, so the marker is not committed.
	WriteAndComplete(ctx context.Context, s idemstore.Store, p *idemstore.CompleteParams, marker string) error
	// MarkerCommitted reports whether a row named marker is committed.
	MarkerCommitted(ctx context.Context, s idemstore.Store, marker string) (bool, error)
	// InTx runs fn in ONE transaction of s's database through the store's SPEC §7
	// helper (its InTx), which completes the record of the idem.Handle that ctx
	// carries once fn returns nil; write inserts an application row named marker in
	// that transaction. The idem.DoTx cases pass it as DoTx's inTx.
	InTx(ctx context.Context, s idemstore.Store, fn func(ctx context.Context, write func(marker string) error) error) error
	// Step runs fn through the store package's step helper (its Step) as the step
	// named step of the operation whose idem.Handle ctx carries (SPEC §13); write
	// inserts an application row named marker in the step's transaction. It returns
	// what the helper returns: fn's result once committed with the step, or the saved
	// result without running fn when the step committed before.
	Step(ctx context.Context, s idemstore.Store, step string, fn func(ctx context.Context, write func(marker string) error) (string, error)) (string, error)
}

// Run runs the conformance suite against the stores h hands out: one parallel subtest
// per case, each named for the behaviour it checks.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.NewStore == nil {
		t.Fatal("storetest: Harness.NewStore is nil")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, h)
		})
	}
}

// testCase is one case of the suite.
type testCase struct {
	name string
	run  func(t *testing.T, h Harness)
}

// cases lists every case, the same for every store.
var cases []testCase

// register adds cases to the suite; each file of cases registers its own in init.
func register(cs ...testCase) { cases = append(cases, cs...) }

const (
	// lease and ttl are the defaults of a claim in the suite.
	lease = 10 * time.Second
	ttl   = time.Hour
)

// bundle is what one case works with: a fresh store, a random (scope, key), a
// fingerprint and the time t0 at which the case starts.
type bundle struct {
	t     *testing.T
	s     idemstore.Store
	ctx   context.Context
	t0    time.Time
	scope string
	key   string
	fp    idemstore.Fingerprint
}

func setup(t *testing.T, h Harness) *bundle {
	t.Helper()
	return &bundle{
		t:   t,
		s:   h.NewStore(t),
		ctx: t.Context(),
		// Near the real clock, so that stores which also hand expiry to their server
		// (Redis TTLs) see sane durations; whole milliseconds, so that every store's
		// timestamp precision keeps it exactly.
		t0:    time.Now().UTC().Truncate(time.Millisecond),
		scope: "scope-" + rand.Text(),
		key:   "key-" + rand.Text(),
		fp:    newFingerprint(),
	}
}

// at returns t0 + d.
func (b *bundle) at(d time.Duration) time.Time { return b.t0.Add(d) }

func newFingerprint() idemstore.Fingerprint {
	fp := idemstore.Fingerprint{Version: idemstore.FingerprintVersion}
	_, _ = rand.Read(fp.Sum[:])
	return fp
}

func newToken() string { return "tok-" + rand.Text() }

// claimParams returns the params of a claim of the bundle's (scope, key) with a fresh
// token and record id, the default lease and TTL, at now.
func (b *bundle) claimParams(now time.Time) *idemstore.ClaimParams {
	return &idemstore.ClaimParams{
		Scope:       b.scope,
		Key:         b.key,
		Fingerprint: b.fp,
		Token:       newToken(),
		RecordID:    earlierReleaseRecordID(),
		Lease:       lease,
		TTL:         ttl,
		Now:         now,
	}
}

// claim runs p and fails the test on an error.
func (b *bundle) claim(p *idemstore.ClaimParams) *idemstore.ClaimResult {
	b.t.Helper()
	res, err := b.s.RecordClaim(b.ctx, p)
	if err != nil {
		b.t.Fatalf("RecordClaim(%q, %q): %v", p.Scope, p.Key, err)
	}
	if res.Record == nil {
		b.t.Fatalf("RecordClaim(%q, %q) = %v with a nil Record", p.Scope, p.Key, res.Outcome)
	}
	return res
}

// claimWant runs p and fails the test unless its outcome is want.
func (b *bundle) claimWant(p *idemstore.ClaimParams, want idemstore.ClaimOutcome) *idemstore.ClaimResult {
	b.t.Helper()
	res := b.claim(p)
	if res.Outcome != want {
		b.t.Fatalf("RecordClaim(%q, %q) at t0%+v = %v, want %v", p.Scope, p.Key, p.Now.Sub(b.t0), res.Outcome, want)
	}
	return res
}

// acquire claims the bundle's key at now, requires it acquired, and returns the claim's
// params (whose Token holds the record).
func (b *bundle) acquire(now time.Time) *idemstore.ClaimParams {
	b.t.Helper()
	p := b.claimParams(now)
	b.claimWant(p, idemstore.ClaimAcquired)
	return p
}

// completeParams returns the params completing the record held by token with resp.
func (b *bundle) completeParams(token string, resp *idemstore.Response, now time.Time) *idemstore.CompleteParams {
	return &idemstore.CompleteParams{Scope: b.scope, Key: b.key, Token: token, Response: resp, TTL: ttl, Now: now}
}

// complete completes the record held by token with resp, failing the test on an error.
func (b *bundle) complete(token string, resp *idemstore.Response, now time.Time) {
	b.t.Helper()
	if err := b.s.RecordComplete(b.ctx, b.completeParams(token, resp, now)); err != nil {
		b.t.Fatalf("RecordComplete: %v", err)
	}
}

// get reads the bundle's record at now.
func (b *bundle) get(now time.Time) (*idemstore.Record, error) {
	return b.s.RecordGet(b.ctx, &idemstore.GetParams{Scope: b.scope, Key: b.key, Now: now})
}

// mustGet reads the bundle's record at now, failing the test on an error.
func (b *bundle) mustGet(now time.Time) *idemstore.Record {
	b.t.Helper()
	rec, err := b.get(now)
	if err != nil {
		b.t.Fatalf("RecordGet(%q, %q) at t0%+v: %v", b.scope, b.key, now.Sub(b.t0), err)
	}
	return rec
}

// sampleResponse is a small completed response.
func sampleResponse() *idemstore.Response {
	return &idemstore.Response{
		Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}, "Location": {"/v1/charges/ch_1"}},
		Body:   []byte(`{"id":"ch_1","object":"charge"}`),
	}
}

// ms is n milliseconds.
func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }
