package postgres

// Round trips per request (steady state: pgx's statement cache has already prepared the
// statement on the connection, which costs one extra round trip per statement the first
// time a pooled connection runs it; and the pool does not ping a connection unless it sat
// idle for more than a second):
//
//   - new key:             1 (RecordClaim: one call of idem_claim_v2, a read then an insert)
//     + 1 to complete      (RecordComplete, or RecordRelease)
//   - replay:              1 (RecordClaim returns the completed record; nothing written)
//   - in-flight duplicate: 1 (RecordClaim returns the in-flight record; nothing written)
//   - key reused:          1 (as a replay)
//   - takeover:            2 (RecordClaim, then the fenced RecordTakeOver update)
//   - step (Step):         the step's statements (BEGIN goes with the first) + 1 (the
//     fenced RecordStepTx and COMMIT, pipelined in one batch); a committed step, met
//     again by a holder that resumes, 0. A charge in steps (claim, a step with one
//     INSERT, an InTx with one UPDATE) is 5; its retry after a release, resumed after
//     the step, 4 (TestChargeInStepsCountsItsRoundTrips)
//   - release:             1, whether it deletes the record or, after a step, keeps it
//     with its lease ended (one statement)
//   - expired record:      2 (RecordClaim, then the fenced RecordClaimExpired update)
//   - §7 InTx:             the handler's statements (BEGIN goes with the first, lazyTx)
//     + 1 (the fenced completion and COMMIT, pipelined in one batch): a whole request
//     with one statement is 3 with the claim (TestInTxRequestIsThreeRoundTrips); a
//     replay of it is 1 as above
//   - §7 Respond:          1 (the handler's statements and the fenced completion in
//     one pipelined implicit transaction), so a whole request is 2 with the claim
//   - Respond on a RouteOptions.ClaimInHandler route: 1 for a new key (the record's
//     insert already completed under the key's advisory lock with a bounded
//     lock_timeout, the handler's statements; committed at the batch's end); a key
//     recorded already (a replay, a reused key, an in-flight duplicate, an expired
//     record) stops that transaction before anything is written (idem_stop raises
//     IDL02; the transaction rolls back at the batch's end without a ROLLBACK; pgx's
//     statement cache keeps the batch's statements, keepStatementCaches), then 1 (the
//     claim answers) or, having taken it over, 1 + 1 (the claim, the statements under
//     the lease). While the route's retries are frequent the middleware reads the key
//     first (RecordGet, 1): a replay, a reused key or an in-flight duplicate is that
//     read alone (the in-flight one then claims: +1) and the handler never runs; a new
//     key is the read and its transaction, 2
//
// TestNewKeyClaimIsOneRoundTrip and its neighbours in roundtrip_test.go count them on
// the wire.

import (
	"embed"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

//go:embed queries/*.sql
var queryFiles embed.FS

// queries holds the statements of queries/*.sql with the schema filled in.
type queries struct {
	// schemaPrefix is what {{schema}} became: the quoted schema and a dot, or "".
	schemaPrefix string
	// kept are the same statements for sessions whose synchronous_commit is on or
	// stronger already: their {{durable}} is true, which costs nothing, and their
	// {{durable_claim}} lowers the setting only for Config.AsynchronousClaim
	// (durability.go says when a store uses them). nil in kept itself.
	kept *queries

	recordClaim           string
	recordClaimNew        string
	recordClaimExpired    string
	recordTakeOver        string
	recordMarkUnknown     string
	recordComplete        string
	recordCompleteTx      string
	recordInsertDone      string
	recordRelease         string
	recordStep            string
	recordStepTx          string
	recordListResumable   string
	recordRenew           string
	recordGet             string
	recordDeleteExpired   string
	recordCountUnfinished string

	sessionSynchronousCommit string

	migrateLock         string
	migrateSchemaExists string
	migrateCreateTable  string
	migrateApplied      string
	migrateRecord       string
	migrateUnknown      string
	migrateDropIndex    string
}

// parsedQueries are the raw statements by name, read once from the embedded files.
var parsedQueries = mustParseQueries()

// raiseSynchronousCommit is the SQL value of synchronous_commit for a transaction
// that writes a record: on where the session says off or local, the session's own
// setting where it is stronger (on, remote_write, remote_apply).
const raiseSynchronousCommit = `CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on' ` +
	`ELSE current_setting('synchronous_commit') END`

// durable is what {{durable}} becomes in queries/*.sql: a condition, always true,
// that sets the transaction's synchronous_commit to raiseSynchronousCommit (see the
// header of records.sql). durableClaim, {{durable_claim}}, is RecordClaim's: off when
// its $10 (Config.AsynchronousClaim) is true.
//
// durableKept and durableClaimKept are what they become in queries.kept, for sessions
// whose setting is on or stronger already: the raise would change nothing there, and
// set_config(…, true) is not free (the setting's save and its restore at the commit:
// a few per cent of PostgreSQL's CPU time per request, issue 50).
const (
	durable          = `(set_config('synchronous_commit', ` + raiseSynchronousCommit + `, true) <> '')`
	durableClaim     = `(set_config('synchronous_commit', CASE WHEN $10 THEN 'off' ELSE ` + raiseSynchronousCommit + ` END, true) <> '')`
	durableKept      = `true`
	durableClaimKept = `(NOT $10::boolean OR set_config('synchronous_commit', 'off', true) <> '')`
)

// fill fills the placeholders of a statement of queries/*.sql: {{schema}} with prefix
// (the quoted schema and a dot, or ""), {{durable}} and {{durable_claim}}.
func fill(stmt, prefix string) string {
	return fillWith(stmt, prefix, durable, durableClaim)
}

// fillWith is fill with the given conditions for {{durable}} and {{durable_claim}}.
func fillWith(stmt, prefix, durable, durableClaim string) string {
	return strings.NewReplacer("{{schema}}", prefix, "{{durable}}", durable, "{{durable_claim}}", durableClaim).Replace(stmt)
}

// newQueries fills the placeholders of every statement for schema ("" = the
// search_path), and of their kept variants.
func newQueries(schema string) *queries {
	q := newQueriesWith(schema, durable, durableClaim)
	q.kept = newQueriesWith(schema, durableKept, durableClaimKept)
	return q
}

// newQueriesWith fills the placeholders of every statement for schema with the given
// conditions for {{durable}} and {{durable_claim}}.
func newQueriesWith(schema, durable, durableClaim string) *queries {
	prefix := ""
	if schema != "" {
		prefix = pgx.Identifier{schema}.Sanitize() + "."
	}
	q := func(name string) string {
		s, ok := parsedQueries[name]
		if !ok {
			panic("postgres: no query named " + name) // a bug in this package
		}
		return fillWith(s, prefix, durable, durableClaim)
	}
	return &queries{
		schemaPrefix:             prefix,
		recordClaim:              q("RecordClaim"),
		recordClaimNew:           q("RecordClaimNew"),
		recordClaimExpired:       q("RecordClaimExpired"),
		recordTakeOver:           q("RecordTakeOver"),
		recordMarkUnknown:        q("RecordMarkUnknown"),
		recordComplete:           q("RecordComplete"),
		recordCompleteTx:         q("RecordCompleteTx"),
		recordInsertDone:         q("RecordInsertCompleted"),
		recordRelease:            q("RecordRelease"),
		recordStep:               q("RecordStep"),
		recordStepTx:             q("RecordStepTx"),
		recordListResumable:      q("RecordListResumable"),
		recordRenew:              q("RecordRenew"),
		recordGet:                q("RecordGet"),
		recordDeleteExpired:      q("RecordDeleteExpired"),
		recordCountUnfinished:    q("RecordCountUnfinished"),
		sessionSynchronousCommit: q("SessionSynchronousCommit"),
		migrateLock:              q("MigrateLock"),
		migrateSchemaExists:      q("MigrateSchemaExists"),
		migrateCreateTable:       q("MigrateCreateTable"),
		migrateApplied:           q("MigrateApplied"),
		migrateRecord:            q("MigrateRecord"),
		migrateUnknown:           q("MigrateUnknown"),
		migrateDropIndex:         q("MigrateDropExpiryIndex"),
	}
}

// mustParseQueries splits every queries/*.sql file at its "-- name: X" lines.
func mustParseQueries() map[string]string {
	entries, err := queryFiles.ReadDir("queries")
	if err != nil {
		panic(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		b, err := queryFiles.ReadFile("queries/" + e.Name())
		if err != nil {
			panic(err)
		}
		for name, stmt := range splitNamed(string(b)) {
			if _, dup := out[name]; dup {
				panic(fmt.Sprintf("postgres: query %s defined twice", name))
			}
			out[name] = stmt
		}
	}
	return out
}

// splitNamed returns the statements of one file by name. Text before the first
// "-- name:" line is the file's header comment and belongs to no statement.
func splitNamed(src string) map[string]string {
	out := map[string]string{}
	var name string
	var body strings.Builder
	flush := func() {
		if name != "" {
			out[name] = strings.TrimSpace(body.String())
		}
		body.Reset()
	}
	for line := range strings.Lines(src) {
		if rest, ok := strings.CutPrefix(line, "-- name:"); ok {
			flush()
			name = strings.TrimSpace(rest)
			continue
		}
		body.WriteString(line)
	}
	flush()
	return out
}
