package e2e

import (
	"strings"
	"testing"
)

// wantOneLineError fails unless res is a non-zero exit with exactly one line on stderr.
func wantOneLineError(t *testing.T, what string, res runResult) {
	t.Helper()
	if res.exitCode == 0 {
		t.Fatalf("%s: want a non-zero exit, got 0; stdout:\n%s\nstderr:\n%s", what, res.stdout, res.stderr)
	}
	lines := strings.Split(strings.TrimSpace(res.stderr), "\n")
	if len(lines) != 1 || lines[0] == "" {
		t.Fatalf("%s: want a one-line error on stderr, got %d lines:\n%s", what, len(lines), res.stderr)
	}
}

func TestPaymentsRefusesUnknownFlagWithOneLineError(t *testing.T) {
	t.Parallel()
	wantOneLineError(t, "idem payments --bogus", runIdem(t, "payments", "--bogus"))
}

func TestPaymentsRefusesUnknownStoreSchemeWithOneLineError(t *testing.T) {
	t.Parallel()
	res := runIdem(t, "payments", "--addr", "127.0.0.1:0", "--store", "nosuch://x")
	wantOneLineError(t, "idem payments --store nosuch://x", res)
	if !strings.Contains(res.stderr, "nosuch") {
		t.Fatalf("the error does not name the bad URL: %s", res.stderr)
	}
}

// Every subcommand refuses a bad flag value or URL with a one-line error (SPEC §10).
func TestBadFlagValuesAreOneLineErrors(t *testing.T) {
	t.Parallel()
	db := sqliteStore(t)
	for _, args := range [][]string{
		{"payments", "--addr", "127.0.0.1:0", "--store", db, "--profile", "bogus"},
		{"payments", "--addr", "127.0.0.1:0", "--store", db, "--ttl", "banana"},
		{"payments", "--addr", "127.0.0.1:0", "--store", db, "--lock-timeout", "-1s"},
		{"migrate", "--store", "nosuch://x"},
		{"migrate", "--bogus"},
		{"purge", "--store", db, "--older-than", "banana"},
		{"purge", "--store", "nosuch://x"},
	} {
		wantOneLineError(t, "idem "+strings.Join(args, " "), runIdem(t, args...))
	}
	// An unknown command is neither a flag nor a URL: it may print the usage, but it
	// must fail.
	if res := runIdem(t, "nosuchcommand"); res.exitCode == 0 {
		t.Fatalf("idem nosuchcommand: want a non-zero exit, got 0")
	}
}

func TestMigrateIsRepeatable(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			store := newStore(t, kind)
			mustRunIdem(t, "migrate", "--create", "--store", store) // a new SQLite file needs --create
			mustRunIdem(t, "migrate", "--store", store)
			// The migrated store serves.
			s := startServer(t, "--store", store)
			want201(t, "POST on a migrated store", newClient().postCharge(t, s.URL(), newKey(), chargeJSON(2000)))
		})
	}
}

func TestHealthzAnswers200WhenStoresAnswer(t *testing.T) {
	t.Parallel()
	s, c := setup(t)
	if res := c.do(t, s.URL(), request{method: "GET", path: "/healthz"}); res.Status != 200 {
		t.Fatalf("/healthz: want 200, got %s", res)
	}
}

func TestEverySubcommandHasHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"payments", "migrate", "purge", "load"} {
		res := runIdem(t, cmd, "--help")
		if res.exitCode != 0 || !strings.Contains(res.stdout+res.stderr, "--") {
			t.Errorf("idem %s --help: want exit 0 and the flags, got exit %d:\n%s%s", cmd, res.exitCode, res.stdout, res.stderr)
		}
	}
}
