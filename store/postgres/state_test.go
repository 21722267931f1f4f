package postgres_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// The table does not check a record's state (migration 0011: the check cost a tenth
// of PostgreSQL's time per new key); the store does, when it reads one. A record in a
// state no idem process writes (a hand edit, a bug) is an error, not a record that the
// middleware would take for completed or in flight.
func TestARecordInAStateIdemNeverWritesIsRefused(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	ctx := t.Context()
	p := claimParams("k-odd-state", time.Now().UTC())
	mustClaim(t, s, p, idemstore.ClaimAcquired)
	if _, err := s.Pool().Exec(ctx, `UPDATE `+s.table("idem_records")+` SET state = 'done' WHERE key = $1`, []byte(p.Key)); err != nil {
		t.Fatalf("the table refuses a state of its own: %v (migration 0011 drops the check)", err)
	}
	rec, err := s.RecordGet(ctx, &idemstore.GetParams{Scope: p.Scope, Key: p.Key})
	if err == nil || !strings.Contains(err.Error(), `"done"`) {
		t.Fatalf("RecordGet of a record in state done = %+v, %v; want an error naming the state", rec, err)
	}
	if _, err := s.RecordClaim(ctx, claimParams(p.Key, p.Now)); err == nil {
		t.Fatal("RecordClaim of a key whose record is in state done succeeded; want an error")
	}
}
