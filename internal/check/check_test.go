package check_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/check"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/memory"
)

const (
	body  = `{"amount":100,"currency":"usd"}`
	token = "sk_test_principal_one"
)

// config is the checker's configuration for a charges endpoint at url, with a second
// principal.
func config(url string) check.Config {
	return check.Config{
		URL:    url,
		Body:   []byte(body),
		Header: http.Header{"Authorization": {"Bearer " + token}},
		Other:  http.Header{"Authorization": {"Bearer sk_test_principal_two"}},
	}
}

// run checks the endpoint of cfg and fails t when it cannot be checked.
func run(t *testing.T, cfg check.Config) *check.Report {
	t.Helper()
	rep, err := check.Run(testenv.Context(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// statuses returns each check's status by name.
func statuses(rep *check.Report) map[string]check.Status {
	m := map[string]check.Status{}
	for _, c := range rep.Checks {
		m[c.Name] = c.Status
	}
	return m
}

// want fails t unless every check of rep passed but those named in except, which must
// have the status given; it shows the text report when it fails.
func want(t *testing.T, rep *check.Report, except map[string]check.Status) {
	t.Helper()
	if len(rep.Checks) != len(check.Checks()) {
		t.Errorf("%d checks ran, want %d", len(rep.Checks), len(check.Checks()))
	}
	bad := false
	for _, c := range rep.Checks {
		w, ok := except[c.Name]
		switch {
		case ok:
		case c.Name == check.RestartCheck.Name:
			w = check.StatusSkip // no --between
		case c.Name == check.After5xxCheck.Name:
			w = check.StatusSkip // --body-invalid is answered 400, not 5xx
		case c.Name == check.PatchCheck.Name:
			w = check.StatusSkip // PATCH is not served (but by testdata/server.py)
		default:
			w = check.StatusPass
		}
		if c.Status != w {
			t.Errorf("%s: %s (%s), want %s", c.Name, c.Status, c.Summary, w)
			bad = true
		}
		if c.Status != check.StatusSkip && len(c.Evidence) == 0 {
			t.Errorf("%s: %s without evidence", c.Name, c.Status)
		}
	}
	if bad {
		var b bytes.Buffer
		_ = rep.WriteText(&b)
		t.Log("\n" + b.String())
	}
}

// result returns the result of the check named name.
func result(t *testing.T, rep *check.Report, name string) check.CheckReport {
	t.Helper()
	for _, c := range rep.Checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %s in the report", name)
	return check.CheckReport{}
}

// idemServer is a charges API behind idem's middleware on the memory store.
type idemServer struct {
	cfg   idem.Config
	route idem.RouteOptions
	noGET bool // GET /v1/charges is not served
	// noContent answers a charge 204 without a body.
	noContent bool
}

// start serves s on a loopback port until t ends and returns the endpoint's URL.
func (s idemServer) start(t *testing.T) string {
	t.Helper()
	cfg := s.cfg
	cfg.Store = memory.New()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Scope = func(r *http.Request) (string, error) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			return "", errors.New("unauthenticated")
		}
		sum := sha256.Sum256([]byte(tok))
		return hex.EncodeToString(sum[:]), nil
	}
	var mu sync.Mutex
	charges := map[string][]json.RawMessage{}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", idem.New(cfg).Route(s.route)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p struct {
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		var err error
		if r.Header.Get("Content-Type") == "application/x-www-form-urlencoded" {
			p.Currency = r.PostFormValue("currency")
			p.Amount, err = strconv.ParseInt(r.PostFormValue("amount"), 10, 64)
		} else {
			err = json.NewDecoder(r.Body).Decode(&p)
		}
		if err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
			http.Error(w, `{"error":{"code":"parameter_invalid"}}`, http.StatusBadRequest)
			return
		}
		c, _ := json.Marshal(map[string]any{"id": "ch_" + rand.Text(), "object": "charge", "amount": p.Amount, "currency": p.Currency})
		mu.Lock()
		charges[r.Header.Get("Authorization")] = append(charges[r.Header.Get("Authorization")], c)
		mu.Unlock()
		if s.noContent {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(c)
	})))
	if !s.noGET {
		mux.HandleFunc("GET /v1/charges", func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			list, _ := json.Marshal(charges[r.Header.Get("Authorization")])
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(list)
		})
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/v1/charges"
}

func TestAnIdemEndpointPassesEveryCheckInItsProfile(t *testing.T) {
	t.Parallel()
	for _, p := range []struct {
		idem  idem.Profile
		check check.Profile
	}{{idem.ProfileSeed, check.ProfileSeed}, {idem.ProfileIETF, check.ProfileIETF}} {
		t.Run(string(p.check), func(t *testing.T) {
			t.Parallel()
			cfg := config(idemServer{cfg: idem.Config{Profile: p.idem}}.start(t))
			cfg.Profile = p.check
			rep := run(t, cfg)
			want(t, rep, nil)
			// The first request's charge, one per round of each kind of duplicates,
			// distinct-keys' one alone and its burst, one after the rejected body, one
			// of the other principal, safe-methods' write.
			if created := 5 + 2*check.DefaultRounds + check.DefaultConcurrency; rep.Created != created || rep.Requests < 70 || rep.Failed() || rep.ExitStatus != 0 {
				t.Errorf("created %d, %d requests, failed %v, exit status %d; want %d created, at least 70 requests, no failure", rep.Created, rep.Requests, rep.Failed(), rep.ExitStatus, created)
			}
			var text bytes.Buffer
			_ = rep.WriteText(&text)
			t.Log("\n" + text.String())
			if c := result(t, rep, "changed-body"); !strings.Contains(c.Summary, idem.CodeKeyReused) {
				t.Errorf("changed-body: %q does not name key_reused", c.Summary)
			}
		})
	}
}

// writeStripeError answers key_reused as Stripe does: 400 idempotency_error.
func writeStripeError(w http.ResponseWriter, r *http.Request, p *idem.Problem) {
	if p.Code == idem.CodeKeyReused {
		p.Status = http.StatusBadRequest
	}
	idem.WriteProblem(w, r, idem.ProfileSeed, p)
}

func TestTheProfileSaysWhichStatusOfAChangedBodyIsRight(t *testing.T) {
	t.Parallel()
	url := idemServer{cfg: idem.Config{ErrorWriter: writeStripeError}}.start(t)
	cfg := config(url)
	cfg.Profile = check.ProfileStripe
	want(t, run(t, cfg), nil)

	cfg = config(url)
	cfg.Profile = check.ProfileIETF
	rep := run(t, cfg)
	want(t, rep, map[string]check.Status{"changed-body": check.StatusWarn})
	c := result(t, rep, "changed-body")
	if !strings.Contains(c.Summary, "refused, with 400 key_reused, where profile ietf answers 422") || !strings.Contains(c.Summary, "--profile stripe") {
		t.Errorf("changed-body summary %q: want the status of the refusal, the expected one and the profile whose answer 400 is", c.Summary)
	}
	if rep.Failed() || rep.ExitStatus != 0 {
		t.Error("a refusal with another status fails the report")
	}
}

func TestOptionalKeysAreAWarning(t *testing.T) {
	t.Parallel()
	rep := run(t, config(idemServer{route: idem.RouteOptions{Requirement: idem.KeyOptional}}.start(t)))
	want(t, rep, map[string]check.Status{"bad-keys": check.StatusWarn})
	c := result(t, rep, "bad-keys")
	if !strings.Contains(c.Summary, "missing 201 (keys are optional)") || c.Created != 1 || rep.Failed() {
		t.Errorf("bad-keys: %q, created %d, report failed %v; want keys optional, 1 created, no failure", c.Summary, c.Created, rep.Failed())
	}
}

func TestChecksThatCannotBeMadeAreSkippedWithTheReason(t *testing.T) {
	t.Parallel()
	cfg := config(idemServer{noGET: true}.start(t))
	cfg.Other = nil
	cfg.Body = []byte("amount=100&currency=usd") // a form: no {} to derive --body-invalid from
	rep := run(t, cfg)
	want(t, rep, map[string]check.Status{
		"safe-methods": check.StatusSkip, "per-principal": check.StatusSkip, "errors-not-stored": check.StatusSkip,
	})
	for name, why := range map[string]string{"safe-methods": "not served at the URL (405)", "per-principal": "--as-other", "errors-not-stored": "--body-invalid"} {
		if c := result(t, rep, name); !strings.Contains(c.Summary, why) {
			t.Errorf("%s skipped with %q, want the reason %q", name, c.Summary, why)
		}
	}
	if rep.Failed() {
		t.Error("skipped checks fail the report")
	}
}

func TestWhatTheChecksCannotJudgeIsAWarning(t *testing.T) {
	t.Parallel()
	cfg := config(idemServer{}.start(t))
	cfg.Other = http.Header{"Authorization": {"Basic c2s6"}}  // not a bearer token: 401
	cfg.BodyInvalid = []byte(`{"amount":5,"currency":"eur"}`) // valid after all
	rep := run(t, cfg)
	want(t, rep, map[string]check.Status{"per-principal": check.StatusWarn, "errors-not-stored": check.StatusWarn})
	for name, says := range map[string]string{
		"per-principal":     "the other principal was refused (401 scope_required): do the --as-other headers authenticate?",
		"errors-not-stored": "--body-invalid was accepted (201): give a body the endpoint rejects",
	} {
		if c := result(t, rep, name); c.Summary != says {
			t.Errorf("%s: %q, want %q", name, c.Summary, says)
		}
	}
	if created := 5 + 2*check.DefaultRounds + check.DefaultConcurrency; rep.Failed() || rep.Created != created {
		t.Errorf("failed %v, created %d; want no failure and %d created (the first request, a round of each kind of duplicates each, distinct-keys', --body-invalid, safe-methods' write)", rep.Failed(), rep.Created, created)
	}
}

// Answers without a body are the same for every execution: one principal's cannot be
// told from another's.
func TestBodilessAnswersOfTwoPrincipalsAreAWarning(t *testing.T) {
	t.Parallel()
	rep := run(t, config(idemServer{noContent: true}.start(t)))
	want(t, rep, map[string]check.Status{"per-principal": check.StatusWarn})
	if c := result(t, rep, "per-principal"); !strings.Contains(c.Summary, "whether it ran cannot be told") {
		t.Errorf("per-principal: %q", c.Summary)
	}
	// 204s name no resource: they are not counted as resources, but reported apart.
	var text bytes.Buffer
	_ = rep.WriteText(&text)
	if rep.Created != 0 || rep.Unidentified < 4 || !strings.Contains(text.String(), fmt.Sprintf("created 0 resources (and %d 2xx answers naming none: no id, no Location)", rep.Unidentified)) {
		t.Errorf("created %d, unidentified %d; want 0 and at least 4, said in the totals:\n%s", rep.Created, rep.Unidentified, text.String())
	}
}

func TestAnEndpointThatCannotBeCheckedIsAnError(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/v1/charges"
	ln.Close()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no token", http.StatusUnauthorized)
	}))
	t.Cleanup(refusing.Close)
	for url, msg := range map[string]string{closed: "connection refused", refusing.URL: "answered 401 no token"} {
		_, err := check.Run(testenv.Context(t), config(url))
		if !errors.Is(err, check.ErrUnusable) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: error %v, want ErrUnusable saying %q", url, err, msg)
		}
	}
}

func TestTheReportsHideHeaderValues(t *testing.T) {
	t.Parallel()
	cfg := config(idemServer{}.start(t))
	cfg.Header.Set("X-Api-Key", "secret_api_key_value")
	cfg.URL += "?token=secret_query_token"
	rep := run(t, cfg)
	var text, js, page bytes.Buffer
	if err := errors.Join(rep.WriteText(&text), rep.WriteJSON(&js), rep.WriteHTML(&page)); err != nil {
		t.Fatal(err)
	}
	for name, out := range map[string]string{"text": text.String(), "json": js.String(), "html": page.String()} {
		for _, secret := range []string{token, "sk_test_principal_two", "secret_api_key_value", "secret_query_token"} {
			if strings.Contains(out, secret) {
				t.Errorf("the %s report shows %q", name, secret)
			}
		}
	}
	// Two principals' tokens stay apart: their hashes differ.
	var decoded struct {
		Checks []struct {
			Name     string
			Evidence []struct {
				Request struct{ Header http.Header }
			}
		}
	}
	if err := json.Unmarshal(js.Bytes(), &decoded); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range decoded.Checks {
		if c.Name == "per-principal" {
			for _, x := range c.Evidence {
				seen[x.Request.Header.Get("Authorization")] = true
			}
		}
	}
	if len(seen) != 2 {
		t.Errorf("per-principal shows the tokens as %v, want two different redactions", seen)
	}
	for a := range seen {
		if !strings.HasPrefix(a, "Bearer [redacted sha256:") {
			t.Errorf("Authorization shown as %q", a)
		}
	}
}

func TestTheReportsShowEveryCheckWithItsEvidence(t *testing.T) {
	t.Parallel()
	cfg := config(idemServer{cfg: idem.Config{Profile: idem.ProfileIETF}}.start(t))
	rep := run(t, cfg) // profile seed against an ietf endpoint: changed-body warns
	var text, js, page bytes.Buffer
	if err := errors.Join(rep.WriteText(&text), rep.WriteJSON(&js), rep.WriteHTML(&page)); err != nil {
		t.Fatal(err)
	}
	// The table: a line per check, the totals, then the warning with its rule and
	// evidence.
	lines := strings.Split(text.String(), "\n")
	for i, c := range check.Checks() {
		line := lines[2+i]
		if !strings.HasPrefix(strings.TrimSpace(line), strings.ToUpper(string(rep.Checks[i].Status))) || !strings.Contains(line, c.Name) {
			t.Errorf("table line %d %q, want %s's verdict", i, line, c.Name)
		}
	}
	for _, s := range []string{"10 pass, 1 warn, 0 fail, 3 skip", "created 27 resources", "WARN changed-body:", "rule: §5.5", "the same key with --body-alt", "← 422  Content-Type: application/problem+json"} {
		if !strings.Contains(text.String(), s) {
			t.Errorf("the text report lacks %q:\n%s", s, text.String())
		}
	}
	// JSON: every check with its rule, status and evidence.
	var decoded check.Report
	if err := json.Unmarshal(js.Bytes(), &decoded); err != nil {
		t.Fatal(err)
	}
	if len(decoded.Checks) != len(rep.Checks) || decoded.Created != 27 || decoded.Profile != check.ProfileSeed || decoded.Rounds != check.DefaultRounds {
		t.Fatalf("JSON report %+v", decoded)
	}
	if c := decoded.Counts; len(c) != 4 || c[check.StatusPass] != 10 || c[check.StatusWarn] != 1 || c[check.StatusFail] != 0 || c[check.StatusSkip] != 3 || decoded.ExitStatus != 0 {
		t.Errorf("JSON counts %v, exit status %d; want 10 pass, 1 warn, 0 fail, 3 skip and 0", c, decoded.ExitStatus)
	}
	for _, c := range decoded.Checks {
		if c.Status == check.StatusSkip {
			continue // restart: no --between
		}
		if c.Rule == "" || c.Doc == "" || c.Status == "" || len(c.Evidence) == 0 || c.Evidence[0].Response == nil || c.Evidence[0].Response.Status == 0 {
			t.Errorf("JSON check %s lacks its rule, doc, status or evidence: %+v", c.Name, c)
		}
	}
	// HTML: one collapsible block per check, the warning's open.
	html := page.String()
	if n := strings.Count(html, `<details class="check"`); n != len(rep.Checks) {
		t.Errorf("the page has %d check blocks, want %d", n, len(rep.Checks))
	}
	if strings.Count(html, `<details class="check" open><summary><span class="badge warn">WARN</span><span class="name">changed-body</span>`) != 1 {
		t.Error("the warning's block is not open")
	}
	if strings.Contains(html, "<script") || strings.Contains(html, "http://"+"cdn") {
		t.Error("the page is not self-contained")
	}
}

func TestAltBodyChangesTheFirstNumber(t *testing.T) {
	t.Parallel()
	for in, out := range map[string]string{
		`{"amount":100,"currency":"usd"}`:               `{"amount":99,"currency":"usd"}`,
		`{"customer":"cus_9","amount": 1}`:              `{"customer":"cus_9","amount": 2}`,
		`{"lines":[{"price":1.25}],"qty":3}`:            `{"lines":[{"price":1.26}],"qty":3}`,
		"amount=2000&currency=usd":                      "amount=1999&currency=usd",
		`{"n":99999999999999999999}`:                    `{"n":99999999999999999990}`,
		"{\n  \"amount\": 7,\n  \"currency\": \"usd\"}": "{\n  \"amount\": 6,\n  \"currency\": \"usd\"}",
	} {
		got, err := check.AltBody([]byte(in))
		if err != nil || string(got) != out {
			t.Errorf("AltBody(%q) = %q, %v; want %q", in, got, err, out)
		}
	}
	if _, err := check.AltBody([]byte(`{"currency":"usd1"}`)); err == nil {
		t.Error("AltBody of a body whose only digit is in a string: no error")
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cfg  check.Config
		want string
	}{
		{check.Config{Body: []byte(body)}, "URL is required"},
		{check.Config{URL: "localhost:8080", Body: []byte(body)}, "URL"},
		{check.Config{URL: "http://h/x"}, "Body is required"},
		{check.Config{URL: "http://h/x", Body: []byte(body), Method: "get"}, "Method GET is safe"},
		{check.Config{URL: "http://h/x", Body: []byte(body), Concurrency: 1}, "Concurrency"},
		{check.Config{URL: "http://h/x", Body: []byte(body), Profile: "rfc"}, "unknown profile"},
		{check.Config{URL: "http://h/x", Body: []byte(`{"a":"b"}`)}, "BodyAlt"},
	} {
		_, err := check.Run(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, check.ErrUnusable) {
			t.Errorf("Run(%+v): %v, want an error naming %q", c.cfg, err, c.want)
		}
	}
}

// A burst over https opens its TLS sessions itself, with the client's TLS
// configuration (here the test server's certificate): every duplicate is answered,
// each on a connection of its own. (The test server's client speaks HTTP/2, which
// would carry a burst sent through it on one connection.)
func TestABurstOpensItsOwnTLSSessions(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		conns int
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, r.Header.Get("Idempotency-Key"))
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	cfg := config(srv.URL + "/v1/charges")
	cfg.Client = srv.Client()
	cfg.Rounds = 2
	cfg.Checks = []*check.Check{check.ConcurrencyCheck}
	rep := run(t, cfg)
	c := result(t, rep, "concurrent-duplicates")
	for _, x := range c.Evidence {
		if x.Response == nil || x.Response.Status != http.StatusCreated {
			t.Fatalf("%s: %s", x.Label, x.Outcome())
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := 2 * check.DefaultConcurrency; conns < want || c.Status != check.StatusPass {
		t.Errorf("%d TLS connections, concurrent-duplicates %s (%s); want at least %d (one per duplicate) and a pass", conns, c.Status, c.Summary, want)
	}
}

// An endpoint that never replays (here it refuses every retry of a used key, as if
// the first request were still running) makes a fresh execution prove nothing:
// errors-not-stored and per-principal are skipped with that reason, not passed.
func TestChecksThatWouldPassVacuouslyAreSkipped(t *testing.T) {
	t.Parallel()
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		n    int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.Method != http.MethodPost {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		if !strings.Contains(string(b), "amount") {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		k := r.Header.Get("Authorization") + " " + r.Header.Get("Idempotency-Key")
		if seen[k] {
			w.WriteHeader(http.StatusConflict)
			return
		}
		seen[k] = true
		n++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d"}`, n)
	}))
	t.Cleanup(srv.Close)
	cfg := config(srv.URL + "/v1/charges")
	cfg.Checks = []*check.Check{check.ReplayCheck, check.ErrorsNotStoredCheck, check.PerPrincipalCheck}
	rep := run(t, cfg)
	wantSays(t, rep, "replay", check.StatusFail, "the retry got 409 where the first request got 201")
	for _, name := range []string{"errors-not-stored", "per-principal"} {
		wantSays(t, rep, name, check.StatusSkip, "the endpoint replays no completed key (a retry of the first request got 409; see replay)", "proves nothing")
	}
	if rep.Hint != "" {
		t.Errorf("hint %q: the retry did not run again", rep.Hint)
	}
}
