package postgres_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
)

// TestMigrateSaysWhatAFailoverMayLose: the shared test server has no standby, and
// Migrate logs so (replication none, no WARN); behind a PgBouncer the store also says
// that a pooler stands in between. The standbys' cases, synchronous, asynchronous and
// unknown to a role without pg_monitor, run against real standbys in the e2e failover
// tests (e2e/failover_test.go).
func TestMigrateSaysWhatAFailoverMayLose(t *testing.T) {
	t.Parallel()
	dbURL, schema := pgtest.Schema(t)
	for _, via := range []string{"direct", "pgbouncer"} {
		u := dbURL
		if via == "pgbouncer" {
			u = pgtest.WithExecMode(t, pgtest.Bouncer(t, dbURL, 1), "exec")
		}
		var logs bytes.Buffer
		s, err := postgres.Open(t.Context(), u, postgres.Config{Schema: schema, MaxConns: 1, DisableCleaner: true,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		r, err := s.Replication(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if r.Mode != postgres.ReplicationNone || r.Standbys != 0 || r.Warning() != "" || r.Pooler != (via == "pgbouncer") {
			t.Fatalf("%s: Replication = %+v (warning %q), want none, no standby, pooler %v", via, r, r.Warning(), via == "pgbouncer")
		}
		line := logs.String()
		if !strings.Contains(line, "level=INFO") || !strings.Contains(line, "replication=none") || strings.Contains(line, "level=WARN") {
			t.Fatalf("%s: Migrate logged %q, want one INFO line saying replication=none", via, line)
		}
		t.Logf("%s: %s", via, r)
	}
}
