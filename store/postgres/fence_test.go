package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemstore"
)

// A holder whose lapsed lease another claim took over can commit nothing (SPEC §7):
// its fenced completion and its fenced step, in its own transaction, find the record
// under another token, raise (the fence runs only then: issue 50), and abort the
// transaction, so that the COMMIT sent after them commits none of its writes.
func TestAFencedWriteOfAHolderThatWasTakenOverAbortsItsTransaction(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := context.Background() // the cleanup's rollback runs after t's context ends
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	writes := map[string]func(tx pgx.Tx, p *idemstore.ClaimParams) error{
		"CompleteTx": func(tx pgx.Tx, p *idemstore.ClaimParams) error {
			return s.CompleteTx(ctx, tx, &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, TTL: p.TTL, Now: p.Now,
				Response: &idemstore.Response{Status: 201, Body: []byte(`{}`)}})
		},
		"StepTx": func(tx pgx.Tx, p *idemstore.ClaimParams) error {
			return s.StepTx(ctx, tx, &idemstore.StepParams{Scope: p.Scope, Key: p.Key, Token: p.Token, RecoveryPoint: "charged"})
		},
	}
	for name, write := range writes {
		stale := claimParams("k-stale-"+name, t0)
		mustClaim(t, s, stale, idemstore.ClaimAcquired)
		taker := claimParams(stale.Key, t0.Add(stale.Lease))
		taker.Fingerprint = stale.Fingerprint
		if res := mustClaim(t, s, taker, idemstore.ClaimAcquired); !res.TookOver {
			t.Fatalf("%s: the second claim did not take the lapsed lease over: %+v", name, res)
		}

		tx, err := s.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) }) // before the store's Close, on a failure
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.table("app_marker")+` (name) VALUES ($1)`, name); err != nil {
			t.Fatal(err)
		}
		if err := write(tx, stale); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("%s under the stale token = %v, want ErrLeaseLost", name, err)
		}
		_ = tx.Commit(ctx) // the aborted transaction rolls back
		var n int
		if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM `+s.table("app_marker")+` WHERE name = $1`, name).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%s: the stale holder's write committed (%d rows, %v); want none", name, n, err)
		}
		rec, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: stale.Scope, Key: stale.Key, Now: taker.Now})
		if err != nil || rec.Token != taker.Token || rec.State != idemstore.StateInFlight || rec.RecoveryPoint != "" {
			t.Fatalf("%s: the record after the stale write = %+v, %v; want the taker's, in flight, untouched", name, rec, err)
		}
	}
}
