package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

func TestEnvNameIsIdemAndTheFlagInUpperCase(t *testing.T) {
	t.Parallel()
	for flagName, want := range map[string]string{
		"store":               "IDEM_STORE",
		"db":                  "IDEM_DB",
		"lock-timeout":        "IDEM_LOCK_TIMEOUT",
		"disable-idempotency": "IDEM_DISABLE_IDEMPOTENCY",
	} {
		if got := envName(flagName); got != want {
			t.Errorf("envName(%q) = %q, want %q", flagName, got, want)
		}
	}
}

// testFlags is a flag set with one flag of each kind the command uses.
func testFlags() (fs *flag.FlagSet, store *string, ttl *time.Duration, off *bool, n *int) {
	fs = newFlagSet("test", "")
	store = fs.String("store", "sqlite:idem.db", "")
	ttl = fs.Duration("ttl", time.Hour, "")
	off = fs.Bool("disable-idempotency", false, "")
	n = fs.Int("replay-cache", 0, "")
	return fs, store, ttl, off, n
}

func lookupIn(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func TestUnsetFlagsComeFromTheirVariables(t *testing.T) {
	t.Parallel()
	fs, store, ttl, off, n := testFlags()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"IDEM_STORE": "postgres://u:pw@db/app", "IDEM_TTL": "90m", "IDEM_DISABLE_IDEMPOTENCY": "true", "IDEM_REPLAY_CACHE": "7"}
	if err := setFromEnv(fs, lookupIn(env)); err != nil {
		t.Fatal(err)
	}
	if *store != env["IDEM_STORE"] || *ttl != 90*time.Minute || !*off || *n != 7 {
		t.Fatalf("store %q ttl %v disable %v replay-cache %d; want every value from the environment", *store, *ttl, *off, *n)
	}
}

func TestTheFlagWinsOverItsVariable(t *testing.T) {
	t.Parallel()
	fs, store, ttl, _, _ := testFlags()
	if err := fs.Parse([]string{"--store", "sqlite:flag.db"}); err != nil {
		t.Fatal(err)
	}
	if err := setFromEnv(fs, lookupIn(map[string]string{"IDEM_STORE": "sqlite:env.db", "IDEM_TTL": "2h"})); err != nil {
		t.Fatal(err)
	}
	if *store != "sqlite:flag.db" || *ttl != 2*time.Hour {
		t.Fatalf("store %q ttl %v; want the flag's store and the variable's ttl", *store, *ttl)
	}
}

func TestAnEmptyVariableCountsAsUnset(t *testing.T) {
	t.Parallel()
	fs, store, ttl, _, _ := testFlags()
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := setFromEnv(fs, lookupIn(map[string]string{"IDEM_STORE": "", "IDEM_TTL": ""})); err != nil {
		t.Fatal(err)
	}
	if *store != "sqlite:idem.db" || *ttl != time.Hour {
		t.Fatalf("store %q ttl %v; want the defaults", *store, *ttl)
	}
}

func TestReplaceFlagNameLeavesLongerFlagsAlone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ msg, want string }{
		{"--store: bad", "IDEM_STORE: bad"},
		{"--store-timeout must be positive", "--store-timeout must be positive"},
		{"--db is required with --store", "--db is required with IDEM_STORE"},
		{"--store and --store", "IDEM_STORE and IDEM_STORE"},
	} {
		if got := replaceFlagName(tc.msg, "store", "IDEM_STORE"); got != tc.want {
			t.Errorf("replaceFlagName(%q) = %q, want %q", tc.msg, got, tc.want)
		}
	}
}

// The tests below set real environment variables, so they cannot run in parallel.

func TestBadVariablesAreOneLineErrorsNamingTheVariable(t *testing.T) {
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	cases := []struct {
		env      map[string]string
		args     []string
		variable string
	}{
		{map[string]string{"IDEM_TTL": "soon"}, []string{"payments", "--store", store}, "IDEM_TTL"},
		{map[string]string{"IDEM_TTL": "-1s"}, []string{"payments", "--store", store}, "IDEM_TTL"},
		{map[string]string{"IDEM_LOCK_TIMEOUT": "1ms"}, []string{"payments", "--store", store}, "IDEM_LOCK_TIMEOUT"},
		{map[string]string{"IDEM_DISABLE_IDEMPOTENCY": "maybe"}, []string{"payments", "--store", store}, "IDEM_DISABLE_IDEMPOTENCY"},
		{map[string]string{"IDEM_LOG_FORMAT": "xml"}, []string{"payments", "--store", store}, "IDEM_LOG_FORMAT"},
		{map[string]string{"IDEM_LOG_LEVEL": "loud"}, []string{"payments", "--store", store}, "IDEM_LOG_LEVEL"},
		{map[string]string{"IDEM_STORE": "postgres://u:secret@h:notaport/db"}, []string{"payments"}, "IDEM_STORE"},
		{map[string]string{"IDEM_STORE": "nosuch://x"}, []string{"migrate"}, "IDEM_STORE"},
		{map[string]string{"IDEM_OLDER_THAN": "-1h"}, []string{"purge", "--store", store}, "IDEM_OLDER_THAN"},
		{map[string]string{"IDEM_CONCURRENCY": "0"}, []string{"load", "--url", "http://127.0.0.1:1"}, "IDEM_CONCURRENCY"},
	}
	for _, tc := range cases {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		code, _, stderr := runCmd(t, tc.args...)
		lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
		if code != exitUsage || len(lines) != 1 || !strings.Contains(stderr, tc.variable) {
			t.Errorf("%v idem %s: exit %d, stderr %q; want exit 2 and one line naming %s", tc.env, strings.Join(tc.args, " "), code, stderr, tc.variable)
		}
		if strings.Contains(stderr, "secret") {
			t.Errorf("%v: the error shows the password: %q", tc.env, stderr)
		}
		for k := range tc.env {
			t.Setenv(k, "") // empty counts as unset
		}
	}
}

func TestMigrateTakesItsStoreFromIdemStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "env.db")
	t.Setenv("IDEM_STORE", "sqlite:"+path)
	code, stdout, stderr := runCmd(t, "migrate", "--create")
	if code != exitOK || !strings.Contains(stdout, "migrated sqlite:"+path) {
		t.Fatalf("IDEM_STORE=sqlite:%s idem migrate: exit %d, stdout %q, stderr %q", path, code, stdout, stderr)
	}
	// The flag wins over the variable, even over a bad one.
	t.Setenv("IDEM_STORE", "nosuch://x")
	code, stdout, stderr = runCmd(t, "migrate", "--store", "sqlite:"+path)
	if code != exitOK || !strings.Contains(stdout, "migrated sqlite:"+path) {
		t.Fatalf("--store beside a bad IDEM_STORE: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// --log-format json (here from IDEM_LOG_FORMAT) logs one JSON object per line, the
// start line first, with a time.
func TestPaymentsLogsJSONLines(t *testing.T) {
	t.Setenv("IDEM_LOG_FORMAT", "json")
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	lines, exit := startPayments(ctx, "--addr", "127.0.0.1:0", "--store", store)
	var logged []map[string]any
	for lines.Scan() {
		var m map[string]any
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", lines.Text(), err)
		}
		logged = append(logged, m)
		if len(logged) == 1 {
			cancel() // the start line is out: stop
		}
	}
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if len(logged) != 2 {
		t.Fatalf("logged %v, want the start and the stop lines", logged)
	}
	start := logged[0]
	if start["msg"] != "idem payments listening" || start["level"] != "INFO" || start["store"] != store || start["time"] == nil {
		t.Fatalf("start line %v, want msg, level, store and time", start)
	}
	if _, err := time.Parse(time.RFC3339Nano, start["time"].(string)); err != nil {
		t.Fatalf("start line's time: %v", err)
	}
}

// A variable that names no flag of any command (a typo: IDEM_LOCKTIMEOUT) is named on
// stderr at start, with the variable it most likely meant, rather than ignored without
// a word (issue 19 item 9). A variable of another command (IDEM_PROCESSOR_URL beside
// idem processor), an empty one, and the tests' own IDEM_TEST_* are not named.
func TestUnknownVariablesAreNamedAtStart(t *testing.T) {
	t.Parallel()
	fs, _, _, _, _ := testFlags()
	var stderr strings.Builder
	warnUnknownEnv(fs, []string{"IDEM_TTLL=1h", "IDEM_STORE=sqlite:x.db", "IDEM_TEST_POSTGRES_URL=postgres://h/test",
		"IDEM_REPLAYCACHE=5", "IDEM_BOGUS=1", "PATH=/bin", "IDEM_=x", "IDEM_PROCESSOR_URL=http://h:1",
		"IDEM_LOCKTIMEOUT=1s", "IDEM_EMPTY=", "IDEM_OLDER_THAN=1h"}, &stderr)
	got := stderr.String()
	for _, want := range []string{
		"idem test: IDEM_TTLL is not a variable of any idem command; ignored (did you mean IDEM_TTL?)\n",
		"idem test: IDEM_REPLAYCACHE is not a variable of any idem command; ignored (did you mean IDEM_REPLAY_CACHE?)\n",
		"idem test: IDEM_LOCKTIMEOUT is not a variable of any idem command; ignored (did you mean IDEM_LOCK_TIMEOUT?)\n",
		"idem test: IDEM_BOGUS is not a variable of any idem command; ignored\n",
		"idem test: IDEM_ is not a variable of any idem command; ignored\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("stderr lacks %q:\n%s", want, got)
		}
	}
	if strings.Count(got, "\n") != 5 {
		t.Errorf("stderr names more than the five unknown variables:\n%s", got)
	}
}

// commandVariables knows the flags of every command that parses flags.
func TestCommandVariablesCoverEveryCommand(t *testing.T) {
	t.Parallel()
	c := &flagCollector{vars: map[string]bool{}}
	for _, args := range commands {
		if code := run(t.Context(), args, c, io.Discard); code != exitOK {
			t.Errorf("idem %v with a collector: exit %d", args, code)
		}
	}
	if c.n != len(commands) {
		t.Fatalf("%d flag sets collected for %d commands", c.n, len(commands))
	}
	for _, v := range []string{"IDEM_PROCESSOR_URL", "IDEM_UPSTREAM", "IDEM_OLDER_THAN", "IDEM_CONCURRENCY", "IDEM_FORCE", "IDEM_LOST_REPLY_RATE"} {
		if !commandVariables()[v] {
			t.Errorf("commandVariables lacks %s", v)
		}
	}
	for _, line := range strings.Split(usage, "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(line, "  ") && f[0] != "version" && f[0] != "keys" {
			found := false
			for _, args := range commands {
				found = found || args[0] == f[0]
			}
			if !found {
				t.Errorf("the command %q of the usage is missing from commands", f[0])
			}
		}
	}
}
