package check

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The JUnit XML elements that CI systems read (GitHub Actions' test reporters,
// GitLab's artifacts:reports:junit, Jenkins' junit step): one testsuite of one
// testcase per check.
type (
	junitSuites struct {
		XMLName xml.Name `xml:"testsuites"`
		Name    string   `xml:"name,attr"`
		junitCounts
		Suites []junitSuite `xml:"testsuite"`
	}
	// junitCounts are the attributes of testsuites and testsuite alike.
	junitCounts struct {
		Tests    int    `xml:"tests,attr"`
		Failures int    `xml:"failures,attr"`
		Errors   int    `xml:"errors,attr"`
		Skipped  int    `xml:"skipped,attr"`
		Time     string `xml:"time,attr"`
	}
	junitSuite struct {
		Name string `xml:"name,attr"`
		junitCounts
		Timestamp  string          `xml:"timestamp,attr"`
		Properties []junitProperty `xml:"properties>property"`
		Cases      []junitCase     `xml:"testcase"`
	}
	junitProperty struct {
		Name  string `xml:"name,attr"`
		Value string `xml:"value,attr"`
	}
	junitCase struct {
		Name      string        `xml:"name,attr"`
		Classname string        `xml:"classname,attr"`
		Time      string        `xml:"time,attr"`
		Failure   *junitMessage `xml:"failure,omitempty"`
		Skipped   *junitMessage `xml:"skipped,omitempty"`
		SystemOut string        `xml:"system-out,omitempty"`
	}
	junitMessage struct {
		Message string `xml:"message,attr"`
		Type    string `xml:"type,attr,omitempty"`
		Text    string `xml:",chardata"`
	}
)

// junitClass is the classname of every testcase: CI systems group cases by it.
const junitClass = "idem check"

// WriteJUnit writes the report as JUnit XML: a testsuite named by the report's
// title, and a testcase per check, named by the check. A FAIL is a <failure> whose
// message is the summary, whose type is the causes, and whose text is the rule and
// the evidence (as the text report shows it); a SKIP is <skipped> with its reason;
// a failure the baseline accepted is <skipped> too ("accepted by the baseline: …"),
// so that the CI's verdict agrees with the exit status; a WARN passes, its summary
// in <system-out>. The suite's properties carry the URL, the profile, the resources
// created and the polling.
func (r *Report) WriteJUnit(w io.Writer) error {
	secs := func(m Millis) string { return strconv.FormatFloat(float64(m)/1e9, 'f', 3, 64) }
	suite := junitSuite{
		Name: r.Title(), junitCounts: junitCounts{Time: secs(r.Duration)}, Timestamp: r.Started.Format("2006-01-02T15:04:05Z"),
		Properties: []junitProperty{
			{"url", r.URL}, {"method", r.Method}, {"profile", string(r.Profile)}, {"key_header", r.KeyHeader},
			{"requests", strconv.Itoa(r.Requests)}, {"created", strconv.Itoa(r.Created)}, {"polling", r.Polling},
			{"exit_status", strconv.Itoa(r.ExitStatus)},
		},
	}
	if len(r.Instances) > 0 {
		suite.Properties = append(suite.Properties, junitProperty{"instances", strings.Join(r.Instances, " ")})
	}
	if r.Baseline != nil {
		suite.Properties = append(suite.Properties, junitProperty{"baseline", r.Baseline.File + ": " + r.Baseline.Summary()})
	}
	for _, c := range r.Checks {
		tc := junitCase{Name: c.Name, Classname: junitClass, Time: secs(c.Duration)}
		switch {
		case c.Status == StatusFail && c.Accepted:
			tc.Skipped = &junitMessage{Message: "accepted by the baseline: " + c.Summary, Text: r.junitDetail(c)}
			suite.Skipped++
		case c.Status == StatusFail:
			tc.Failure = &junitMessage{Message: c.Summary, Type: strings.Join(c.Causes, " "), Text: r.junitDetail(c)}
			suite.Failures++
		case c.Status == StatusSkip:
			tc.Skipped = &junitMessage{Message: c.Summary}
			suite.Skipped++
		case c.Status == StatusWarn:
			tc.SystemOut = "WARN: " + c.Summary + "\n" + r.junitDetail(c)
		default:
			tc.SystemOut = "PASS: " + c.Summary
		}
		suite.Cases = append(suite.Cases, tc)
	}
	suite.Tests = len(suite.Cases)
	doc := junitSuites{Name: junitClass, junitCounts: suite.junitCounts, Suites: []junitSuite{suite}}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// junitDetail is a check's doc line, rule, causes and evidence, as the text report
// shows them.
func (r *Report) junitDetail(c CheckReport) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\nrule: %s\n", c.Doc, c.Rule)
	if len(c.Causes) > 0 {
		fmt.Fprintf(&b, "causes: %s\n", strings.Join(c.Causes, ", "))
	}
	for i, x := range c.Evidence {
		if i == textExchanges {
			fmt.Fprintf(&b, "  … and %d more: the JSON or HTML report shows them all\n", len(c.Evidence)-i)
			break
		}
		writeExchange(&b, x, r.KeyHeader)
	}
	return b.String()
}
