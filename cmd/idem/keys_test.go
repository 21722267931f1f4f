package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/payments"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/redis/redistest"
)

// keysStores are the stores `idem keys` is tested on, each a fresh one per test.
var keysStores = []struct {
	name string
	url  func(t *testing.T) string
}{
	{"SQLite", func(t *testing.T) string { return "sqlite:" + filepath.Join(t.TempDir(), "idem.db") }},
	{"PostgreSQL", func(t *testing.T) string {
		dbURL, schema := pgtest.Schema(t)
		return pgtest.SearchPathURL(t, dbURL, schema)
	}},
	{"Redis", func(t *testing.T) string { return redistest.StartServer(t).URL() }},
}

// keysFixture migrates the store at url and writes, through the command's own
// openStore: in the scope of token tok_a, key-done (completed, 201) and key-live (in
// flight under a live lease); in scope-b, key-done too.
func keysFixture(t *testing.T, url string) {
	t.Helper()
	if code, _, stderr := runCmd(t, "migrate", "--create", "--store", url); code != exitOK {
		t.Fatalf("migrate: exit %d: %s", code, stderr)
	}
	ctx, st := openFixtureStore(t, url)
	claim := func(scope, key string) string {
		p := &idemstore.ClaimParams{Scope: scope, Key: key, Token: "tok-" + key, RecordID: "rec-" + key,
			Fingerprint: idem.Fingerprint{Version: 1}, Lease: time.Hour, TTL: 2 * time.Hour}
		if _, err := st.store.RecordClaim(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p.Token
	}
	for _, scope := range []string{payments.ScopeOfToken("tok_a"), "scope-b"} {
		err := st.store.RecordComplete(ctx, &idemstore.CompleteParams{Scope: scope, Key: "key-done", Token: claim(scope, "key-done"), TTL: 2 * time.Hour,
			Response: &idem.Response{Status: 201, Body: []byte(`{"id":"ch_1"}`), Header: map[string][]string{"Content-Type": {"application/json"}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	claim(payments.ScopeOfToken("tok_a"), "key-live")
}

// openFixtureStore opens the store at url through the command's own openStore,
// closed at the end of the test.
func openFixtureStore(t *testing.T, url string) (context.Context, *openedStore) {
	t.Helper()
	u, err := parseStoreURL(url)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Context(t)
	st, err := openStore(ctx, u, newLogger(io.Discard, 0), nil, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.close)
	return ctx, st
}

// mustRun runs idem args and wants exit status want and, on failure, one line on stderr.
func mustRun(t *testing.T, want int, args ...string) (stdout, stderr string) {
	t.Helper()
	code, stdout, stderr := runCmd(t, args...)
	if code != want || want != exitOK && strings.Count(stderr, "\n") != 1 {
		t.Fatalf("idem %s: exit %d (want %d), stdout %q, stderr %q", strings.Join(args, " "), code, want, stdout, stderr)
	}
	return stdout, stderr
}

func TestKeysGetListAndDeleteOnEveryStore(t *testing.T) {
	t.Parallel()
	for _, s := range keysStores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			url := s.url(t)
			keysFixture(t, url)
			a := []string{"--store", url, "--token", "tok_a"}

			// get: the record's summary, never the body unless asked.
			out, _ := mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-done"}, a...)...)
			for _, want := range []string{payments.ScopeOfToken("tok_a"), "completed", "rec-key-done", "201, 13 bytes"} {
				if !strings.Contains(out, want) {
					t.Errorf("keys get says\n%s\nwant it to mention %q", out, want)
				}
			}
			if strings.Contains(out, "ch_1") {
				t.Errorf("keys get without --body shows the body:\n%s", out)
			}
			out, _ = mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-done", "--body"}, a...)...)
			if !strings.Contains(out, "Content-Type: application/json\n\n{\"id\":\"ch_1\"}\n") {
				t.Errorf("keys get --body says\n%s\nwant the stored headers and body", out)
			}
			out, _ = mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-live", "--json"}, a...)...)
			var rec keyRecordJSON
			if err := json.Unmarshal([]byte(out), &rec); err != nil {
				t.Fatalf("keys get --json: %v\n%s", err, out)
			}
			if rec.State != idemstore.StateInFlight || !rec.LeaseLive || rec.LeaseEnd == nil || rec.Status != nil || rec.Body != nil {
				t.Errorf("keys get --json of the live key: %+v", rec)
			}
			mustRun(t, exitFailure, append([]string{"keys", "get", "--key", "key-never"}, a...)...)

			// list: SQL stores page through a scope; Redis says it cannot.
			if strings.HasPrefix(url, "redis") {
				_, stderr := mustRun(t, exitUsage, append([]string{"keys", "list"}, a...)...)
				if !strings.Contains(stderr, "cannot list") {
					t.Errorf("keys list on Redis says %q, want why it cannot list", stderr)
				}
			} else {
				var page listJSON
				out, _ = mustRun(t, exitOK, append([]string{"keys", "list", "--limit", "1", "--json"}, a...)...)
				if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Records) != 1 || page.Records[0].Key != "key-done" || page.Next == nil {
					t.Fatalf("keys list --limit 1: %v\n%s", err, out)
				}
				out, _ = mustRun(t, exitOK, append([]string{"keys", "list", "--limit", "1", "--after", *page.Next}, a...)...)
				if !strings.Contains(out, "key-live") || strings.Contains(out, "key-done") || strings.Contains(out, "more:") {
					t.Errorf("the second page says\n%s\nwant key-live alone, and no more", out)
				}
				out, _ = mustRun(t, exitOK, "keys", "list", "--store", url, "--state", "completed")
				if strings.Count(out, "key-done") != 2 || strings.Contains(out, "key-live") {
					t.Errorf("keys list --state completed says\n%s\nwant key-done of both scopes", out)
				}
			}

			// delete: a live lease only when forced; then the whole scope, and only it.
			_, stderr := mustRun(t, exitFailure, append([]string{"keys", "delete", "--key", "key-live"}, a...)...)
			if !strings.Contains(stderr, "live lease") || !strings.Contains(stderr, "--force") {
				t.Errorf("deleting a live key says %q", stderr)
			}
			out, _ = mustRun(t, exitOK, append([]string{"keys", "delete", "--key", "key-live", "--force"}, a...)...)
			if !strings.Contains(out, `deleted key "key-live"`) {
				t.Errorf("keys delete --force says %q", out)
			}
			out, _ = mustRun(t, exitOK, append([]string{"keys", "delete", "--all", "--json"}, a...)...)
			var del deleteJSON
			if err := json.Unmarshal([]byte(out), &del); err != nil || del.Deleted != 1 || del.Kept != 0 {
				t.Fatalf("keys delete --all --json: %v %q", err, out)
			}
			mustRun(t, exitFailure, append([]string{"keys", "get", "--key", "key-done"}, a...)...)
			mustRun(t, exitOK, "keys", "get", "--store", url, "--scope", "scope-b", "--key", "key-done")
		})
	}
}

// unknownFixture leaves, in the scope of token tok_a, key-lost completed as outcome
// unknown (its holder died under the policy unknown) next to keysFixture's records.
// The record id and fingerprint of unknownFixture's key-lost.
var (
	lostRecordID    = "00112233445566778899aabbccddeeff" // as idem 0.2.0 made them
	lostFingerprint = idem.Fingerprint{Version: 1, Sum: sha256.Sum256([]byte("key-lost's request"))}
)

func unknownFixture(t *testing.T, url string) {
	t.Helper()
	keysFixture(t, url)
	ctx, st := openFixtureStore(t, url)
	scope, now := payments.ScopeOfToken("tok_a"), time.Now()
	p := &idemstore.ClaimParams{Scope: scope, Key: "key-lost", Token: "tok-dead", RecordID: lostRecordID,
		Fingerprint: lostFingerprint, Lease: time.Second, TTL: 2 * time.Hour, Now: now.Add(-time.Minute)}
	if _, err := st.store.RecordClaim(ctx, p); err != nil {
		t.Fatal(err)
	}
	p.Token, p.OnLapse, p.Now = "tok-retry", idem.LapseUnknown, now
	if res, err := st.store.RecordClaim(ctx, p); err != nil || !res.MarkedUnknown {
		t.Fatalf("marking key-lost outcome unknown: %+v, %v", res, err)
	}
}

func TestKeysResolveOnEveryStore(t *testing.T) {
	t.Parallel()
	for _, s := range keysStores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			url := s.url(t)
			unknownFixture(t, url)
			a := []string{"--store", url, "--token", "tok_a"}

			out, _ := mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-lost"}, a...)...)
			if !strings.Contains(out, "outcome_unknown") || !strings.Contains(out, "idem keys resolve") {
				t.Errorf("keys get of an outcome_unknown key says\n%s\nwant its state and what to do", out)
			}
			// A record settled unknown after a lost reply is one: the wording names it,
			// not only a holder that died.
			if !strings.Contains(out, "the request was sent and its reply lost") {
				t.Errorf("keys get of an outcome_unknown key says\n%s\nwant what may have happened: a lost reply too", out)
			}
			if !strings.HasPrefix(url, "redis") {
				out, _ = mustRun(t, exitOK, append([]string{"keys", "list", "--state", "outcome_unknown"}, a...)...)
				if !strings.Contains(out, "key-lost") || strings.Contains(out, "key-done") || strings.Contains(out, "key-live") {
					t.Errorf("keys list --state outcome_unknown says\n%s\nwant key-lost alone", out)
				}
			}
			// Only an outcome_unknown record is resolved.
			_, stderr := mustRun(t, exitFailure, append([]string{"keys", "resolve", "--key", "key-done", "--release"}, a...)...)
			if !strings.Contains(stderr, "not unknown") {
				t.Errorf("resolving a completed key says %q", stderr)
			}
			mustRun(t, exitFailure, append([]string{"keys", "resolve", "--key", "key-never", "--release"}, a...)...)

			out, _ = mustRun(t, exitOK, append([]string{"keys", "resolve", "--key", "key-lost", "--status", "201",
				"--body", `{"id":"ch_found"}`, "--header", "Location: /v1/charges/ch_found", "--json"}, a...)...)
			var res resolveJSON
			if err := json.Unmarshal([]byte(out), &res); err != nil || res.Resolved != "completed" || res.Status == nil || *res.Status != 201 {
				t.Fatalf("keys resolve --status --json: %v %q", err, out)
			}
			out, _ = mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-lost", "--body"}, a...)...)
			for _, want := range []string{"201, 17 bytes", "Content-Type: application/json", "Location: /v1/charges/ch_found", `{"id":"ch_found"}`} {
				if !strings.Contains(out, want) {
					t.Errorf("keys get after the resolution says\n%s\nwant %q", out, want)
				}
			}
			mustRun(t, exitFailure, append([]string{"keys", "resolve", "--key", "key-lost", "--release"}, a...)...)
		})
	}
}

func TestKeysResolveReleases(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	unknownFixture(t, url)
	a := []string{"--store", url, "--token", "tok_a"}
	out, _ := mustRun(t, exitOK, append([]string{"keys", "resolve", "--key", "key-lost", "--release"}, a...)...)
	if !strings.Contains(out, "released") {
		t.Errorf("keys resolve --release says %q", out)
	}
	mustRun(t, exitFailure, append([]string{"keys", "get", "--key", "key-lost"}, a...)...)
}

// unfinishedFixture leaves, in the scope of token tok_a next to keysFixture's records,
// key-pending-1 and key-pending-2: operations whose step charge_pending committed an
// hour ago and whose holder died, long past their TTL (a minute).
func unfinishedFixture(t *testing.T, url string) (ids map[string]string) {
	t.Helper()
	keysFixture(t, url)
	ctx, st := openFixtureStore(t, url)
	ids = map[string]string{}
	for _, key := range []string{"key-pending-1", "key-pending-2"} {
		p := &idemstore.ClaimParams{Scope: payments.ScopeOfToken("tok_a"), Key: key, Token: "tok-" + key, RecordID: "rec-" + key,
			Fingerprint: idem.Fingerprint{Version: 1}, Lease: time.Second, TTL: time.Minute, Now: time.Now().Add(-time.Hour)}
		if _, err := st.store.RecordClaim(ctx, p); err != nil {
			t.Fatal(err)
		}
		err := st.store.RecordStep(ctx, &idemstore.StepParams{Scope: p.Scope, Key: key, Token: p.Token, RecoveryPoint: "charge_pending",
			Steps: []byte(`[{"step":"charge_pending","result":{"id":"ch_pending"}}]`), Operation: "POST /v1/charges"})
		if err != nil {
			t.Fatal(err)
		}
		ids[key] = p.RecordID
	}
	return ids
}

// An unfinished operation is listed, shown, never purged, kept by delete unless
// --abandon (which says what it abandons), and settled by resolve.
func TestKeysShowKeepAndSettleUnfinishedOperations(t *testing.T) {
	t.Parallel()
	for _, s := range keysStores[:2] { // the SQL stores: Redis keeps no recovery points
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			url := s.url(t)
			ids := unfinishedFixture(t, url)
			a := []string{"--store", url, "--token", "tok_a"}

			out, _ := mustRun(t, exitOK, append([]string{"keys", "list", "--state", "unfinished"}, a...)...)
			for _, want := range []string{"RECOVERY POINT", "AGE", "key-pending-1", "key-pending-2", "POST /v1/charges", "charge_pending",
				"1h0m0s", "lapsed", ids["key-pending-1"]} {
				if !strings.Contains(out, want) {
					t.Errorf("keys list --state unfinished says\n%s\nwant %q", out, want)
				}
			}
			if strings.Contains(out, "key-live") || strings.Contains(out, "key-done") {
				t.Errorf("keys list --state unfinished lists other records:\n%s", out)
			}
			var page listJSON
			out, _ = mustRun(t, exitOK, "keys", "list", "--store", url, "--state", "unfinished", "--json")
			if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Records) != 2 || !page.Records[0].Unfinished ||
				page.Records[0].Expired || page.Records[0].RecoveryPoint != "charge_pending" {
				t.Fatalf("keys list --state unfinished --json: %v\n%s", err, out)
			}
			out, _ = mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-pending-1"}, a...)...)
			if !strings.Contains(out, "unfinished") || !strings.Contains(out, "not while unfinished") {
				t.Errorf("keys get of an unfinished operation says\n%s", out)
			}

			out, _ = mustRun(t, exitOK, "purge", "--store", url)
			if out != "purged 0 records\n" {
				t.Errorf("purge says %q, want nothing purged", out)
			}
			_, stderr := mustRun(t, exitFailure, append([]string{"keys", "delete", "--key", "key-pending-1"}, a...)...)
			for _, want := range []string{"unfinished", "charge_pending", ids["key-pending-1"], "--abandon", "idem keys resolve"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("deleting an unfinished operation says %q, want %q", stderr, want)
				}
			}
			mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-pending-1"}, a...)...)

			out, _ = mustRun(t, exitOK, append([]string{"keys", "delete", "--key", "key-pending-1", "--abandon"}, a...)...)
			for _, want := range []string{`deleted key "key-pending-1"`, `abandoned key "key-pending-1"`, `operation "POST /v1/charges"`,
				`step "charge_pending"`, ids["key-pending-1"]} {
				if !strings.Contains(out, want) {
					t.Errorf("keys delete --abandon says\n%s\nwant %q", out, want)
				}
			}
			mustRun(t, exitFailure, append([]string{"keys", "get", "--key", "key-pending-1"}, a...)...)

			out, _ = mustRun(t, exitOK, append([]string{"keys", "resolve", "--key", "key-pending-2", "--status", "201", "--body", `{"id":"ch_pending"}`}, a...)...)
			if !strings.Contains(out, "completed") {
				t.Errorf("keys resolve of an unfinished operation says %q", out)
			}
			out, _ = mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-pending-2", "--body"}, a...)...)
			if !strings.Contains(out, "201, 19 bytes") || !strings.Contains(out, `{"id":"ch_pending"}`) {
				t.Errorf("keys get after resolving the unfinished operation says\n%s", out)
			}
		})
	}
}

// delete --all keeps the unfinished operations of the scope unless --abandon, and says
// so.
func TestKeysDeleteAllKeepsUnfinishedOperationsUnlessAbandoned(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	ids := unfinishedFixture(t, url)
	a := []string{"--store", url, "--token", "tok_a"}
	out, stderr := mustRun(t, exitFailure, append([]string{"keys", "delete", "--all"}, a...)...)
	if !strings.Contains(out, "deleted 1 records") || !strings.Contains(stderr, "1 record(s) in flight under a live lease") ||
		!strings.Contains(stderr, "2 unfinished operation(s)") || !strings.Contains(stderr, "--abandon") {
		t.Fatalf("keys delete --all: stdout %q, stderr %q; want key-done deleted, key-live and the two unfinished kept", out, stderr)
	}
	out, _ = mustRun(t, exitOK, append([]string{"keys", "delete", "--all", "--force", "--abandon", "--json"}, a...)...)
	var del deleteJSON
	if err := json.Unmarshal([]byte(out), &del); err != nil || del.Deleted != 3 || del.Kept != 0 || del.Unfinished != 0 ||
		len(del.Abandoned) != 2 || del.Abandoned[0].RecordID != ids["key-pending-1"] || del.Abandoned[1].RecordID != ids["key-pending-2"] {
		t.Fatalf("keys delete --all --force --abandon --json: %v %s", err, out)
	}
}

func TestKeysBadFlagsAreOneLineErrors(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys"}, "usage: idem keys"},
		{[]string{"keys", "purge"}, "unknown command"},
		{[]string{"keys", "get", "--scope", "s", "--key", "key-1234"}, "--store is required"},
		{[]string{"keys", "get", "--store", store, "--key", "key-1234"}, "--scope or --token is required"},
		{[]string{"keys", "get", "--store", store, "--scope", "s", "--token", "t", "--key", "key-1234"}, "exclude each other"},
		{[]string{"keys", "get", "--store", store, "--scope", "s"}, "--key is required"},
		{[]string{"keys", "get", "--store", store, "--scope", "s", "--key", "a,b"}, "--key"},
		{[]string{"keys", "get", "--store", "mongodb://x", "--scope", "s", "--key", "key-1234"}, "mongodb"},
		{[]string{"keys", "list", "--store", store, "--state", "done"}, "--state"},
		{[]string{"keys", "list", "--store", store, "--state", "pending"}, "unfinished"},
		{[]string{"keys", "list", "--store", store, "--limit", "0"}, "--limit"},
		{[]string{"keys", "list", "--store", store, "--limit", "1001"}, "--limit"},
		{[]string{"keys", "list", "--store", store, "--after", "%%%"}, "--after"},
		{[]string{"keys", "delete", "--store", store, "--scope", "s"}, "--key or --all"},
		{[]string{"keys", "delete", "--store", store, "--scope", "s", "--key", "key-1234", "--all"}, "exclude each other"},
		{[]string{"keys", "delete", "--store", store, "--all"}, "--scope or --token is required"},
		{[]string{"keys", "delete", "--bogus"}, "bogus"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234"}, "--release or --status"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--release", "--status", "201"}, "excludes"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "42"}, "--status 42"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--body", "x", "--body-file", "f"}, "exclude each other"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", "no colon"}, "Name: value"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", "Set-Cookie: a=b"}, "never stored"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", "Date: x"}, "never stored"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", "Authorization: Bearer x"}, "carries a credential"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", "x-api-key: k"}, "carries a credential"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", "WWW-Authenticate: Basic"}, "carries a credential"},
		{[]string{"keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", "Set-Cookie2: a"}, "carries a credential"},
		{[]string{"keys", "resolve", "--store", store, "--key", "key-1234", "--release"}, "--scope or --token is required"},
	} {
		code, _, stderr := runCmd(t, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || len(tc.args) > 1 && strings.Count(stderr, "\n") != 1 {
			t.Errorf("idem %s: exit %d, stderr %q; want exit 2 and one line naming %q", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
	}
}

func TestCursorRoundTrips(t *testing.T) {
	t.Parallel()
	for _, sk := range [][2]string{{"scope", "key-1"}, {"", "k"}, {"sc\x00ope", "key"}, {strings.Repeat("s", 300), "key"}} {
		scope, key, err := decodeCursor(encodeCursor(sk[0], sk[1]))
		if err != nil || scope != sk[0] || key != sk[1] {
			t.Errorf("cursor of %q: got %q %q %v", sk, scope, key, err)
		}
	}
	for _, bad := range []string{"", "!!", encodeCursor("scope", "")} {
		if _, _, err := decodeCursor(bad); err == nil {
			t.Errorf("decodeCursor(%q) succeeded", bad)
		}
	}
}

// keys get names the key idem proxy derives from a record for the upstream, finds a
// record by it (--upstream-key), and its JSON says an outcome-unknown record's state as
// the text does.
func TestKeysGetShowsAndFindsTheUpstreamKey(t *testing.T) {
	t.Parallel()
	for _, s := range keysStores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			url := s.url(t)
			unknownFixture(t, url)
			// hex SHA-256(record id ‖ step), as every release derives it.
			upstreamSum, chargeSum := sha256.Sum256([]byte(lostRecordID+"upstream")), sha256.Sum256([]byte(lostRecordID+"processor_charge"))
			want, charge := hex.EncodeToString(upstreamSum[:]), hex.EncodeToString(chargeSum[:])
			a := []string{"--store", url, "--token", "tok_a"}
			out, _ := mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-lost", "--step", "processor_charge"}, a...)...)
			if !strings.Contains(out, "upstream key  "+want) || !strings.Contains(out, "derived key   "+charge) {
				t.Errorf("keys get --step processor_charge says\n%s\nwant the upstream key %s and the step's derived key %s", out, want, charge)
			}
			out, _ = mustRun(t, exitOK, append([]string{"keys", "get", "--key", "key-lost", "--json", "--step", "processor_charge"}, a...)...)
			var rec keyRecordJSON
			if err := json.Unmarshal([]byte(out), &rec); err != nil || rec.UpstreamKey != want || rec.State != "outcome_unknown" ||
				rec.DerivedKey == nil || *rec.DerivedKey != (stepKeyJSON{Step: "processor_charge", Key: charge}) {
				t.Errorf("keys get --json: %+v %v, want upstream_key %s, derived_key %s and state outcome_unknown", rec, err, want, charge)
			}
			if strings.HasPrefix(url, "redis") {
				return // Redis cannot list its keys
			}
			out, _ = mustRun(t, exitOK, "keys", "get", "--store", url, "--upstream-key", want)
			if !strings.Contains(out, "key-lost") {
				t.Errorf("keys get --upstream-key says\n%s\nwant key-lost", out)
			}
			mustRun(t, exitFailure, "keys", "get", "--store", url, "--upstream-key", "nope")
		})
	}
}
