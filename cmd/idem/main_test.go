package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/redis/redistest"
	"github.com/idem-go/idem/store/sqlite"
)

// startPayments runs `idem payments args…` until ctx ends, and returns its log lines
// (stderr) and, once it has returned, its exit status. Read the lines to the end: the
// command blocks on a full pipe.
func startPayments(ctx context.Context, args ...string) (lines *bufio.Scanner, exit <-chan int) {
	return startCommand(ctx, append([]string{"payments"}, args...)...)
}

// startCommand runs `idem args…` as startPayments does.
// The command's WARN that records are stored in clear, which TestServersWarnOnce…
// checks, is left out of lines, so that the start line comes first.
func startCommand(ctx context.Context, args ...string) (lines *bufio.Scanner, exit <-chan int) {
	pr, pw := io.Pipe()
	fr, fw := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, args, io.Discard, pw)
		pw.Close()
	}()
	go func() {
		in := bufio.NewScanner(pr)
		for in.Scan() {
			if !strings.Contains(in.Text(), clearRecordsWarning) {
				fmt.Fprintln(fw, in.Text())
			}
		}
		fw.Close()
	}()
	return bufio.NewScanner(fr), code
}

// clearRecordsWarning starts the WARN of a server without --encryption-key.
const clearRecordsWarning = "records are stored in clear"

// restOfLines collects the lines after the first, until the command's stderr closes.
func restOfLines(lines *bufio.Scanner) <-chan []string {
	rest := make(chan []string, 1)
	go func() {
		var more []string
		for lines.Scan() {
			more = append(more, lines.Text())
		}
		rest <- more
	}()
	return rest
}

// postCharge creates a charge with key at the payments API at base, wants 201, and
// returns the answer's headers.
func postCharge(t *testing.T, base, key string) http.Header {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/charges", strings.NewReader(`{"amount": 2000, "currency": "usd"}`))
	req.Header.Set("Authorization", "Bearer tok_test")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/charges: %d", resp.StatusCode)
	}
	return resp.Header
}

// get returns the status and body of GET url.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// runCmd runs the command with args and returns its exit status and output.
func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(testenv.Context(t), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestBadFlagsAndURLsAreOneLineErrorsWithExitStatus2(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := "sqlite:" + filepath.Join(dir, "idem.db")
	cases := []struct {
		args []string
		want string // in the error line
	}{
		{[]string{"payments", "--bogus"}, "bogus"},
		{[]string{"payments", "--store", "nosuch://x"}, "nosuch"},
		{[]string{"payments", "--store", "sqlite:"}, "no path"},
		{[]string{"payments", "--store", "idem.db"}, "no scheme"},
		{[]string{"payments", "--store", "postgres://u:secret@h:notaport/db"}, "--store"},
		{[]string{"payments", "--store", store, "--db", "redis://127.0.0.1:6379"}, "SQL database"},
		{[]string{"payments", "--store", "redis://127.0.0.1:6379"}, "--db is required"},
		{[]string{"payments", "--store", store, "--ttl", "0s"}, "--ttl"},
		{[]string{"payments", "--store", store, "--ttl", "soon"}, "ttl"},
		{[]string{"payments", "--store", store, "--lock-timeout", "1ms"}, "--lock-timeout"},
		{[]string{"payments", "--store", store, "--retention", "-1h"}, "--retention"},
		{[]string{"payments", "--store", store, "--ttl", "30s", "--lock-timeout", "30s"}, "--ttl (30s) must be longer than --lock-timeout (30s)"},
		{[]string{"payments", "--store", store, "--ttl", "10s"}, "--ttl (10s) must be longer than --lock-timeout (30s)"},
		{[]string{"payments", "--store", store, "--ttl", "2200000h"}, "--ttl (2200000h0m0s) is longer than 876000h0m0s (idem.MaxTTL"},
		{[]string{"processor", "--store", store, "--ttl", "2200000h"}, "--ttl (2200000h0m0s) is longer than 876000h0m0s (idem.MaxTTL"},
		{[]string{"payments", "--store", store, "--processor-latency", "-1s"}, "--processor-latency"},
		{[]string{"payments", "--store", store, "--profile", "rfc"}, "--profile"},
		{[]string{"payments", "--store", store, "--processor-url", "127.0.0.1:8090"}, "--processor-url"},
		{[]string{"payments", "--store", store, "--processor-url", "ftp://h:1"}, "--processor-url"},
		{[]string{"payments", "--store", store, "--processor-url", "http://u:secret@h:1"}, "--processor-url"},
		{[]string{"payments", "--store", store, "--processor-url", "http://h:1", "--processor-latency", "1s"}, "--processor-latency"},
		{[]string{"payments", "--store", store, "--processor-url", "http://h:1", "--processor-timeout", "0s"}, "--processor-timeout"},
		{[]string{"payments", "--store", store, "--completer-interval", "0s"}, "--completer-interval"},
		{[]string{"payments", "--store", store, "--unfinished-warn-after", "0s"}, "--unfinished-warn-after"},
		{[]string{"payments", "--store", store, "--migrate-timeout", "0s"}, "--migrate-timeout"},
		{[]string{"payments", "--store", store, "--charge-on-lapse", "retry"}, "charge-on-lapse"},
		{[]string{"payments", "--store", store, "--charge-on-lapse", "unknown", "--processor-url", "http://h:1"}, "--charge-on-lapse unknown"},
		{[]string{"payments", "--store", "redis://127.0.0.1:6379", "--db", store, "--processor-url", "http://h:1"}, "--processor-url needs an SQL --store"},
		{[]string{"payments", "--store", store, "--db", "sqlite:" + filepath.Join(dir, "other.db"), "--processor-url", "http://h:1"}, "--processor-url needs an SQL --store"},
		{[]string{"payments", "--store", store, "--store-timeout", "0s"}, "--store-timeout"},
		{[]string{"payments", "--store", store, "--read-header-timeout", "0s"}, "--read-header-timeout"},
		{[]string{"payments", "--store", store, "--read-timeout", "-1s"}, "--read-timeout"},
		{[]string{"payments", "--store", store, "--idle-timeout", "0s"}, "--idle-timeout"},
		{[]string{"payments", "--store", store, "--max-header-bytes", "100"}, "--max-header-bytes"},
		{[]string{"payments", "--store", store, "stray"}, "stray"},
		{[]string{"processor", "--store", "redis://127.0.0.1:6379"}, "SQL database"},
		{[]string{"processor", "--store", store, "--fail-rate", "1.5"}, "--fail-rate"},
		{[]string{"processor", "--store", store, "--lost-reply-rate", "-0.1"}, "--lost-reply-rate"},
		{[]string{"processor", "--store", store, "--lost-reply-rate", "NaN"}, "--lost-reply-rate"},
		{[]string{"processor", "--store", store, "--latency", "-1s"}, "--latency"},
		{[]string{"processor", "--store", store, "--ttl", "1s", "--lock-timeout", "1s"}, "--ttl"},
		{[]string{"processor", "--store", store, "stray"}, "stray"},
		{[]string{"proxy", "--store", store}, "--upstream is required"},
		{[]string{"proxy", "--store", store, "--upstream", "127.0.0.1:3000"}, "--upstream"},
		{[]string{"proxy", "--store", store, "--upstream", "ftp://h:1"}, "--upstream"},
		{[]string{"proxy", "--store", store, "--upstream", "http://u:secret@h:1"}, "--upstream"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1/?a=1"}, "--upstream"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--on-lapse", "retry"}, "on-lapse"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--require-key", "POST v1"}, "--require-key"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--require-key", "POST /a/{x}", "--require-key", "POST /{y}/b"}, "--require-key"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--scope-header", "X Y"}, "--scope-header"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--key-header", ""}, "--key-header"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--methods", "PO ST"}, "--methods"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--max-stored-body", "0"}, "--max-stored-body"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--max-body-bytes", "-1"}, "--max-body-bytes"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--upstream-timeout", "0s"}, "--upstream-timeout"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--health-path", "healthz"}, "--health-path"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--ttl", "10s"}, "--ttl (10s) must be longer than --lock-timeout (30s)"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "--read-timeout", "0s"}, "--read-timeout"},
		{[]string{"proxy", "--store", "redis"}, "no scheme"},
		{[]string{"proxy", "--store", store, "--upstream", "http://h:1", "stray"}, "stray"},
		{[]string{"migrate"}, "--store is required"},
		{[]string{"migrate", "--store", "mysql:x"}, "want mysql://"},
		{[]string{"payments", "--store", "mysql://u:secret@127.0.0.1:3306/app"}, "--db is required with a MySQL store"},
		{[]string{"payments", "--store", store, "--db", "mysql://u:secret@127.0.0.1:3306/app"}, "SQLite and PostgreSQL schemas only"},
		{[]string{"migrate", "--bogus"}, "bogus"},
		{[]string{"migrate", "--store", store, "stray"}, "stray"},
		{[]string{"purge"}, "--store is required"},
		{[]string{"purge", "--bogus"}, "bogus"},
		{[]string{"purge", "--store", "nosuch://x"}, "nosuch"},
		{[]string{"purge", "--store", "postgres://u:secret@h:notaport/db"}, "--store"},
		{[]string{"purge", "--store", store, "--older-than", "-1h"}, "--older-than"},
		{[]string{"purge", "--store", store, "--older-than", "yesterday"}, "older-than"},
	}
	for _, tc := range cases {
		code, _, stderr := runCmd(t, tc.args...)
		lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
		if code != exitUsage || len(lines) != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("idem %s: exit %d, stderr %q; want exit 2 and one line naming %q", strings.Join(tc.args, " "), code, stderr, tc.want)
		}
		if strings.Contains(stderr, "secret") {
			t.Errorf("idem %s: the error shows the password: %q", strings.Join(tc.args, " "), stderr)
		}
	}
}

func TestUnknownCommandPrintsUsageWithExitStatus2(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"load-test"}, {}} {
		code, _, stderr := runCmd(t, args...)
		if code != exitUsage || !strings.Contains(stderr, "usage: idem") {
			t.Errorf("idem %v: exit %d, stderr %q", args, code, stderr)
		}
	}
}

func TestHelpExplainsEveryFlag(t *testing.T) {
	t.Parallel()
	for cmd, flags := range map[string][]string{
		"payments": {"addr", "store", "db", "ttl", "retention", "lock-timeout", "processor-latency", "profile", "disable-idempotency", "log-format", "log-level",
			"store-timeout", "migrate-timeout", "read-header-timeout", "read-timeout", "idle-timeout", "max-header-bytes", "metrics-addr",
			"processor-url", "processor-timeout", "completer-interval", "unfinished-warn-after", "charge-on-lapse"},
		"proxy": {"addr", "upstream", "store", "scope-header", "key-header", "methods", "require-key", "upstream-key-header",
			"on-lapse", "in-flight-wait", "max-body-bytes", "max-stored-body", "stored-header", "upstream-timeout",
			"upstream-idle-timeout", "health-path", "upstream-health-path", "ttl", "retention", "lock-timeout", "profile",
			"replay-cache", "store-timeout", "migrate-timeout", "read-header-timeout", "read-timeout", "idle-timeout",
			"max-header-bytes", "metrics-addr", "log-format", "log-level", "access-log", "shutdown-grace", "auth-url", "auth-header",
			"auth-principal-header", "auth-timeout", "max-buffered-bodies", "max-buffered-bodies-per-client", "client-address-header",
			"min-upload-rate", "max-in-flight-per-principal", "max-stored-bytes-per-principal", "quota-window"},
		"processor":   {"addr", "store", "latency", "fail-rate", "lost-reply-rate", "ttl", "lock-timeout", "store-timeout", "log-format", "log-level"},
		"migrate":     {"store", "create"},
		"purge":       {"store", "older-than"},
		"keys get":    {"store", "scope", "token", "key", "body", "json"},
		"keys list":   {"store", "scope", "token", "state", "limit", "after", "json"},
		"keys delete": {"store", "scope", "token", "key", "all", "force", "abandon", "json"},
	} {
		code, stdout, _ := runCmd(t, append(strings.Fields(cmd), "--help")...)
		if code != exitOK {
			t.Errorf("idem %s --help: exit %d", cmd, code)
		}
		for _, f := range flags {
			// The flag, then its environment variable on the same line.
			if !regexp.MustCompile(`(?m)^  --` + f + `( \S+)?   \[\$` + envName(f) + `\]$`).MatchString(stdout) {
				t.Errorf("idem %s --help does not explain --%s with its variable %s:\n%s", cmd, f, envName(f), stdout)
			}
		}
	}
}

func TestMigrateAndPurgeOnRedisSayThereIsNothingToDo(t *testing.T) {
	t.Parallel()
	url := testenv.RedisURL(t)
	for _, cmd := range []string{"migrate", "purge"} {
		code, stdout, stderr := runCmd(t, cmd, "--store", url)
		if cmd == "migrate" { // then the store's state (SPEC §20)
			stdout, _, _ = strings.Cut(stdout, "\n")
			stdout += "\n"
		}
		if code != exitOK || strings.Count(stdout, "\n") != 1 || stderr != "" {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want exit 0 and one line", cmd, code, stdout, stderr)
		}
		for _, want := range []string{"nothing to " + cmd, "no schema", "TTL"} {
			if !strings.Contains(stdout, want) {
				t.Errorf("%s says %q, want it to mention %q", cmd, stdout, want)
			}
		}
	}
}

func TestMigrateOnUnreachableRedisFailsWithOneLine(t *testing.T) {
	t.Parallel()
	// Port 1 refuses at once; max_retries=-1 keeps go-redis from retrying.
	code, stdout, stderr := runCmd(t, "migrate", "--store", "redis://u:secret@127.0.0.1:1/0?max_retries=-1&dial_timeout=1s")
	if code != exitFailure || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "does not answer") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and one line saying Redis does not answer", code, stdout, stderr)
	}
	if strings.Contains(stderr, "secret") {
		t.Fatalf("the error shows the password: %q", stderr)
	}
}

// A private Redis without persistence: idem payments warns about it once, before its
// start line, and then serves charges with the data in the --db database.
func TestPaymentsOnRedisWarnsOnceAboutDurabilityAndServes(t *testing.T) {
	t.Parallel()
	rs := redistest.StartServer(t)
	db := "sqlite:" + filepath.Join(t.TempDir(), "pay.db")
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	lines, exit := startPayments(ctx, "--addr", "127.0.0.1:0", "--store", rs.URL(), "--db", db)
	var warnings []string
	var m []string
	for m == nil && lines.Scan() {
		if m = listeningLine.FindStringSubmatch(lines.Text()); m == nil {
			warnings = append(warnings, lines.Text())
		}
	}
	if m == nil {
		t.Fatalf("no start line; logged %q; exit %d", warnings, <-exit)
	}
	go func() {
		for lines.Scan() {
		}
	}()
	if m[2] != rs.URL() || m[3] != db {
		t.Fatalf("start line names store %q and db %q", m[2], m[3])
	}
	if len(warnings) == 0 {
		t.Fatal("no durability warning for a Redis without persistence")
	}
	seen := map[string]bool{}
	for _, w := range warnings {
		if !strings.HasPrefix(w, "level=WARN") || !strings.Contains(w, "redis store") || seen[w] {
			t.Errorf("before the start line, want each durability warning once; got %q", warnings)
		}
		seen[w] = true
	}

	postCharge(t, "http://"+m[1], "key-redis-test-1")
	cancel()
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d after shutdown", code)
	}
}

func TestMigrateAndPurgeReportWhatTheyDid(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	store := "sqlite:" + path
	code, stdout, stderr := runCmd(t, "migrate", "--create", "--store", store)
	if code != exitOK || !strings.Contains(stdout, "migrated") {
		t.Fatalf("migrate: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	// Two records that expired 47 hours ago, and a live one.
	ctx := testenv.Context(t)
	st, err := sqlite.Open(ctx, path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-48 * time.Hour)
	for i, now := range []time.Time{past, past, {}} {
		_, err := st.RecordClaim(ctx, &idemstore.ClaimParams{Scope: "s", Key: fmt.Sprintf("key-%08d", i), Token: "tok",
			RecordID: fmt.Sprint(i), Lease: time.Second, TTL: time.Hour, Now: now})
		if err != nil {
			t.Fatal(err)
		}
	}
	_ = st.Close()

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--older-than", "100h"}, "purged 0 records\n"},
		{nil, "purged 2 records\n"},
		{nil, "purged 0 records\n"},
	} {
		code, stdout, stderr := runCmd(t, append([]string{"purge", "--store", store}, tc.args...)...)
		if code != exitOK || stdout != tc.want {
			t.Fatalf("purge %v: exit %d, stdout %q (want %q), stderr %q", tc.args, code, stdout, tc.want, stderr)
		}
	}
}

var listeningLine = regexp.MustCompile(`^level=INFO msg="idem payments listening" addr=(127\.0\.0\.1:\d+) store=(\S+) db=(\S+) profile=seed idempotency=on( replication=[a-z]+( pooler=true)?)?$`)

func TestPaymentsLogsOneLineServesAndStopsGracefully(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	lines, exit := startPayments(ctx, "--addr", "127.0.0.1:0", "--store", store)
	if !lines.Scan() {
		t.Fatalf("no start line; exit %d", <-exit)
	}
	m := listeningLine.FindStringSubmatch(lines.Text())
	if m == nil || m[2] != store || m[3] != store {
		t.Fatalf("start line %q", lines.Text())
	}
	rest := restOfLines(lines)

	base := "http://" + m[1]
	postCharge(t, base, "key-start-test-1")
	// Without --metrics-addr no metrics are served, and never on the API's listener.
	if status, _ := get(t, base+"/metrics"); status != http.StatusNotFound {
		t.Fatalf("GET /metrics on the API listener: %d, want 404", status)
	}

	cancel() // SIGINT/SIGTERM
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d after shutdown", code)
	}
	if more := <-rest; len(more) != 1 || !strings.Contains(more[0], "stopped") {
		t.Fatalf("after the start line the command logged %q, want only the stop line", more)
	}
}

func TestParseStoreURL(t *testing.T) {
	t.Parallel()
	cases := []struct {
		raw      string
		kind     storeKind
		path     string
		redacted string
		err      string
	}{
		{raw: "sqlite:idem.db", kind: kindSQLite, path: "idem.db"},
		{raw: "sqlite:/var/lib/idem.db", kind: kindSQLite, path: "/var/lib/idem.db"},
		{raw: "sqlite://idem.db", kind: kindSQLite, path: "idem.db"},
		{raw: "sqlite:///var/lib/idem.db", kind: kindSQLite, path: "/var/lib/idem.db"},
		{raw: "SQLite:x.db", kind: kindSQLite, path: "x.db"},
		{raw: "sqlite:file:x.db?cache=private", kind: kindSQLite, path: "file:x.db?cache=private"},
		{raw: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", kind: kindPostgres},
		{raw: "postgresql://u:pw@db.example/app", kind: kindPostgres, redacted: "postgresql://u:xxxxx@db.example/app"},
		{raw: "redis://127.0.0.1:6379/0", kind: kindRedis},
		{raw: "rediss://u:pw@cache:6380", kind: kindRedis, redacted: "rediss://u:xxxxx@cache:6380"},
		{raw: "redis+cluster://n1:7000?addr=n2:7000", kind: kindRedis},
		{raw: "redis+sentinel://s1:26379,s2:26379/0?master=orders", kind: kindRedis},
		{raw: "rediss+sentinel://u:pw@s1:26379,s2:26379/0?master=orders&sentinel_password=pw2&wait_replicas=1", kind: kindRedis,
			redacted: "rediss+sentinel://u:xxxxx@s1:26379,s2:26379/0?master=orders&sentinel_password=xxxxx&wait_replicas=1"},
		{raw: "redis+sentinel://u:pw@s1,s2/0", err: "no master name"},
		{raw: "redis+sentinel://u:pw@s1:26379/0?master=m&wait_replicas=lots", err: "wait_replicas"},
		{raw: "sqlite:", err: "no path"},
		{raw: "sqlite://", err: "no path"},
		{raw: "idem.db", err: "no scheme"},
		{raw: "", err: "no scheme"},
		{raw: "postgres:db", err: "want postgres://"},
		{raw: "postgres://u:pw@host:port/db", err: "xxxxx"},
		{raw: "mysql://u:pw@h/db", kind: kindMySQL, redacted: "mysql://u:xxxxx@h/db"},
		{raw: "mysql://root@127.0.0.1:3306/test?tls=false", kind: kindMySQL},
		{raw: "mysql:db", err: "want mysql://"},
		{raw: "mysql://u:pw@h/db?timeout=soon", err: "xxxxx"},
		{raw: "mariadb://u:pw@h/db", err: `unsupported scheme "mariadb"`},
	}
	for _, tc := range cases {
		u, err := parseStoreURL(tc.raw)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), ":pw@") {
				t.Errorf("parseStoreURL(%q) = %v, want an error containing %q (and no password)", tc.raw, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseStoreURL(%q): %v", tc.raw, err)
			continue
		}
		redacted := tc.redacted
		if redacted == "" {
			redacted = tc.raw
		}
		if u.kind != tc.kind || u.path != tc.path || u.String() != redacted {
			t.Errorf("parseStoreURL(%q) = kind %d path %q shown %q; want kind %d path %q shown %q", tc.raw, u.kind, u.path, u, tc.kind, tc.path, redacted)
		}
	}
}

// Passwords of store URLs never reach the output (SPEC §15), on any path that prints a
// URL: the start line, migrate, purge and their errors. Every password here is
// "secret"; the PostgreSQL test server trusts, so it ignores them.
func TestNoPathPrintsAPasswordOfAStoreURL(t *testing.T) {
	t.Parallel()
	rs := redistest.StartServer(t, "--requirepass", "secret")
	redisURL := "redis://:secret@" + rs.Addr() + "/0"
	sqliteURL := "sqlite:file:" + filepath.Join(t.TempDir(), "idem.db") + "?password=secret&_pragma=busy_timeout(5000)"
	noSecret := func(what, out string) {
		t.Helper()
		if strings.Contains(out, "secret") {
			t.Errorf("%s shows a password: %q", what, out)
		}
	}

	t.Run("start line", func(t *testing.T) {
		line := paymentsStartLine(t, "--store", redisURL, "--db", sqliteURL)
		noSecret("the start line", line)
		for _, want := range []string{"store=redis://:xxxxx@", "password=xxxxx&_pragma"} {
			if !strings.Contains(line, want) {
				t.Errorf("start line %q lacks %q", line, want)
			}
		}
	})
	t.Run("start line on PostgreSQL", func(t *testing.T) {
		dbURL, schema := pgtest.Schema(t)
		u, err := url.Parse(pgtest.SearchPathURL(t, dbURL, schema))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(u.User.Username(), "secret")
		u.RawQuery += "&password=secret&sslpassword=secret"
		line := paymentsStartLine(t, "--store", u.String())
		noSecret("the start line", line)
		if !strings.Contains(line, ":xxxxx@") || !strings.Contains(line, "&password=xxxxx&sslpassword=xxxxx") {
			t.Errorf("start line %q does not show the URL redacted", line)
		}
	})
	t.Run("migrate and purge", func(t *testing.T) {
		if code, _, stderr := runCmd(t, "migrate", "--create", "--store", sqliteURL); code != exitOK {
			t.Fatalf("migrate --create: exit %d, stderr %q", code, stderr)
		}
		for _, store := range []string{sqliteURL, redisURL} {
			for _, cmd := range []string{"migrate", "purge"} {
				code, stdout, stderr := runCmd(t, cmd, "--store", store)
				if code != exitOK {
					t.Errorf("%s --store %s: exit %d, stderr %q", cmd, redact(store), code, stderr)
				}
				noSecret(cmd+"'s output", stdout+stderr)
			}
		}
		if _, stdout, _ := runCmd(t, "migrate", "--store", sqliteURL); !strings.Contains(stdout, "password=xxxxx") {
			t.Errorf("migrate says %q, want the URL with its password redacted", stdout)
		}
	})
	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			code int
		}{
			// Bad URLs: exit 2, as issue 12 asked of the bad port.
			{[]string{"migrate", "--store", "redis://:secret@127.0.0.1:abc/0"}, exitUsage},
			{[]string{"purge", "--store", "redis://:secret@127.0.0.1:6379/0?bogus=1"}, exitUsage},
			{[]string{"migrate", "--store", "redis://127.0.0.1:6379/0?password=secret"}, exitUsage},
			{[]string{"migrate", "--store", "rediss+cluster://:secret@127.0.0.1:7000?addr=nonsense"}, exitUsage},
			{[]string{"payments", "--store", "redis+cluster://:secret@127.0.0.1:abc", "--db", sqliteURL}, exitUsage},
			{[]string{"migrate", "--store", "redis+sentinel://:secret@127.0.0.1:26379/0?sentinel_password=secret"}, exitUsage},
			{[]string{"keys", "get", "--store", "rediss+sentinel://:secret@s1,s2:abc/0?master=m", "--scope", "s", "--key", "k"}, exitUsage},
			{[]string{"payments", "--store", "redis+sentinel://:secret@s1/0?master=m&password=secret", "--db", sqliteURL}, exitUsage},
			{[]string{"payments", "--store", "postgres://u:secret@127.0.0.1:5432/db?password=secret&pool_max_conns=x"}, exitUsage},
			{[]string{"payments", "--store", "postgresql://u:secret@h/db?sslpassword=secret&pool_min_conns=y"}, exitUsage},
			{[]string{"payments", "--store", sqliteURL, "--db", "postgres://u:secret@127.0.0.1:notaport/db"}, exitUsage},
			{[]string{"payments", "--store", "mysql://u:secret@h/db?password=secret"}, exitUsage},
			{[]string{"payments", "--store", "u:secret@h/db?password=secret"}, exitUsage},
			// Stores that do not answer: exit 1.
			{[]string{"migrate", "--store", "redis://:secret@127.0.0.1:1/0?max_retries=-1&dial_timeout=1s"}, exitFailure},
			{[]string{"purge", "--store", "postgres://u:secret@127.0.0.1:1/db?password=secret&connect_timeout=2"}, exitFailure},
		} {
			code, stdout, stderr := runCmd(t, tc.args...)
			if code != tc.code || stdout != "" || strings.Count(stderr, "\n") != 1 {
				t.Errorf("idem %s: exit %d, stdout %q, stderr %q; want exit %d and one line on stderr",
					redact(strings.Join(tc.args, " ")), code, stdout, stderr, tc.code)
			}
			noSecret("the error", stderr)
		}
	})
}

// paymentsStartLine runs idem payments with args until it logs its start line, returns
// that line, and stops it at cleanup.
func paymentsStartLine(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(testenv.Context(t))
	pr, pw := io.Pipe()
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, append([]string{"payments", "--addr", "127.0.0.1:0"}, args...), io.Discard, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		<-exit
	})
	lines := bufio.NewScanner(pr)
	var before []string
	for lines.Scan() {
		if listeningLine.MatchString(lines.Text()) {
			go func() { _, _ = io.Copy(io.Discard, pr) }()
			return lines.Text()
		}
		before = append(before, lines.Text())
	}
	t.Fatalf("no start line; logged %q", before)
	return ""
}

// The commands that inspect or maintain a store refuse an SQLite file that does not
// exist with one line and exit status 1, and create nothing: a mistyped path must not
// look like an empty store. migrate --create makes a new one.
func TestToolsRefuseAMissingSQLiteFileAndCreateNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	typo := "sqlite:" + filepath.Join(dir, "idme.db")
	for _, args := range [][]string{
		{"migrate", "--store", typo},
		{"purge", "--store", typo},
		{"keys", "get", "--store", typo, "--scope", "s", "--key", "key-00000001"},
		{"keys", "list", "--store", typo},
		{"keys", "delete", "--store", typo, "--scope", "s", "--all"},
		{"keys", "resolve", "--store", typo, "--scope", "s", "--key", "key-00000001", "--release"},
	} {
		code, stdout, stderr := runCmd(t, args...)
		if code != exitFailure || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "does not exist") {
			t.Errorf("idem %s: exit %d, stdout %q, stderr %q; want exit 1 and one line saying the file does not exist",
				strings.Join(args, " "), code, stdout, stderr)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Fatalf("the refused commands created %v", entries)
	}
	if _, _, stderr := runCmd(t, "migrate", "--store", typo); !strings.Contains(stderr, "--create") {
		t.Errorf("migrate's refusal %q does not name --create", stderr)
	}
	if code, stdout, stderr := runCmd(t, "migrate", "--create", "--store", typo); code != exitOK || !strings.Contains(stdout, "migrated") {
		t.Fatalf("migrate --create: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, stdout, stderr := runCmd(t, "purge", "--store", typo); code != exitOK || stdout != "purged 0 records\n" {
		t.Fatalf("purge after migrate --create: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// A migration at start that cannot finish (here: another process holds the migration
// lock and never lets go) ends the start with one line naming --migrate-timeout and
// exit status 1, instead of hanging; on SQLite (the file's write lock) and on
// PostgreSQL (the migration's advisory lock).
func TestPaymentsExitsWhenItsMigrationCannotFinish(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		// hold takes the lock and returns the --store URL.
		hold func(t *testing.T) string
	}{
		{"sqlite", func(t *testing.T) string {
			store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
			mustRun(t, exitOK, "migrate", "--create", "--store", store)
			db, err := sql.Open("sqlite", strings.TrimPrefix(store, "sqlite:"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			conn, err := db.Conn(testenv.Context(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			if _, err := conn.ExecContext(testenv.Context(t), "BEGIN IMMEDIATE"); err != nil {
				t.Fatal(err)
			}
			return store
		}},
		{"postgres", func(t *testing.T) string {
			dbURL, schema := pgtest.Schema(t)
			conn, err := pgx.Connect(testenv.Context(t), dbURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			if _, err := conn.Exec(testenv.Context(t), "SELECT pg_advisory_lock(hashtextextended($1, 0))", "idem/postgres migrate "+schema); err != nil {
				t.Fatal(err)
			}
			return pgtest.SearchPathURL(t, dbURL, schema)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			store := tc.hold(t)
			start := time.Now()
			code, stdout, stderr := runCmd(t, "payments", "--addr", "127.0.0.1:0", "--store", store, "--migrate-timeout", timeout.String())
			elapsed := time.Since(start)
			if code != exitFailure || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "--migrate-timeout") {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 1 and one line naming --migrate-timeout", code, stdout, stderr)
			}
			// SQLite waits one busy_timeout (5 s) at most past the deadline.
			if elapsed > timeout+10*time.Second {
				t.Fatalf("the start gave up after %v, want about --migrate-timeout (%v)", elapsed, timeout)
			}
			t.Logf("%s after %v", strings.TrimSpace(stderr), elapsed.Round(time.Millisecond))
		})
	}
}

func TestVersionPrintsTheBuildsVersionAndGo(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"version", "--version"} {
		code, stdout, _ := runCmd(t, arg)
		if code != exitOK || !regexp.MustCompile(`^idem \S+ .*`+regexp.QuoteMeta(runtime.Version())+"\n$").MatchString(stdout) {
			t.Errorf("idem %s: exit %d, stdout %q", arg, code, stdout)
		}
	}
	if code, _, stderr := runCmd(t, "version", "extra"); code != exitUsage || !strings.Contains(stderr, "takes no arguments") {
		t.Errorf("idem version extra: exit %d, stderr %q", code, stderr)
	}
}
