package check_test

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/check"
	"github.com/idem-go/idem/internal/testenv"
)

func TestSelectRunsChecksByNameAndNamesThemAllOnAnUnknownOne(t *testing.T) {
	t.Parallel()
	names := func(cs []*check.Check) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		only, skip []string
		want       string
	}{
		{nil, nil, strings.Join(check.Names(), ",")},
		{[]string{"keyless", "replay"}, nil, "replay,keyless"}, // in the order they run
		{nil, []string{"restart", "concurrent-duplicates"}, "replay,spread-duplicates,distinct-keys,changed-body,other-request,errors-not-stored,after-5xx,bad-keys,keyless,per-principal,patch,safe-methods"},
		{[]string{"replay", "keyless"}, []string{"keyless"}, "replay"},
	} {
		got, err := check.Select(c.only, c.skip)
		if err != nil || names(got) != c.want {
			t.Errorf("Select(%v, %v) = %s, %v; want %s", c.only, c.skip, names(got), err, c.want)
		}
	}
	_, err := check.Select([]string{"replay", "replays"}, nil)
	if err == nil || !strings.Contains(err.Error(), `--only: unknown check "replays"; the checks are replay, concurrent-duplicates, spread-duplicates,`) {
		t.Errorf("an unknown name: %v", err)
	}
	if _, err := check.Select(nil, []string{"Replay"}); err == nil || !strings.HasPrefix(err.Error(), `--skip: unknown check "Replay"`) {
		t.Errorf("an unknown name in skip: %v", err)
	}
	if _, err := check.Select([]string{"replay"}, []string{"replay"}); err == nil || !strings.Contains(err.Error(), "leaves no check to run") {
		t.Errorf("an empty selection: %v", err)
	}
}

// baselineOf returns the baseline that rep's JSON report makes.
func baselineOf(t *testing.T, rep *check.Report) *check.Baseline {
	t.Helper()
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	b, err := check.ReadBaseline(&js, "baseline.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A baseline accepts the failures it holds (same check, no new cause): a run that
// fails only those exits 0 and says they were accepted; a run with a failure it does
// not hold exits 1, and the baseline's failures that now pass are named fixed.
func TestABaselineAcceptsKnownFailuresAndNotNewOnes(t *testing.T) {
	t.Parallel()
	global := startServer(t, "python3", "testdata/server.py", "--port", "0", "--bug", "global-keys", "--work", "0.05")
	first := run(t, config(global))
	if first.ExitStatus != 1 || first.NewFailures() != 1 {
		t.Fatalf("the first run: exit status %d, %d failures; want per-principal's alone", first.ExitStatus, first.NewFailures())
	}
	baseline := baselineOf(t, first)

	again := run(t, config(global))
	if err := again.ApplyBaseline(baseline); err != nil {
		t.Fatal(err)
	}
	c := result(t, again, "per-principal")
	if again.ExitStatus != 0 || !c.Accepted || c.Status != check.StatusFail || again.NewFailures() != 0 {
		t.Errorf("a known failure: exit status %d, per-principal %s accepted %v; want exit 0, a failure accepted", again.ExitStatus, c.Status, c.Accepted)
	}
	var text, js bytes.Buffer
	_ = again.WriteText(&text)
	_ = again.WriteJSON(&js)
	for _, s := range []string{"  FAIL  per-principal          (accepted by the baseline) the other principal got", "1 fail (1 accepted by the baseline)", "baseline baseline.json: 1 failure accepted (per-principal); no new failure", "FAIL per-principal (accepted by the baseline):"} {
		if !strings.Contains(text.String(), s) {
			t.Errorf("the text report lacks %q:\n%s", s, text.String())
		}
	}
	if !strings.Contains(js.String(), `"accepted_by_baseline": true`) || !strings.Contains(js.String(), `"exit_status": 0`) {
		t.Errorf("the JSON report does not say the failure was accepted")
	}

	// Another defect: a new failure, and per-principal fixed.
	unbound := startServer(t, "python3", "testdata/server.py", "--port", "0", "--bug", "key-not-bound", "--work", "0.05")
	other := run(t, config(unbound))
	if err := other.ApplyBaseline(baseline); err != nil {
		t.Fatal(err)
	}
	if other.ExitStatus != 1 || other.Baseline.Summary() != "no failure accepted; 1 new (other-request); fixed since: per-principal (the baseline can lose them)" {
		t.Errorf("a new failure: exit status %d, %q", other.ExitStatus, other.Baseline.Summary())
	}

	// The same check failing with a cause the baseline does not hold is new.
	var doc map[string]any
	var js2 bytes.Buffer
	_ = first.WriteJSON(&js2)
	if err := json.Unmarshal(js2.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, c := range doc["checks"].([]any) {
		if c := c.(map[string]any); c["name"] == "per-principal" {
			c["causes"] = []string{"replay-to-other-principal"}
		}
	}
	edited, _ := json.Marshal(doc)
	b, err := check.ReadBaseline(bytes.NewReader(edited), "edited.json")
	if err != nil {
		t.Fatal(err)
	}
	third := run(t, config(global))
	if err := third.ApplyBaseline(b); err != nil {
		t.Fatal(err)
	}
	if third.ExitStatus != 1 || result(t, third, "per-principal").Accepted {
		t.Errorf("a failure with another cause was accepted: exit status %d", third.ExitStatus)
	}

	for in, says := range map[string]string{"<html>": "is not a JSON report", `{"url":"x"}`: `it has no "checks"`} {
		if _, err := check.ReadBaseline(strings.NewReader(in), "b.json"); err == nil || !strings.Contains(err.Error(), "baseline b.json") || !strings.Contains(err.Error(), says) {
			t.Errorf("ReadBaseline(%q): %v, want an error saying %q", in, err, says)
		}
	}
}

// The JUnit schema's elements, as the JUnit XSD that Jenkins and GitLab read defines
// them; decoding is strict, and the test checks what the attributes say.
type junitTestsuites struct {
	XMLName  xml.Name         `xml:"testsuites"`
	Tests    int              `xml:"tests,attr"`
	Failures int              `xml:"failures,attr"`
	Errors   int              `xml:"errors,attr"`
	Skipped  int              `xml:"skipped,attr"`
	Time     string           `xml:"time,attr"`
	Suites   []junitTestsuite `xml:"testsuite"`
}

type junitTestsuite struct {
	Name       string `xml:"name,attr"`
	Tests      int    `xml:"tests,attr"`
	Failures   int    `xml:"failures,attr"`
	Errors     int    `xml:"errors,attr"`
	Skipped    int    `xml:"skipped,attr"`
	Time       string `xml:"time,attr"`
	Timestamp  string `xml:"timestamp,attr"`
	Properties []struct {
		Name  string `xml:"name,attr"`
		Value string `xml:"value,attr"`
	} `xml:"properties>property"`
	Cases []struct {
		Name      string `xml:"name,attr"`
		Classname string `xml:"classname,attr"`
		Time      string `xml:"time,attr"`
		Failure   *struct {
			Message string `xml:"message,attr"`
			Type    string `xml:"type,attr"`
			Text    string `xml:",chardata"`
		} `xml:"failure"`
		Skipped *struct {
			Message string `xml:"message,attr"`
		} `xml:"skipped"`
		SystemOut string `xml:"system-out"`
	} `xml:"testcase"`
}

// The JUnit report parses as the JUnit schema says, with a testcase per check; a
// FAIL is a failure with its summary and causes, a SKIP and a failure the baseline
// accepted are skipped; and a JUnit consumer that CI tools use (go-junit, built from
// testdata/junit) reads it the same way.
func TestTheJUnitReportIsWhatCISystemsRead(t *testing.T) {
	t.Parallel()
	// Two defects, of which the baseline knows one: bad-keys accepted, keyless new.
	url := startServer(t, "python3", "testdata/server.py", "--port", "0", "--bug", "accepts-bad-keys", "--work", "0.05")
	baseline, err := check.ReadBaseline(strings.NewReader(`{"checks": [{"name": "bad-keys", "status": "fail",
		"causes": ["empty-accepted", "256-characters-accepted", "list-accepted", "two-fields-accepted"]}]}`), "known.json")
	if err != nil {
		t.Fatal(err)
	}
	rep := run(t, config(url))
	if err := rep.ApplyBaseline(baseline); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "report.xml")
	var buf bytes.Buffer
	if err := rep.WriteJUnit(&buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	var doc junitTestsuites
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	dec.Strict = true
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("the JUnit report does not parse: %v\n%s", err, buf.String())
	}
	if len(doc.Suites) != 1 {
		t.Fatalf("%d testsuites, want 1", len(doc.Suites))
	}
	s := doc.Suites[0]
	failures, skipped := 0, 0
	for i, c := range s.Cases {
		want := rep.Checks[i]
		if c.Name != want.Name || c.Classname != "idem check" {
			t.Errorf("testcase %d: %s (%s), want %s", i, c.Name, c.Classname, want.Name)
		}
		if _, err := strconv.ParseFloat(c.Time, 64); err != nil {
			t.Errorf("testcase %s: time %q", c.Name, c.Time)
		}
		switch {
		case want.Status == check.StatusFail && !want.Accepted:
			failures++
			if c.Failure == nil || c.Failure.Message != want.Summary || c.Failure.Type != strings.Join(want.Causes, " ") || !strings.Contains(c.Failure.Text, "rule: ") {
				t.Errorf("testcase %s: failure %+v, want the summary, causes, rule and evidence", c.Name, c.Failure)
			}
		case want.Status == check.StatusSkip || want.Accepted:
			skipped++
			if c.Skipped == nil || c.Failure != nil || want.Accepted && !strings.HasPrefix(c.Skipped.Message, "accepted by the baseline: ") {
				t.Errorf("testcase %s (%s, accepted %v): skipped %+v", c.Name, want.Status, want.Accepted, c.Skipped)
			}
		default:
			if c.Failure != nil || c.Skipped != nil || !strings.HasPrefix(c.SystemOut, strings.ToUpper(string(want.Status))+": ") {
				t.Errorf("testcase %s (%s): %+v", c.Name, want.Status, c)
			}
		}
	}
	if len(s.Cases) != len(rep.Checks) || s.Tests != len(s.Cases) || s.Failures != failures || s.Skipped != skipped || s.Errors != 0 ||
		doc.Tests != s.Tests || doc.Failures != failures || doc.Skipped != skipped || failures != 1 || skipped != 3 {
		t.Errorf("counts: suites %d/%d/%d, suite %d/%d/%d, cases %d, want %d failure (keyless) and 3 skipped (restart, after-5xx, bad-keys accepted)",
			doc.Tests, doc.Failures, doc.Skipped, s.Tests, s.Failures, s.Skipped, len(s.Cases), failures)
	}
	props := map[string]string{}
	for _, p := range s.Properties {
		props[p.Name] = p.Value
	}
	if props["url"] != rep.URL || props["created"] != strconv.Itoa(rep.Created) || props["exit_status"] != "1" || !strings.Contains(props["baseline"], "1 failure accepted (bad-keys)") {
		t.Errorf("properties %v", props)
	}

	// A consumer's reading.
	var read []struct {
		Name, Status, Message, Type string
	}
	out, err := exec.Command(buildModule(t, "testdata/junit"), path).Output()
	if err != nil {
		t.Fatalf("go-junit could not read the report: %v", err)
	}
	if err := json.Unmarshal(out, &read); err != nil {
		t.Fatal(err)
	}
	if len(read) != len(rep.Checks) {
		t.Fatalf("go-junit read %d testcases, want %d", len(read), len(rep.Checks))
	}
	for i, c := range read {
		want := map[check.Status]string{check.StatusPass: "passed", check.StatusWarn: "passed", check.StatusSkip: "skipped", check.StatusFail: "failed"}[rep.Checks[i].Status]
		if rep.Checks[i].Accepted {
			want = "skipped"
		}
		if c.Name != rep.Checks[i].Name || c.Status != want {
			t.Errorf("go-junit read %s as %s, want %s %s", c.Name, c.Status, rep.Checks[i].Name, want)
		}
		if want == "failed" && (c.Message != rep.Checks[i].Summary || c.Type != strings.Join(rep.Checks[i].Causes, " ")) {
			t.Errorf("go-junit read %s's failure as %q (%s)", c.Name, c.Message, c.Type)
		}
	}
}

// buildModule builds the main package of dir, a module of its own under testdata,
// with the go command, and returns the executable.
func buildModule(t *testing.T, dir string) string {
	t.Helper()
	if testing.Short() && !testenv.CI() {
		t.Skipf("-short: %s builds a module", dir)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		testenv.Unavailable(t, "the go command is not on PATH, needed to build %s: %v", dir, err)
	}
	exe := filepath.Join(t.TempDir(), filepath.Base(dir))
	build := exec.Command(goBin, "build", "-o", exe, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("(cd internal/check/%s && go build) failed: %v\n%s", dir, err, out)
	}
	return exe
}
