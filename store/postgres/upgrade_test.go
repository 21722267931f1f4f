package postgres_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
)

// Rolling upgrades (migration 0006): while a deploy replaces processes one by one, a
// process of the previous version claims beside a schema that the new version
// migrated, and each sees the other's records.

// previousClaim is RecordClaim as the previous version sends it
// (store/postgres/queries/records.sql at commit 5a4526d, migration 0005): SELECT * of
// idem_claim, whose columns that version reads by position.
const previousClaim = `SELECT * FROM %sidem_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`

// previousRow is a row of previousClaim as the previous version's scanRecord reads
// it: claimed, then the record's 16 columns, then the store's time.
type previousRow struct {
	claimed                       bool
	id, state                     string
	fingerprintVersion            int32
	fingerprint                   []byte
	token, recoveryPoint, op      *string
	leaseEnd                      *time.Time
	status                        *int32
	headers, body, steps          []byte
	notStored, outcomeUnknown     bool
	createdAt, expiresAt, storeAt time.Time
}

func TestAProcessOfThePreviousVersionClaimsBesideAMigratedSchema(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	query := strings.Replace(previousClaim, "%s", pgx.Identifier{s.schema}.Sanitize()+".", 1)
	previous := func(p *idemstore.ClaimParams) previousRow {
		t.Helper()
		var r previousRow
		err := s.Pool().QueryRow(t.Context(), query, []byte(p.Scope), []byte(p.Key), p.RecordID,
			p.Fingerprint.Version, p.Fingerprint.Sum[:], p.Token, p.Lease.Microseconds(), p.TTL.Microseconds(), nil, false,
		).Scan(&r.claimed, &r.id, &r.fingerprintVersion, &r.fingerprint, &r.state, &r.token, &r.leaseEnd,
			&r.status, &r.headers, &r.body, &r.notStored, &r.outcomeUnknown, &r.recoveryPoint, &r.steps, &r.op,
			&r.createdAt, &r.expiresAt, &r.storeAt)
		if err != nil {
			t.Fatalf("the previous version's claim on a migrated schema: %v", err)
		}
		return r
	}

	// The previous version claims a new key; this one finds it in flight, and takes
	// it over once its lease lapsed.
	old := claimParams("k-previous", time.Time{})
	if r := previous(old); !r.claimed || r.state != "in_flight" || r.token == nil || *r.token != old.Token || r.id != old.RecordID {
		t.Fatalf("the previous version's claim of a new key = %+v, want it claimed in flight", r)
	}
	mustClaim(t, s, claimParams(old.Key, time.Time{}), idemstore.ClaimMismatch) // another request's fingerprint
	dup := *old
	dup.Token = "tok-duplicate"
	mustClaim(t, s, &dup, idemstore.ClaimInFlight)
	late := dup
	late.Now = time.Now().Add(time.Minute)
	if res := mustClaim(t, s, &late, idemstore.ClaimAcquired); !res.TookOver || res.Record.ID != old.RecordID {
		t.Fatalf("the takeover of the previous version's lapsed claim = %+v, want the record kept", res)
	}

	// This version claims and completes a key; the previous one replays it.
	cur := claimParams("k-current", time.Time{})
	mustClaim(t, s, cur, idemstore.ClaimAcquired)
	resp := &idemstore.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}
	if err := s.RecordComplete(t.Context(), &idemstore.CompleteParams{Scope: cur.Scope, Key: cur.Key, Token: cur.Token, TTL: cur.TTL, Response: resp}); err != nil {
		t.Fatal(err)
	}
	again := *cur
	again.Token = "tok-previous-retry"
	r := previous(&again)
	if r.claimed || r.state != "completed" || r.status == nil || *r.status != 201 || string(r.body) != `{"id":"ch_1"}` || r.outcomeUnknown {
		t.Fatalf("the previous version's retry of a completed key = %+v, want the stored 201", r)
	}
}

// The migrations after 0005 only add (tables, columns that are NULL or have a default,
// indexes, functions under new names), so that a process of the previous version
// keeps working on a schema that the next one migrated (0006_claim_v2.up.sql says
// why).
func TestMigrationsAfter0005OnlyAdd(t *testing.T) {
	t.Parallel()
	testkit.MigrationsOnlyAdd(t, "migrations", 5, 8, 10) // 0008 and 0010 drop indexes no process names (their headers say why)
}
