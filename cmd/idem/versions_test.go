package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
)

// putReserved completes the reserved record key with body in the store at url, as
// another release would write it.
func putReserved(t *testing.T, url, key string, body any, ttl time.Duration) {
	t.Helper()
	ctx, st := openFixtureStore(t, url)
	b, _ := json.Marshal(body)
	p := &idemstore.ClaimParams{Scope: idemstore.ReservedScope, Key: key, Fingerprint: idem.FingerprintInput(string(b), nil),
		Token: "tok-" + key, RecordID: "00112233445566778899aabbccddeeff", Lease: time.Minute, TTL: ttl}
	if res, err := st.store.RecordClaim(ctx, p); err != nil || res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("claiming %s: %+v %v", key, res, err)
	}
	if err := st.store.RecordComplete(ctx, &idemstore.CompleteParams{Scope: idemstore.ReservedScope, Key: key, Token: p.Token,
		Response: &idem.Response{Status: 200, Body: b}, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
}

// asReleasedLeftIt deletes the store's state records: the store as idem 0.2.0 made it.
func asReleasedLeftIt(t *testing.T, url string) {
	t.Helper()
	ctx, st := openFixtureStore(t, url)
	if err := st.store.(admin.Store).RecordDelete(ctx, &admin.RecordDeleteParams{Scope: idemstore.ReservedScope, Key: "state-1", Force: true}); err != nil {
		t.Fatal(err)
	}
}

func TestMigrateSaysTheStoresStateAndFinalizesOnlyOnceOlderReleasesAreGone(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	out, _ := mustRun(t, exitOK, "migrate", "--create", "--store", url)
	for _, want := range []string{"format level 2", "written by idem " + idem.Release, "sealing: never begun", "idem " + idem.Release + " (knows format level 2)"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate of a new store says\n%s\nwant %q", out, want)
		}
	}

	asReleasedLeftIt(t, url)
	yesterday := time.Now().UTC().AddDate(0, 0, -1)
	putReserved(t, url, "served/"+yesterday.Format(time.DateOnly)+"/1", map[string]any{"release": "0.2.9", "level": 1, "at": yesterday}, time.Hour)
	out, _ = mustRun(t, exitOK, "migrate", "--store", url)
	for _, want := range []string{"format level 1", "not finalized", "idem 0.2.9 (knows format level 1)"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate of a store 0.2.x made says\n%s\nwant %q", out, want)
		}
	}
	_, stderr := mustRun(t, exitFailure, "migrate", "--finalize", "--store", url)
	if !strings.Contains(stderr, "idem 0.2.9") || !strings.Contains(stderr, "--force") {
		t.Errorf("finalizing while 0.2.9 served yesterday: %q, want it named and --force offered", stderr)
	}
	out, _ = mustRun(t, exitOK, "migrate", "--finalize", "--force", "--store", url)
	for _, want := range []string{"finalized: format level 1 -> 2", "gives up the rollback to idem 0.2.0", "although idem 0.2.9 served"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate --finalize --force says\n%s\nwant %q", out, want)
		}
	}
	out, _ = mustRun(t, exitOK, "migrate", "--finalize", "--store", url)
	if !strings.Contains(out, "finalized already") {
		t.Errorf("a second --finalize says\n%s\nwant that there is nothing to do", out)
	}
	if _, stderr := mustRun(t, exitUsage, "migrate", "--force", "--store", url); !strings.Contains(stderr, "--finalize") {
		t.Errorf("--force alone: %q", stderr)
	}
}

// From this release on, every command that opens a store refuses one whose format
// level is newer than it knows, naming both versions.
func TestEveryCommandRefusesAStoreWhoseFormatLevelIsNewer(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	mustRun(t, exitOK, "migrate", "--create", "--store", url)
	putReserved(t, url, "state-2", map[string]any{"level": 3, "release": "0.4.0", "written_at": time.Now().UTC()}, idem.MaxTTL)
	for _, args := range [][]string{
		{"migrate", "--store", url},
		{"migrate", "--finalize", "--store", url},
		{"purge", "--store", url},
		{"keys", "list", "--store", url},
		{"payments", "--addr", "127.0.0.1:0", "--store", url},
		{"proxy", "--addr", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--store", url},
	} {
		_, stderr := mustRun(t, exitFailure, args...)
		for _, want := range []string{"format level 3", "idem 0.4.0", "this is idem " + idem.Release} {
			if !strings.Contains(stderr, want) {
				t.Errorf("idem %s: %q, want it to say %q", strings.Join(args, " "), stderr, want)
			}
		}
	}
}

func TestMigrateFailsOnASchemaWithAMigrationItDoesNotKnow(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	mustRun(t, exitOK, "migrate", "--create", "--store", url)
	ctx, st := openFixtureStore(t, url)
	if _, err := st.sqlite.DB().ExecContext(ctx, `INSERT INTO idem_migrations (version, name, applied_at) VALUES (99, '0099_later_release', 0)`); err != nil {
		t.Fatal(err)
	}
	_, stderr := mustRun(t, exitFailure, "migrate", "--store", url)
	for _, want := range []string{"0099_later_release", "does not know", "idem " + idem.Release} {
		if !strings.Contains(stderr, want) {
			t.Errorf("migrate of a schema a later release migrated: %q, want %q", stderr, want)
		}
	}
}

// idem keys never reads or changes idem's own records: deleting the reserved scope
// would take the MAC secret (every sealed record with it) and the store's state.
func TestKeysRefusesTheReservedScope(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	mustRun(t, exitOK, "migrate", "--create", "--store", url)
	for _, args := range [][]string{
		{"keys", "delete", "--all", "--force", "--abandon", "--scope", idemstore.ReservedScope, "--store", url},
		{"keys", "list", "--scope", idemstore.ReservedScope, "--store", url},
	} {
		if _, stderr := mustRun(t, exitUsage, args...); !strings.Contains(stderr, "reserved scope") {
			t.Errorf("idem %s: %q, want a refusal naming the reserved scope", args[:2], stderr)
		}
	}
	out, _ := mustRun(t, exitOK, "migrate", "--store", url)
	if !strings.Contains(out, "format level 2") {
		t.Fatalf("after the refused delete, migrate says\n%s\nwant the store's state kept (level 2)", out)
	}
}
