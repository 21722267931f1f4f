package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/check"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/memory"
)

// addrAttr finds the API's address in idem payments' start line.
var addrAttr = regexp.MustCompile(`msg="idem payments listening" addr=(127\.0\.0\.1:\d+) `)

// servePayments runs `idem payments args…` in-process on a free port and a fresh
// SQLite file until t ends, and returns its base URL.
func servePayments(t *testing.T, args ...string) string {
	t.Helper()
	return serveCommand(t, addrAttr, append([]string{"payments"}, args...)...)
}

// serveCommand runs `idem args… --addr 127.0.0.1:0 --store sqlite:…` in-process until
// t ends, and returns the base URL that its start line says, found by start's first
// group.
func serveCommand(t *testing.T, start *regexp.Regexp, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(testenv.Context(t))
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	lines, exit := startCommand(ctx, append(args, "--addr", "127.0.0.1:0", "--store", store)...)
	if !lines.Scan() {
		cancel()
		t.Fatalf("idem %s wrote no start line; exit %d", args[0], <-exit)
	}
	m := start.FindStringSubmatch(lines.Text())
	rest := restOfLines(lines)
	t.Cleanup(func() {
		cancel()
		<-exit
		<-rest
	})
	if m == nil {
		t.Fatalf("start line %q", lines.Text())
	}
	return "http://" + m[1]
}

// checkArgs are the arguments of `idem check` against the payments API at base.
func checkArgs(base string, more ...string) []string {
	return append([]string{"check", "--url", base + "/v1/charges", "--body", `{"amount": 2000, "currency": "usd"}`,
		"--header", "Authorization: Bearer sk_test_check_a", "--as-other", "Authorization: Bearer sk_test_check_b"}, more...)
}

func TestCheckPassesAgainstIdemPaymentsInBothProfiles(t *testing.T) {
	t.Parallel()
	for _, profile := range []string{"seed", "ietf"} {
		t.Run(profile, func(t *testing.T) {
			t.Parallel()
			base := servePayments(t, "--profile", profile)
			page := filepath.Join(t.TempDir(), "report.html")
			code, stdout, stderr := runCmd(t, checkArgs(base, "--profile", profile, "--html", page)...)
			if code != exitOK || stderr != "" {
				t.Fatalf("exit %d, stderr %q; want 0:\n%s", code, stderr, stdout)
			}
			// Every check passes but restart (no --between), after-5xx (--body-invalid
			// is answered 400) and patch (charges are not PATCHed), which skip.
			wantPassesButSkips(t, stdout)
			// The first request's charge, one per round of each kind of duplicates,
			// distinct-keys' one alone and 16 at once, one after the rejected body, one
			// of the other principal, safe-methods' write.
			if !strings.Contains(stdout, "11 pass, 0 fail, 3 skip · ") || !strings.Contains(stdout, "created 27 resources") {
				t.Errorf("the totals do not say 11 pass, 3 skip and 27 resources created:\n%s", stdout)
			}
			html, err := os.ReadFile(page)
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(html), `<details class="check"`); n != len(check.Checks()) {
				t.Errorf("the --html page has %d check blocks, want %d", n, len(check.Checks()))
			}
		})
	}
}

func TestCheckJSONGoesToStdoutAndTheTableToStderr(t *testing.T) {
	t.Parallel()
	base := servePayments(t)
	code, stdout, stderr := runCmd(t, checkArgs(base, "--json", "--concurrency", "4", "--rounds", "2")...)
	if code != exitOK {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	var rep check.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, stdout)
	}
	// 1 + 2 + 2 rounds + 1 alone and 4 distinct keys + 3.
	if len(rep.Checks) != len(check.Checks()) || rep.Failed() || rep.Concurrency != 4 || rep.Rounds != 2 || rep.Created != 13 {
		t.Errorf("JSON report: %d checks, failed %v, concurrency %d, %d rounds, created %d; want 4, 2 rounds and 13 created", len(rep.Checks), rep.Failed(), rep.Concurrency, rep.Rounds, rep.Created)
	}
	if c := rep.Counts; c[check.StatusPass] != 11 || c[check.StatusSkip] != 3 || c[check.StatusFail] != 0 || c[check.StatusWarn] != 0 || rep.ExitStatus != exitOK {
		t.Errorf("JSON report: counts %v, exit_status %d; want 11 pass, 3 skip and 0; the table:\n%s", c, rep.ExitStatus, stderr)
	}
	if !strings.Contains(stderr, "  PASS  replay ") || strings.Contains(stderr, "sk_test_check") {
		t.Errorf("stderr is not the table, or shows a token:\n%s", stderr)
	}
}

// A refusal with the other profile's status is a warning that names it, not a
// failure.
func TestCheckWarnsOfARefusalWithAnotherProfilesStatus(t *testing.T) {
	t.Parallel()
	base := servePayments(t) // profile seed: a changed body is 409, not the IETF's 422
	code, stdout, _ := runCmd(t, checkArgs(base, "--profile", "ietf")...)
	if code != exitOK {
		t.Fatalf("exit %d, want 0:\n%s", code, stdout)
	}
	for _, s := range []string{
		"  WARN  changed-body           refused, with 409 key_reused, where profile ietf answers 422 (409 is profile seed's answer: --profile seed)",
		"10 pass, 1 warn, 0 fail, 3 skip",
		"WARN changed-body: ",
		"  the same key with --body-alt\n    → POST " + base + `/v1/charges  Idempotency-Key: `,
		"[35 bytes sha256:", // the body, without --include-bodies
		"    ← 409  Content-Type: application/json  key_reused  [",
	} {
		if !strings.Contains(stdout, s) {
			t.Errorf("the report lacks %q:\n%s", s, stdout)
		}
	}
}

// An endpoint that ignores the key (or a wrong --key-header) fails replay, and the
// checker stops there with a hint instead of creating dozens of resources.
func TestCheckExitsOneAndStopsWithAHintWhenTheKeyIsIgnored(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			w.WriteHeader(http.StatusCreated)
		}
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n.Add(1))
	}))
	t.Cleanup(srv.Close)
	code, stdout, stderr := runCmd(t, checkArgs(srv.URL, "--json", "--key-header", "X-Idempotency-Key")...)
	if code != exitFailure {
		t.Fatalf("exit %d, want 1:\n%s", code, stderr)
	}
	var rep check.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.ExitStatus != exitFailure || rep.Counts[check.StatusFail] != 1 || rep.Counts[check.StatusSkip] != len(check.Checks())-1 || rep.Created != 2 {
		t.Errorf("exit_status %d, counts %v, created %d; want 1, replay failed and every other check skipped, 2 created", rep.ExitStatus, rep.Counts, rep.Created)
	}
	for _, s := range []string{"  FAIL  replay ", "the request ran twice", "hint: the endpoint ran a retry with the same X-Idempotency-Key again, as if it ignored the key: is --key-header X-Idempotency-Key the header it reads?"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("the table lacks %q:\n%s", s, stderr)
		}
	}
}

func TestCheckFlagErrorsAreOneLineWithExitStatus2(t *testing.T) {
	t.Parallel()
	body := []string{"--body", `{"amount": 1}`}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"check"}, "--url is required"},
		{[]string{"check", "--url", "localhost:8080/v1/charges"}, "--url"},
		{[]string{"check", "--url", "http://127.0.0.1:1/v1/charges"}, "--body is required"},
		{append([]string{"check", "--url", "http://h/x", "--method", "GET"}, body...), "--method GET is safe"},
		{append([]string{"check", "--url", "http://h/x", "--method", "PO ST"}, body...), "--method"},
		{append([]string{"check", "--url", "http://h/x", "--concurrency", "1"}, body...), "--concurrency must be at least 2"},
		{append([]string{"check", "--url", "http://h/x", "--rounds", "0"}, body...), "--rounds must be at least 1"},
		{append([]string{"check", "--url", "http://h/x", "--url", "h2:8080/x"}, body...), "--url"},
		{append([]string{"check", "--url", "http://h/x", "--profile", "rfc"}, body...), "--profile"},
		{append([]string{"check", "--url", "http://h/x", "--timeout", "0s"}, body...), "--timeout"},
		{append([]string{"check", "--url", "http://h/x", "--key-header", "Idem Key"}, body...), "--key-header"},
		{[]string{"check", "--url", "http://h/x", "--body", `{"currency": "usd"}`}, "give --body-alt"},
		{append([]string{"check", "--url", "http://h/x", "--body-alt", "@/nonexistent/alt.json"}, body...), "--body-alt"},
		{append([]string{"check", "--url", "http://h/x", "--header", "Authorization Bearer sk_live_secret"}, body...), "--header (the 1st one): want 'Name: value'"},
		{append([]string{"check", "--url", "http://h/x", "--as-other", "X: 1", "--as-other", ": 2"}, body...), "--as-other (the 2nd one)"},
		{append([]string{"check", "--url", "http://h/x", "--only", "replay,keyles"}, body...), `--only: unknown check "keyles"; the checks are replay, concurrent-duplicates,`},
		{append([]string{"check", "--url", "http://h/x", "--skip", "restart", "--skip", "bad_keys"}, body...), `--skip: unknown check "bad_keys"`},
		{append([]string{"check", "--url", "http://127.0.0.1:1/v1/charges", "--baseline", "/nonexistent/baseline.json"}, body...), "--baseline: open /nonexistent/baseline.json"},
		// An endpoint that cannot be reached cannot be checked.
		{append([]string{"check", "--url", "http://127.0.0.1:1/v1/charges"}, body...), "endpoint cannot be checked: POST http://127.0.0.1:1/v1/charges"},
	}
	for _, c := range cases {
		code, stdout, stderr := runCmd(t, c.args...)
		if code != exitUsage || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("idem %v: exit %d, stdout %q, stderr %q; want exit 2 and one line naming %s", c.args, code, stdout, stderr, c.want)
		}
		if strings.Contains(stderr, "sk_live_secret") {
			t.Errorf("idem %v: the error shows the header's value: %q", c.args, stderr)
		}
	}
}

func TestCheckHelpDocumentsEveryFlagAndCheck(t *testing.T) {
	t.Parallel()
	code, stdout, _ := runCmd(t, "check", "--help")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	flags := []string{"url", "method", "body", "header", "body-alt", "body-invalid", "body-5xx", "patch-body", "fixed-bodies", "key-header", "concurrency", "rounds", "profile", "between", "as-other", "timeout", "only", "skip", "baseline", "json", "html", "junit", "include-bodies"}
	for _, f := range flags {
		if !strings.Contains(stdout, "\n  --"+f+" ") {
			t.Errorf("idem check --help does not explain --%s:\n%s", f, stdout)
		}
	}
	if n := strings.Count(stdout, "\n  --"); n != len(flags) {
		t.Errorf("idem check --help lists %d flags, the test knows %d: document the new one here", n, len(flags))
	}
	for _, c := range check.Checks() {
		if !strings.Contains(stdout, "\n  "+c.Name+" ") {
			t.Errorf("idem check --help does not explain the check %s", c.Name)
		}
	}
	for _, s := range []string{"Exit status: 0", "seed", "ietf", "stripe", "@FILE", "IDEM_AS_OTHER", "PASS", "WARN", "FAIL", "SKIP", "refused, with 417", "--key-header", "baseline", "JUnit", "100 ms doubling to 2 s", "the server's lease looks longer",
		"per-principal fails wherever another principal gets the first\nprincipal's response", "IDEM_CHECK_", "a replay with 409", "27 with the defaults"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("idem check --help does not mention %q", s)
		}
	}
}

// A variable that starts with IDEM_CHECK_ and is no flag's is an error, as an unknown
// flag is (exit 2, one line naming it and the variable it most likely misspells); any
// other unknown variable is ignored without a word, and so are the variables the
// checker gives --between's command.
func TestCheckRefusesUnknownCheckVariablesAndIgnoresOthers(t *testing.T) {
	args := []string{"check", "--url", "http://127.0.0.1:1/v1/charges", "--body", `{"amount": 1}`}
	t.Setenv("IDEM_CHECK_TIMEOUTS", "5s")
	code, stdout, stderr := runCmd(t, args...)
	if code != exitUsage || stdout != "" || stderr != "idem check: IDEM_CHECK_TIMEOUTS is not a variable of idem check (did you mean IDEM_TIMEOUT?); its flags' variables are IDEM_ and the flag's name (--help)\n" {
		t.Errorf("IDEM_CHECK_TIMEOUTS: exit %d, stdout %q, stderr %q; want exit 2 and one line naming it", code, stdout, stderr)
	}
	t.Setenv("IDEM_CHECK_TIMEOUTS", "")
	t.Setenv("IDEM_CHECK_KEY", "k")
	t.Setenv("IDEM_TTLL", "1h")
	t.Setenv("IDEM_SOMETHING_ELSE", "x")
	code, _, stderr = runCmd(t, args...)
	if code != exitUsage || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "endpoint cannot be checked") {
		t.Errorf("unknown variables: exit %d, stderr %q; want them ignored (the endpoint's error alone)", code, stderr)
	}
}

// chargesUpstream is a charges API without any key support of its own: POST
// /v1/charges makes a charge (201 with Location; 400 for a body that is not one), GET
// /v1/charges lists the caller's.
func chargesUpstream(t *testing.T) string {
	var (
		mu      sync.Mutex
		n       int
		charges = map[string][]json.RawMessage{}
	)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path != "/v1/charges":
			http.Error(w, `{"error":{"code":"not_found"}}`, http.StatusNotFound)
		case r.Method == http.MethodGet:
			mu.Lock()
			list, _ := json.Marshal(charges[who])
			mu.Unlock()
			_, _ = w.Write(list)
		case r.Method != http.MethodPost:
			http.Error(w, `{"error":{"code":"method_not_allowed"}}`, http.StatusMethodNotAllowed)
		default:
			var p struct {
				Amount   int    `json:"amount"`
				Currency string `json:"currency"`
			}
			if json.NewDecoder(r.Body).Decode(&p) != nil || p.Amount <= 0 || len(p.Currency) != 3 {
				http.Error(w, `{"error":{"code":"parameter_invalid"}}`, http.StatusBadRequest)
				return
			}
			mu.Lock()
			n++
			c, _ := json.Marshal(map[string]any{"id": fmt.Sprintf("ch_%d", n), "amount": p.Amount, "currency": p.Currency})
			charges[who] = append(charges[who], c)
			mu.Unlock()
			w.Header().Set("Location", fmt.Sprintf("/v1/charges/ch_%d", n))
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(c)
		}
	}))
	t.Cleanup(up.Close)
	return up.URL
}

// idem proxy in front of an API without key support passes every check (restart
// is skipped: no --between), in the checker's default rounds of real bursts.
func TestCheckPassesAgainstIdemProxy(t *testing.T) {
	t.Parallel()
	base := serveCommand(t, proxyListeningLine, "proxy", "--upstream", chargesUpstream(t), "--require-key", "POST /v1/charges")
	code, stdout, stderr := runCmd(t, checkArgs(base)...)
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q; want 0:\n%s", code, stderr, stdout)
	}
	wantPassesButSkips(t, stdout)
}

// wantPassesButSkips fails t unless the table of stdout passes every check but
// restart (no --between), after-5xx (no 5xx to retry) and patch (PATCH not served),
// which skip.
func wantPassesButSkips(t *testing.T, stdout string) {
	t.Helper()
	skipped := []string{"after-5xx", "patch", "restart"}
	if n := strings.Count(stdout, "\n  PASS  "); n != len(check.Checks())-len(skipped) {
		t.Errorf("%d checks passed, want %d:\n%s", n, len(check.Checks())-len(skipped), stdout)
	}
	for _, name := range skipped {
		if !strings.Contains(stdout, "\n  SKIP  "+name+" ") {
			t.Errorf("%s not skipped:\n%s", name, stdout)
		}
	}
}

// keysSharedAcrossPrincipals serves a charges API behind idem's middleware whose
// scope is the same for every principal (per-principal fails); once getsNeedKeys is
// set, a GET with a key is refused (safe-methods fails too).
func keysSharedAcrossPrincipals(t *testing.T, getsNeedKeys *atomic.Bool) string {
	var n atomic.Int64
	mw := idem.New(idem.Config{
		Store: memory.New(), Logger: slog.New(slog.DiscardHandler),
		Scope: func(*http.Request) (string, error) { return "one scope for every principal", nil },
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p struct{ Amount int }
		if json.NewDecoder(r.Body).Decode(&p) != nil || p.Amount <= 0 {
			http.Error(w, `{"error":{"code":"parameter_invalid"}}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d","amount":%d}`, n.Add(1), p.Amount)
	})))
	mux.HandleFunc("GET /v1/charges", func(w http.ResponseWriter, r *http.Request) {
		if getsNeedKeys.Load() && r.Header.Get("Idempotency-Key") != "" {
			http.Error(w, "no keys on GET", http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, `{"count":%d}`, n.Load())
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// A run whose failures the baseline holds exits 0 and says they were accepted (in
// the table, the JSON and the JUnit file); a new failure exits 1 and is named.
func TestCheckBaselineExitsZeroOnKnownFailuresAndOneOnANewOne(t *testing.T) {
	t.Parallel()
	var getsNeedKeys atomic.Bool
	base := keysSharedAcrossPrincipals(t, &getsNeedKeys)
	dir := t.TempDir()
	baseline, junit := filepath.Join(dir, "baseline.json"), filepath.Join(dir, "report.xml")

	code, stdout, _ := runCmd(t, checkArgs(base, "--json", "--skip", "concurrent-duplicates")...)
	if code != exitFailure || !strings.Contains(stdout, `"per-principal"`) {
		t.Fatalf("the first run: exit %d, want 1 (per-principal)", code)
	}
	if err := os.WriteFile(baseline, []byte(stdout), 0o600); err != nil {
		t.Fatal(err)
	}

	code, stdout, stderr := runCmd(t, checkArgs(base, "--baseline", baseline, "--junit", junit, "--skip", "concurrent-duplicates")...)
	if code != exitOK {
		t.Fatalf("a known failure: exit %d, want 0:\n%s%s", code, stdout, stderr)
	}
	for _, s := range []string{"  FAIL  per-principal      (accepted by the baseline) the other principal got the first principal's response",
		"1 fail (1 accepted by the baseline)", "baseline " + baseline + ": 1 failure accepted (per-principal); no new failure"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("the report lacks %q:\n%s", s, stdout)
		}
	}
	xml, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(xml), `<testcase name="per-principal" classname="idem check"`) || !strings.Contains(string(xml), `<skipped message="accepted by the baseline: the other principal got`) || strings.Contains(string(xml), "<failure") {
		t.Errorf("the JUnit file does not show the accepted failure as skipped:\n%s", xml)
	}

	getsNeedKeys.Store(true)
	code, stdout, _ = runCmd(t, checkArgs(base, "--baseline", baseline, "--skip", "concurrent-duplicates")...)
	if code != exitFailure || !strings.Contains(stdout, "1 failure accepted (per-principal); 1 new (safe-methods)") {
		t.Errorf("a new failure: exit %d, want 1 naming safe-methods:\n%s", code, stdout)
	}
}

func TestCheckOnlyRunsTheNamedChecks(t *testing.T) {
	t.Parallel()
	base := servePayments(t)
	code, stdout, _ := runCmd(t, checkArgs(base, "--only", "keyless,replay", "--json")...)
	var rep check.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != exitOK {
		t.Fatalf("exit %d, %v", code, err)
	}
	if len(rep.Checks) != 2 || rep.Checks[0].Name != "replay" || rep.Checks[1].Name != "keyless" || rep.Checks[1].Status != check.StatusPass {
		t.Errorf("--only keyless,replay ran %+v", rep.Checks)
	}
}
