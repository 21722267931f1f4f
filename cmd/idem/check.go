package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem/internal/check"
)

const checkSynopsis = `--url URL [--url URL]... --body BODY [--method POST] [--header 'Name: value']...
                  [--body-alt BODY] [--body-invalid BODY] [--body-5xx BODY] [--patch-body BODY]
                  [--fixed-bodies] [--key-header Idempotency-Key]
                  [--concurrency 16] [--rounds 3] [--profile seed|ietf|stripe]
                  [--as-other 'Name: value']... [--between 'COMMAND'] [--timeout 10s]
                  [--only NAME,...] [--skip NAME,...] [--baseline FILE]
                  [--json] [--html FILE] [--junit FILE] [--include-bodies]

Checks from outside one endpoint's Idempotency-Key support against docs/spec.md, the
seed's rules and the IETF draft (SPEC §18), and prints one line per check:

  replay                 a retry with the same key and body gets the first answer
                         again, on every --url: the same status, body bytes and
                         stored headers (Content-Type, Location); a replay is known
                         by its content, whatever its status: one with 409 warns
  concurrent-duplicates  --rounds bursts of --concurrency requests with one fresh key
                         each, every connection (and TLS session) opened before the
                         requests are released together, spread over the --url
                         instances: each burst creates one resource (2xx answers
                         with identical bodies or ids); the others get an in-flight
                         answer (409, or 429/503 per profile) or the replay
  spread-duplicates      --rounds times, a fresh key's first request and
                         --concurrency duplicates sent one after another across its
                         whole execution and just after it: each gets an in-flight
                         answer or the replay, never an error or a second resource
  distinct-keys          --concurrency requests with distinct fresh keys at once all
                         run: a refusal (a lock over every key) fails, answers that
                         come one by one, one execution apart (a queue) warn
  changed-body           the same key with --body-alt is refused (409 seed, 422 ietf,
                         400 stripe), never answered with the first response, and the
                         first body still gets its first answer
  other-request          the used key with another method (DELETE), path (URL path
                         + /idem-check) or query (idem-check=other) is refused or
                         runs as a new request, never answered with the first response
  errors-not-stored      --body-invalid is rejected, then --body with the same key
                         succeeds: a rejection is not stored
  after-5xx              --body-5xx (or --body-invalid, where it gets a 5xx) with a
                         fresh key, then the same request again: the retry gets a
                         final answer, not an in-flight one (the key was not left held)
  bad-keys               a missing, empty, 256-character or malformed key (a list, two
                         fields) is refused with 400, or keys are reported optional
  keyless                two identical requests without a key, and two with an empty
                         one, and such requests differing by body (--body-alt) and by
                         principal (--as-other), are never one resource nor refused
                         as a reuse: a server that takes a missing or empty key for
                         one real key fails, and the verdict names the key form
  per-principal          with --as-other, another principal using the same key never
                         gets the first principal's response, in any answer (a 409's
                         body, Location, a header): FAIL where it does
  patch                  a PATCH of the first request's resource (its Location, or
                         the URL and its id) with --patch-body, sent twice with one
                         fresh key: the retry gets the first answer again
  safe-methods           a GET of the URL with a key is answered as one without, and,
                         after a write, a GET with a used key sees it as one without
                         does (a stale body is a cache)
  restart                with --between, a request with a fresh key is sent, COMMAND
                         runs once it is written (sh -c: restart or kill the server,
                         returning once it is back), then the retry of that key must
                         get a final answer within --timeout, not stay in flight (an
                         answer naming a resource, whatever its status, is final)

Every FAIL names its causes, short stable words ("ran-twice",
"empty-key-shared-across-bodies"), and the evidence that decided it. Whether the
endpoint replays a completed key is found out first, so a check run alone (--only)
gets the verdict it gets in a full run; when it replays none, the checks that need a
replay to judge say so and are skipped instead of blaming another cause. Resources are
counted by their id or Location, never by 2xx answers. A key in flight is asked again
after its Retry-After (50 ms to 2 s), or without one after 100 ms doubling to 2 s, for
at most --timeout; the report states it. The restart check, finding the key still in
flight at --timeout, asks on for three times as long to tell a longer lease ("still
in flight after --timeout (N s); the server's lease looks longer", with the
--timeout to give) from a key that stays stuck.

Every run is independent of the runs before it on the same server: its keys are fresh
UUID v4s, and the first number of --body and --body-alt is drawn afresh for each run,
keeping its count of digits (2000 becomes one of 1000 to 9999), so that a record an
earlier run left (a body hashed into a key, an empty key kept for ever) answers none of
its requests; --fixed-bodies sends them as given. A request that got nothing on a
kept-alive connection the server had closed after its last answer is sent again on a
new connection, and its evidence says so.

In CI: --only and --skip run or leave out checks by name (comma-separated or
repeated). --baseline FILE takes a previous --json report: a failure whose causes it
already holds is accepted (shown as such, exit status 0), a new one exits 1, as
linters' baselines do. --junit FILE writes JUnit XML for the CI's test view (a
failure per failed check; skips and accepted failures as skipped). Bodies are in
the reports only with --include-bodies; otherwise a body is shown by its length
and a SHA-256 prefix and a 2xx answer by the resource it names (error answers keep
their one-line summary).

Verdicts: PASS, the rule held. WARN, nothing was lost or leaked but a client should
know (keys optional, a 409 without Retry-After, a replay with 409, requests of
distinct keys run one at a time, keys shared across principals where the other
principal is refused and sees nothing of the first's, a refusal with another status
than the profile's: "refused, with 417"). FAIL, the rule was broken; the summary and
the evidence show how (per-principal fails wherever another principal gets the first
principal's response). SKIP, the check could not judge, with the reason: GET or PATCH
not served, no --as-other, no --between, no 5xx to retry, or an endpoint that
replays nothing (errors-not-stored and per-principal then prove nothing). When the
retry of the first request runs again as a new request, the endpoint looks as if it
ignored the key: every later check is skipped, before it creates dozens of resources,
with a hint to check --key-header. The rule and the requests and answers of each FAIL
and WARN follow the table (--json and --html show the evidence of every check, and
which --url answered each request). The check creates only the resources it needs
and says how many it created: against a correct endpoint 27 with the defaults (the
first request's, one per round of each kind of duplicates, distinct-keys' one alone
and --concurrency at once, one each for errors-not-stored, safe-methods' write,
per-principal and restart when they run), more where duplicates run: point it at a
test or staging environment.

A body given as @FILE is read from FILE. A body without a Content-Type header is sent
as application/json when it is JSON, else as a form. Header values are redacted in the
reports but for Content-Type and Accept (an Authorization value keeps its scheme and a
short hash); an HTML body is summarised by its title and first text. Each flag can be
given as its environment variable (shown below); a variable that starts with
IDEM_CHECK_ and is no flag's is an error, as an unknown flag is (IDEM_CHECK_URL and
IDEM_CHECK_KEY are what the checker gives --between's command); any other variable
is ignored.

Exit status: 0 when no check fails (or only failures the --baseline accepts), 1
when one fails, 2 on a bad flag or variable, an unreadable --baseline, or when the
endpoint cannot be checked (no answer, or --body with a fresh key is not answered 2xx).
--json's report carries the counts of each verdict and this exit status.`

// checkFlags are the flags of `idem check`.
type checkFlags struct {
	method, body, bodyAlt, bodyInvalid string
	body5xx, patchBody                 string
	keyHeader, profile, html, between  string
	junit, baseline                    string
	urls, only, skip                   urlsFlag
	header, other                      headerFlag
	concurrency, rounds                int
	timeout                            time.Duration
	json, includeBodies, fixedBodies   bool
}

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem check"
	var f checkFlags
	fs := newFlagSet("check", checkSynopsis)
	fs.Var(&f.urls, "url", "the endpoint's `URL`, such as http://127.0.0.1:8080/v1/charges (required); repeat it for other instances of the same endpoint (replicas, another port): bursts and retries are spread across them")
	fs.StringVar(&f.method, "method", check.DefaultMethod, "the endpoint's `METHOD`: POST, PATCH, PUT or DELETE (not a safe method)")
	fs.StringVar(&f.body, "body", "", "a `BODY` the endpoint accepts with a 2xx, or @FILE (required)")
	fs.Var(&f.header, "header", "a header sent with every request, `'Name: value'` (authentication, Content-Type); repeat it for more")
	fs.StringVar(&f.bodyAlt, "body-alt", "", "a second valid `BODY` for the changed-body check, or @FILE (default: --body with its first number changed)")
	fs.StringVar(&f.bodyInvalid, "body-invalid", "", "a `BODY` the endpoint rejects (400, 422) for the errors-not-stored check, or @FILE (default: {} when --body is a JSON object, else the check is skipped)")
	fs.StringVar(&f.body5xx, "body-5xx", "", "a `BODY` the endpoint fails on with a 5xx, for the after-5xx check, or @FILE (default: --body-invalid, when the endpoint fails on it; else that check is skipped)")
	fs.StringVar(&f.patchBody, "patch-body", "", "a `BODY` that a PATCH of the first request's resource accepts, for the patch check, or @FILE (default: the run's --body-alt)")
	fs.BoolVar(&f.fixedBodies, "fixed-bodies", false, "send --body and --body-alt as given (by default each run draws their first number afresh, of as many digits, so that no earlier run sent them)")
	fs.StringVar(&f.keyHeader, "key-header", "Idempotency-Key", "the `NAME` of the key's header")
	fs.IntVar(&f.concurrency, "concurrency", check.DefaultConcurrency, "how many duplicates of one key the concurrency check sends at once (at least 2)")
	fs.IntVar(&f.rounds, "rounds", check.DefaultRounds, "how many bursts of duplicates the concurrency check sends, each with a fresh key (at least 1)")
	fs.StringVar(&f.between, "between", "", "a shell `COMMAND` the restart check runs after its first request is written and before the retry: a restart or a kill of the server, returning once it answers again (without it that check is skipped)")
	fs.StringVar(&f.profile, "profile", string(check.ProfileSeed), "the `profile` whose answers count as right: seed (409 key_reused, 409 request_in_progress with Retry-After), ietf (422 for a changed body, 409 in flight) or stripe (400 idempotency_error for a changed body, 409 in flight)")
	fs.Var(&f.other, "as-other", "a header of a second principal, `'Name: value'`, replacing the --header of that name in the per-principal check; repeat it for more (without it that check is skipped)")
	fs.DurationVar(&f.timeout, "timeout", check.DefaultTimeout, "bound of one request, and of the retries of an in-flight answer (restart: of the wait for a final answer after --between; set it above the server's lease)")
	fs.Var(&f.only, "only", "run only the checks `NAME,...` (comma-separated or repeated): "+strings.Join(check.Names(), ", "))
	fs.Var(&f.skip, "skip", "leave out the checks `NAME,...` (comma-separated or repeated)")
	fs.StringVar(&f.baseline, "baseline", "", "a previous --json report, `FILE`: the failures whose causes it holds are accepted (reported, exit status 0); only new failures exit 1")
	fs.BoolVar(&f.json, "json", false, "write the report as JSON on stdout (the table goes to stderr)")
	fs.StringVar(&f.html, "html", "", "also write the report as a self-contained HTML page to `FILE`, each check's evidence collapsible")
	fs.StringVar(&f.junit, "junit", "", "also write the report as JUnit XML to `FILE`, a testcase per check, for the CI's test view")
	fs.BoolVar(&f.includeBodies, "include-bodies", false, "put the request and response bodies in the reports (without it: their lengths and SHA-256 prefixes, and the resource a 2xx answer names)")
	if code, done := parseEnv(fs, args, stdout, stderr, checkUnknownEnv); done {
		return code
	}
	cfg, err := f.config()
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}
	var baseline *check.Baseline
	if f.baseline != "" {
		if baseline, err = readBaseline(f.baseline); err != nil {
			return usageError(stderr, fs, "--baseline: "+err.Error())
		}
	}
	rep, err := check.Run(ctx, cfg)
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}
	if baseline != nil {
		if err := rep.ApplyBaseline(baseline); err != nil {
			return failure(stderr, name, err)
		}
	}
	table := stdout
	if f.json {
		table = stderr
		if err := rep.WriteJSON(stdout); err != nil {
			return failure(stderr, name, err)
		}
	}
	if err := rep.WriteText(table); err != nil {
		return failure(stderr, name, err)
	}
	if f.html != "" {
		if err := writeFile(f.html, rep.WriteHTML); err != nil {
			return failure(stderr, name, fmt.Errorf("--html: %w", err))
		}
	}
	if f.junit != "" {
		if err := writeFile(f.junit, rep.WriteJUnit); err != nil {
			return failure(stderr, name, fmt.Errorf("--junit: %w", err))
		}
	}
	return rep.ExitStatus
}

// readBaseline reads a baseline from path.
func readBaseline(path string) (*check.Baseline, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return check.ReadBaseline(f, path)
}

// config checks the flags and returns the checker's configuration; errors name the
// flag.
func (f *checkFlags) config() (check.Config, error) {
	var cfg check.Config
	if len(f.urls) == 0 {
		return cfg, errors.New("--url is required")
	}
	for _, u := range f.urls {
		if err := checkHTTPURL("url", u, "http://host/path or https://host/path"); err != nil {
			return cfg, err
		}
	}
	switch {
	case f.body == "":
		return cfg, errors.New("--body is required: a body the endpoint accepts")
	case !validToken(f.method):
		return cfg, fmt.Errorf("--method %q is not a method", f.method)
	case !validToken(f.keyHeader):
		return cfg, fmt.Errorf("--key-header %q is not a header name", f.keyHeader)
	case f.concurrency < 2:
		return cfg, fmt.Errorf("--concurrency must be at least 2, got %d", f.concurrency)
	case f.rounds < 1:
		return cfg, fmt.Errorf("--rounds must be at least 1, got %d", f.rounds)
	case f.timeout <= 0:
		return cfg, fmt.Errorf("--timeout must be positive, got %v", f.timeout)
	}
	switch strings.ToUpper(f.method) {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return cfg, fmt.Errorf("--method %s is safe: keys are for POST, PATCH (and PUT, DELETE)", strings.ToUpper(f.method))
	}
	profile, err := check.ParseProfile(f.profile)
	if err != nil {
		return cfg, fmt.Errorf("--profile: %w", err)
	}
	checks, err := check.Select(splitNames(f.only), splitNames(f.skip))
	if err != nil {
		return cfg, err
	}
	cfg = check.Config{
		URL: f.urls[0], Instances: f.urls[1:], Method: f.method, KeyHeader: f.keyHeader,
		Concurrency: f.concurrency, Rounds: f.rounds, Between: f.between,
		Profile: profile, Timeout: f.timeout, Checks: checks, IncludeBodies: f.includeBodies,
		FixedBodies: f.fixedBodies,
	}
	if cfg.Header, err = f.header.headers("--header"); err != nil {
		return cfg, err
	}
	if cfg.Other, err = f.other.headers("--as-other"); err != nil {
		return cfg, err
	}
	if cfg.Body, err = readBody("--body", f.body); err != nil {
		return cfg, err
	}
	if f.bodyAlt == "" {
		if cfg.BodyAlt, err = check.AltBody(cfg.Body); err != nil {
			return cfg, fmt.Errorf("--body has no number to change for the changed-body check: give --body-alt")
		}
	} else if cfg.BodyAlt, err = readBody("--body-alt", f.bodyAlt); err != nil {
		return cfg, err
	}
	for _, b := range []struct {
		flag, value string
		to          *[]byte
	}{{"--body-invalid", f.bodyInvalid, &cfg.BodyInvalid}, {"--body-5xx", f.body5xx, &cfg.Body5xx}, {"--patch-body", f.patchBody, &cfg.PatchBody}} {
		if b.value == "" {
			continue
		}
		if *b.to, err = readBody(b.flag, b.value); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// checkEnvPrefix starts the environment variables that only `idem check` would read:
// one that is no flag's is an error, as an unknown flag is.
const checkEnvPrefix = envPrefix + "CHECK_"

// checkHookVariables are the variables the checker gives the --between command: set
// in its environment (a check run by the command itself), they are not a mistake.
var checkHookVariables = []string{"IDEM_CHECK_URL", "IDEM_CHECK_KEY"}

// checkUnknownEnv is idem check's policy for the variables of environ that name no
// flag of fs: one that starts with IDEM_CHECK_ is an error (a misspelt setting
// would otherwise change nothing in a CI job, without a word); any other is ignored
// silently, as a CI job's environment holds many. Empty variables count as unset.
func checkUnknownEnv(fs *flag.FlagSet, environ []string, _ io.Writer) error {
	own := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { own[envName(f.Name)] = true })
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, checkEnvPrefix) || value == "" || own[name] || slices.Contains(checkHookVariables, name) {
			continue
		}
		msg := fmt.Sprintf("%s is not a variable of idem check", name)
		if meant := closestVariable(strings.Replace(name, checkEnvPrefix, envPrefix, 1), own); meant != "" {
			msg += " (did you mean " + meant + "?)"
		}
		return errors.New(msg + "; its flags' variables are IDEM_ and the flag's name (--help)")
	}
	return nil
}

// readBody returns a body flag's value, or the contents of FILE for @FILE.
func readBody(flagName, v string) ([]byte, error) {
	path, ok := strings.CutPrefix(v, "@")
	if !ok {
		return []byte(v), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	return b, nil
}

// splitNames splits the values of a repeatable, comma-separated flag into names.
func splitNames(values []string) []string {
	var names []string
	for _, v := range values {
		for n := range strings.SplitSeq(v, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
	}
	return names
}

// writeFile writes a report to path with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// urlsFlag is a repeatable flag: --url, --only, --skip.
type urlsFlag []string

func (f *urlsFlag) String() string { return strings.Join(*f, " ") }

func (f *urlsFlag) Set(s string) error {
	*f = append(*f, s)
	return nil
}

// headerFlag is a repeatable 'Name: value' flag. Set keeps what it is given and
// never fails: the flag package would quote a bad value, which may hold a token, in
// its error; headers parses the values and names a bad one by its place instead.
type headerFlag []string

// String shows nothing: the values may be secrets.
func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(s string) error {
	*f = append(*f, s)
	return nil
}

// headers parses the values of the flag named flagName.
func (f headerFlag) headers(flagName string) (http.Header, error) {
	h := http.Header{}
	for i, s := range f {
		name, value, ok := strings.Cut(s, ":")
		name = strings.TrimSpace(name)
		switch {
		case !ok || !validToken(name):
			return nil, fmt.Errorf("%s (the %s one): want 'Name: value'", flagName, ordinal(i+1))
		case strings.ContainsAny(value, "\r\n\x00"):
			return nil, fmt.Errorf("%s %s: the value has a line break or NUL", flagName, name)
		}
		h.Add(name, strings.TrimSpace(value))
	}
	return h, nil
}

// ordinal renders 1 as "1st", 2 as "2nd" and so on.
func ordinal(n int) string {
	suffix := "th"
	switch {
	case n%100 >= 11 && n%100 <= 13:
	case n%10 == 1:
		suffix = "st"
	case n%10 == 2:
		suffix = "nd"
	case n%10 == 3:
		suffix = "rd"
	}
	return fmt.Sprintf("%d%s", n, suffix)
}

// validToken reports whether s is an RFC 9110 token: a method or a header name.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
