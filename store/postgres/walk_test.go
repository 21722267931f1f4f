package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// The cleaner walks the table in disk order (migration 0010: no index of expiry), a
// range of pages at a time, and a walk cut short by MaxDuration or Limit goes on from
// where it stopped at the next call.

// fillWalk inserts n records server-side, each with a body of about 1 KB so that they
// span many pages: every third expired an hour ago, every third live, every third an
// unfinished operation whose TTL ran out (never deleted). It returns how many expired.
func fillWalk(t *testing.T, s schemaStore, n int) int {
	t.Helper()
	_, err := s.Pool().Exec(t.Context(), fmt.Sprintf(`
		INSERT INTO %s (scope, key, id, fingerprint_version, fingerprint, state, lock_token, lease_end,
			response_status, response_body, recovery_point, created_at, expires_at)
		SELECT 'walk'::bytea, convert_to('k' || i, 'UTF8'), 'r' || i, 1, '\x00'::bytea,
			CASE i %% 3 WHEN 2 THEN 'in_flight' ELSE 'completed' END,
			CASE i %% 3 WHEN 2 THEN '' END,
			CASE i %% 3 WHEN 2 THEN now() - interval '2 hours' END,
			CASE i %% 3 WHEN 2 THEN NULL ELSE 201 END,
			convert_to(repeat('x', 1000), 'UTF8'),
			CASE i %% 3 WHEN 2 THEN 'charge_pending' END,
			now() - interval '3 hours',
			CASE i %% 3 WHEN 1 THEN now() + interval '1 hour' ELSE now() - interval '1 hour' END
		FROM generate_series(0, $1 - 1) AS i`, s.table("idem_records")), n)
	if err != nil {
		t.Fatal(err)
	}
	return (n + 2) / 3
}

// count counts the records of fillWalk that are left, by kind (not idem's own, SPEC §20).
func countWalk(t *testing.T, s schemaStore) (expired, live, unfinished int) {
	t.Helper()
	err := s.Pool().QueryRow(t.Context(), fmt.Sprintf(`
		SELECT count(*) FILTER (WHERE state = 'completed' AND expires_at < now()),
		       count(*) FILTER (WHERE state = 'completed' AND expires_at > now()),
		       count(*) FILTER (WHERE state = 'in_flight')
		FROM %s WHERE scope <> $1`, s.table("idem_records")), []byte(idemstore.ReservedScope)).Scan(&expired, &live, &unfinished)
	if err != nil {
		t.Fatal(err)
	}
	return expired, live, unfinished
}

func TestTheCleanersWalkDeletesEveryExpiredRecordOfAManyPagedTable(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	const n = 6000
	expired := fillWalk(t, s, n)
	var pages int64
	if err := s.Pool().QueryRow(t.Context(), `SELECT pg_relation_size($1::regclass) / 8192`, s.table("idem_records")).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if pages < 600 {
		t.Fatalf("the table has %d pages; the test wants more than two of the walk's first ranges (256 pages)", pages)
	}

	// A walk of one range per call (MaxDuration 1 ns), 100 records at most: it goes on
	// from where the last call stopped until it reaches the table's end.
	deleted, calls := 0, 0
	for {
		calls++
		if calls > 10000 {
			t.Fatal("the walk did not reach the table's end")
		}
		got, err := s.RecordDeleteExpired(t.Context(), &idemstore.DeleteExpiredParams{Limit: 100, MaxDuration: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		if got > 100 {
			t.Fatalf("a call deleted %d records, past its Limit of 100", got)
		}
		deleted += got
		if deleted == expired {
			break
		}
	}
	if calls < expired/100 {
		t.Fatalf("%d calls deleted %d records, past their Limit of 100 each", calls, deleted)
	}
	e, live, unfinished := countWalk(t, s)
	if e != 0 || live != n/3 || unfinished != n/3 {
		t.Fatalf("after the walk: %d expired, %d live, %d unfinished left; want 0, %d, %d", e, live, unfinished, n/3, n/3)
	}

}

func TestTheCleanersWalkStopsAtItsLimitAndGoesOnFromThere(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	expired := fillWalk(t, s, 3000)
	total := 0
	for range 3 {
		got, err := s.RecordDeleteExpired(t.Context(), &idemstore.DeleteExpiredParams{Limit: 7})
		if err != nil {
			t.Fatal(err)
		}
		if got != 7 {
			t.Fatalf("a call with Limit 7 on a table of %d expired records deleted %d", expired, got)
		}
		total += got
	}
	// Without a bound of time or of records to speak of, the walk goes to the end.
	got, err := s.RecordDeleteExpired(t.Context(), &idemstore.DeleteExpiredParams{Limit: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if total+got != expired {
		t.Fatalf("deleted %d then %d of %d expired records", total, got, expired)
	}
	if e, _, _ := countWalk(t, s); e != 0 {
		t.Fatalf("%d expired records left after a walk to the table's end", e)
	}
}
