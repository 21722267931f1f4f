package postgres_test

import (
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
)

// TestRecordsCommitDurablyWhateverTheSessionSays opens the store on sessions whose
// synchronous_commit is off, local or remote_apply (as a role's ALTER ROLE … SET would
// make them), and records, at the commit of every transaction that writes a record, the
// synchronous_commit that commit obeys: a deferred constraint trigger on the records
// table, which runs just before the commit. Every write of idem's (a claim, a renewal,
// a step, a completion, a release, a takeover, the claim of an expired record, InTx's
// and Step's transactions, Respond's claim in the handler's transaction) commits at
// on or stronger, whatever the session says, and a stronger setting is kept; only a
// claim under Config.AsynchronousClaim commits off, as its doc says. The store has
// read the sessions' setting before these writes (durability.go): where it found on
// or stronger it sends the statements that do not raise it, and those still commit
// so, and still lower a claim under AsynchronousClaim; where it found off or local it
// still raises.
func TestRecordsCommitDurablyWhateverTheSessionSays(t *testing.T) {
	t.Parallel()
	cases := []struct {
		session string
		async   bool
		want    string // every commit's
	}{
		{"off", false, "on"},
		{"local", false, "on"},
		{"remote_apply", false, "remote_apply"},
		{"off", true, "on"}, // the claims of new keys: off
		{"on", false, "on"},
		{"on", true, "on"}, // the claims of new keys: off
	}
	for _, tc := range cases {
		name := "session " + tc.session
		if tc.async {
			name += " with AsynchronousClaim"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			commits := runEveryWrite(t, tc.session, tc.async)
			if len(commits) < 12 {
				t.Fatalf("%d commits logged, want one per write: %v", len(commits), commits)
			}
			for _, c := range commits {
				want := tc.want
				if tc.async && c.write == "INSERT in_flight" {
					want = "off"
				}
				if c.setting != want {
					t.Errorf("%s committed with synchronous_commit %s, want %s (session %s)", c.write, c.setting, want, tc.session)
				}
			}
			t.Logf("%d commits: %v", len(commits), commits)
		})
	}
}

// loggedCommit is a write to the records table and the synchronous_commit in force when
// its transaction committed.
type loggedCommit struct{ write, setting string }

// runEveryWrite opens a store whose sessions start with synchronous_commit = session,
// runs each kind of write the store makes, and returns what the commit log holds.
func runEveryWrite(t *testing.T, session string, async bool) []loggedCommit {
	t.Helper()
	dbURL, schema := pgtest.Schema(t)
	cfg := postgres.Config{Schema: schema, MaxConns: 2, DisableCleaner: true, AsynchronousClaim: async}
	s, err := postgres.Open(t.Context(), pgtest.WithParam(t, dbURL, "synchronous_commit", session), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx := t.Context()
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := s.Pool().QueryRow(ctx, `SHOW synchronous_commit`).Scan(&got); err != nil || got != session {
		t.Fatalf("the session's synchronous_commit is %q (%v), want %q", got, err, session)
	}
	if kept, want := s.ReadDurability(), session == "on" || session == "remote_apply"; kept != want {
		t.Fatalf("with the sessions at %s the store sends the statements that keep the setting: %v, want %v", session, kept, want)
	}
	table := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	// The log and its trigger: deferred, so that it runs at the commit, after every
	// statement of the transaction has run.
	pgtest.Exec(t, dbURL, `CREATE TABLE `+table("commit_log")+` (id bigserial PRIMARY KEY, write text, setting text)`)
	pgtest.Exec(t, dbURL, `CREATE FUNCTION `+table("log_commit")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO `+table("commit_log")+` (write, setting)
	VALUES (TG_OP || ' ' || coalesce(NEW.state, OLD.state), current_setting('synchronous_commit'));
	RETURN NULL;
END $$`)
	pgtest.Exec(t, dbURL, `CREATE CONSTRAINT TRIGGER log_commit AFTER INSERT OR UPDATE OR DELETE ON `+table("idem_records")+`
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+table("log_commit")+`()`)
	pgtest.Exec(t, dbURL, `CREATE TABLE `+table("rows")+` (key text PRIMARY KEY, status text)`)

	t0 := time.Now().UTC().Truncate(time.Millisecond)
	claim := func(key string, now time.Time) *idemstore.ClaimParams {
		t.Helper()
		p := claimParams(key, now)
		if _, err := s.RecordClaim(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	complete := func(p *idemstore.ClaimParams) {
		t.Helper()
		must(s.RecordComplete(ctx, &idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, TTL: p.TTL, Now: p.Now,
			Response: &idemstore.Response{Status: 201, Body: []byte("{}")}}))
	}
	// The store's own statements.
	p := claim("k-steps", t0) // INSERT in_flight
	_, err = s.RecordRenew(ctx, &idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: p.Lease, TTL: p.TTL, Now: t0})
	must(err)                                                                                                        // UPDATE in_flight
	must(s.RecordStep(ctx, &idemstore.StepParams{Scope: p.Scope, Key: p.Key, Token: p.Token, RecoveryPoint: "one"})) // UPDATE in_flight
	complete(p)                                                                                                      // UPDATE completed
	p = claim("k-released", t0)
	must(s.RecordRelease(ctx, &idemstore.ReleaseParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Now: t0})) // DELETE in_flight
	p = claim("k-lapsed", t0)
	taker := claimParams(p.Key, t0.Add(p.Lease))
	taker.Fingerprint = p.Fingerprint
	if res, err := s.RecordClaim(ctx, taker); err != nil || !res.TookOver {
		t.Fatalf("takeover: %v, %+v", err, res) // UPDATE in_flight
	}
	p = claim("k-expired", t0)
	complete(p)
	claim(p.Key, t0.Add(p.TTL)) // UPDATE in_flight: the claim of an expired record

	// The §7 helpers' transactions, through the middleware: a step, then InTx (UPDATE
	// in_flight, then UPDATE completed, with the application's writes); Respond on a
	// ClaimInHandler route (INSERT completed, with the application's write).
	m := idem.New(idem.Config{Store: s, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	charge := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		_, err := postgres.Step(r.Context(), s, "pending", func(ctx context.Context, tx pgx.Tx) (string, error) {
			_, err := tx.Exec(ctx, `INSERT INTO `+table("rows")+` (key, status) VALUES ($1, 'pending')`, key)
			return key, err
		})
		if err == nil {
			err = s.InTx(r.Context(), func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE `+table("rows")+` SET status = 'done' WHERE key = $1`, key)
				w.WriteHeader(http.StatusCreated)
				return err
			})
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	if code := poster(charge)("key-step-" + rand.Text()); code != http.StatusCreated {
		t.Fatalf("charge in steps = %d", code)
	}
	if rec := postKey(m.Route(idem.RouteOptions{ClaimInHandler: true})(rowHandler(s, table("rows"))), "key-respond-"+rand.Text()); rec.Code != http.StatusCreated {
		t.Fatalf("Respond = %d %s", rec.Code, rec.Body)
	}

	rows, err := s.Pool().Query(ctx, `SELECT write, setting FROM `+table("commit_log")+` ORDER BY id`)
	must(err)
	commits, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (loggedCommit, error) {
		var c loggedCommit
		return c, r.Scan(&c.write, &c.setting)
	})
	must(err)
	for _, w := range []string{"INSERT in_flight", "UPDATE in_flight", "UPDATE completed", "DELETE in_flight", "INSERT completed"} {
		if !slices.ContainsFunc(commits, func(c loggedCommit) bool { return c.write == w }) {
			t.Fatalf("no %s logged: %v", w, commits)
		}
	}
	return commits
}

// A write whose connection was lost (a failover may have moved the store to a server
// whose settings differ) forgets the last read of synchronous_commit: the writes raise
// it again until a new read says that the server keeps it; an error from the server
// itself (a unique violation, a lost lease) changes nothing.
func TestALostConnectionForgetsTheDurabilityRead(t *testing.T) {
	t.Parallel()
	dbURL, schema := pgtest.Schema(t)
	s, err := postgres.Open(t.Context(), pgtest.WithParam(t, dbURL, "synchronous_commit", "on"),
		postgres.Config{Schema: schema, MaxConns: 2, DisableCleaner: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if !s.ReadDurability() {
		t.Fatal("with the sessions at on the store raises the setting: want the kept statements")
	}
	if !s.FailAWrite(t.Context(), &pgconn.PgError{Code: "23505"}) {
		t.Fatal("an error from the server made the store forget that the server keeps synchronous_commit")
	}
	if s.FailAWrite(t.Context(), io.ErrUnexpectedEOF) {
		t.Fatal("after a lost connection the store still sends the statements that do not raise synchronous_commit")
	}
	if !s.ReadDurability() {
		t.Fatal("a new read at on: want the kept statements again")
	}
}
