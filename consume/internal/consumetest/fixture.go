package consumetest

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/sqlite"
)

// FixtureRetryDelay is the fixture Processor's RetryDelay.
const FixtureRetryDelay = 50 * time.Millisecond

// Fixture is a fresh SQLite store with an invoices table, and a Processor over it,
// for an adapter's behaviour tests.
type Fixture struct {
	t         *testing.T
	Store     *sqlite.Store
	Guard     *idem.Guard
	Processor *consume.Processor[*sql.Tx]
}

// NewFixture returns a Fixture private to t. Its guard is built from gcfg with the
// fixture's store (and, unless gcfg has one, a logger that discards everything); its
// Processor naks failures after FixtureRetryDelay and logs nothing.
func NewFixture(t *testing.T, gcfg idem.GuardConfig) *Fixture {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "consume.db"), sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE invoices (body TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	gcfg.Store = st
	if gcfg.Logger == nil {
		gcfg.Logger = slog.New(slog.DiscardHandler)
	}
	g := idem.NewGuard(gcfg)
	return &Fixture{t: t, Store: st, Guard: g, Processor: consume.New(consume.Config[*sql.Tx]{
		Guard: g, InTx: st.InTx, RetryDelay: FixtureRetryDelay, Logger: slog.New(slog.DiscardHandler),
	})}
}

// Invoice is the effect of the behaviour tests: it writes an invoice of body in tx.
func (f *Fixture) Invoice(ctx context.Context, tx *sql.Tx, body []byte) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO invoices (body) VALUES (?)`, string(body))
	return err
}

// WantInvoices checks that the effects wrote n invoices.
func (f *Fixture) WantInvoices(n int) {
	f.t.Helper()
	var got int
	if err := f.Store.DB().QueryRowContext(f.t.Context(), `SELECT count(*) FROM invoices`).Scan(&got); err != nil {
		f.t.Fatal(err)
	}
	if got != n {
		f.t.Fatalf("invoices = %d, want %d", got, n)
	}
}

// Hold claims the message (scope, id, payload) as another consumer processing it
// would: its lease stays live until the returned release is called (or t ends).
func (f *Fixture) Hold(scope, id string, payload []byte) (release func()) {
	f.t.Helper()
	h, _, err := f.Guard.Begin(context.Background(), idem.Call{Scope: scope, Key: id,
		Fingerprint: idem.FingerprintInput(scope, payload)})
	if err != nil || h == nil {
		f.t.Fatalf("Begin = %v, %v; want the claim", h, err)
	}
	f.t.Cleanup(func() { _ = h.Release() })
	return func() {
		if err := h.Release(); err != nil {
			f.t.Fatal(err)
		}
	}
}

// WantAction checks that res is want, replayed or not.
func WantAction(t testing.TB, res consume.Result, want consume.Action, replayed bool) {
	t.Helper()
	if res.Action != want || res.Replayed != replayed {
		t.Fatalf("result = %v (replayed %v, err %v), want %v (replayed %v)", res.Action, res.Replayed, res.Err, want, replayed)
	}
}
