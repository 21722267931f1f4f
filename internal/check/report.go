package check

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what [Run] found: the endpoint, the profile, and each check's result.
type Report struct {
	// URL is the endpoint, passwords and token-like query parameters redacted.
	URL    string `json:"url"`
	Method string `json:"method"`
	// KeyHeader is the name of the key's header.
	KeyHeader string `json:"key_header"`
	// Profile says which answers counted as right.
	Profile Profile `json:"profile"`
	// Draft is the IETF draft whose sections the rules cite.
	Draft string `json:"ietf_draft"`
	// Instances are the endpoint's other URLs, when it was checked on several.
	Instances []string `json:"instances,omitempty"`
	// Concurrency is how many duplicates the concurrency check sent at once.
	Concurrency int `json:"concurrency"`
	// Rounds is how many bursts of duplicates it sent.
	Rounds   int       `json:"rounds"`
	Started  time.Time `json:"started"`
	Duration Millis    `json:"duration_ms"`
	// Requests is how many requests the checks sent.
	Requests int `json:"requests"`
	// Polling says how a key in flight was asked again (Retry-After, or a wait that
	// doubles up to a bound).
	Polling string `json:"polling"`
	// IncludeBodies says whether the exchanges carry their bodies
	// ([Config.IncludeBodies]); without it they carry their lengths and hashes.
	IncludeBodies bool `json:"include_bodies"`
	// Created is how many distinct resources the answers named, by id or Location:
	// the first request's, which several checks share, and those each check saw
	// first. A replay of a resource is not another.
	Created int `json:"created"`
	// Unidentified is how many 2xx answers to writes named no resource (no id, no
	// Location) and were not marked replayed: they are not in Created.
	Unidentified int `json:"unidentified,omitempty"`
	// Counts are how many checks ended with each verdict, every verdict present.
	Counts map[Status]int `json:"counts"`
	// ExitStatus is the exit status of `idem check` for this report: 1 when a check
	// failed (but for the failures a baseline accepted), else 0.
	ExitStatus int `json:"exit_status"`
	// Baseline, when a baseline was applied, says which file and what it changed.
	Baseline *BaselineResult `json:"baseline,omitempty"`
	// Hint, when set, says why the endpoint looks as if it ignored the key (the
	// checks after the replay check were then skipped).
	Hint string `json:"hint,omitempty"`
	// Checks are the results, in the order the checks ran.
	Checks []CheckReport `json:"checks"`
}

// count fills in Counts and ExitStatus.
func (r *Report) count() {
	r.Counts = map[Status]int{}
	for _, s := range []Status{StatusPass, StatusWarn, StatusFail, StatusSkip} {
		r.Counts[s] = r.Count(s)
	}
	r.ExitStatus = 0
	if r.NewFailures() > 0 {
		r.ExitStatus = 1
	}
}

// CheckReport is one check's result with its name, doc line and rule.
type CheckReport struct {
	Name string `json:"name"`
	Doc  string `json:"doc"`
	Rule string `json:"rule"`
	Result
	// Duration is how long the check took.
	Duration Millis `json:"duration_ms"`
	// Accepted says that the check failed with causes the baseline already held: the
	// failure is known, and does not fail the run.
	Accepted bool `json:"accepted_by_baseline,omitempty"`
}

// Failed reports whether a check failed, accepted by a baseline or not.
func (r *Report) Failed() bool { return r.Count(StatusFail) > 0 }

// NewFailures returns how many checks failed that no baseline accepted: those that
// make `idem check` exit 1.
func (r *Report) NewFailures() int {
	n := 0
	for _, c := range r.Checks {
		if c.Status == StatusFail && !c.Accepted {
			n++
		}
	}
	return n
}

// Count returns how many checks ended with s.
func (r *Report) Count(s Status) int {
	n := 0
	for _, c := range r.Checks {
		if c.Status == s {
			n++
		}
	}
	return n
}

// Totals renders the counts, the requests and the resources created in one line:
// "6 pass, 1 skip · 31 requests in 1.2s · created 3 resources".
func (r *Report) Totals() string {
	var parts []string
	for _, s := range []Status{StatusPass, StatusWarn, StatusFail, StatusSkip} {
		if n := r.Count(s); n > 0 || s == StatusFail {
			part := fmt.Sprintf("%d %s", n, s)
			if a := r.Count(StatusFail) - r.NewFailures(); s == StatusFail && a > 0 {
				part += fmt.Sprintf(" (%d accepted by the baseline)", a)
			}
			parts = append(parts, part)
		}
	}
	created := fmt.Sprintf("created %d %s", r.Created, plural(r.Created, "resource", "resources"))
	if r.Unidentified > 0 {
		created += fmt.Sprintf(" (and %d 2xx %s naming none: no id, no Location)", r.Unidentified, plural(r.Unidentified, "answer", "answers"))
	}
	return fmt.Sprintf("%s · %d requests in %s · %s", strings.Join(parts, ", "), r.Requests, r.Duration, created)
}

// plural returns one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Title is the report's first line: "idem check: POST https://… (profile seed)".
func (r *Report) Title() string {
	return fmt.Sprintf("idem check: %s %s (profile %s)", r.Method, r.URL, r.Profile)
}

// Text bounds of the terminal report.
const (
	// textExchanges is how many exchanges of a check the text shows.
	textExchanges = 6
	// textBody is how much of a body an evidence line shows.
	textBody = 100
)

// WriteText writes the report for a person: the title, one line per check (its
// verdict, name and summary), the totals, and then, for each check that failed or
// warned, its rule and the first exchanges of its evidence.
func (r *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "%s\n\n", r.Title())
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	for _, c := range r.Checks {
		summary := c.Summary
		if c.Accepted {
			summary = "(accepted by the baseline) " + summary
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", strings.ToUpper(string(c.Status)), c.Name, summary)
	}
	tw.Flush()
	fmt.Fprintf(ew, "\n%s\n", r.Totals())
	fmt.Fprintf(ew, "polling: %s\n", r.Polling)
	if b := r.Baseline; b != nil {
		fmt.Fprintf(ew, "baseline %s: %s\n", b.File, b.Summary())
	}
	if r.Hint != "" {
		fmt.Fprintf(ew, "\nhint: %s\n", r.Hint)
	}
	for _, c := range r.Checks {
		if c.Status != StatusFail && c.Status != StatusWarn {
			continue
		}
		known := ""
		if c.Accepted {
			known = " (accepted by the baseline)"
		}
		fmt.Fprintf(ew, "\n%s %s%s: %s\n  rule: %s\n", strings.ToUpper(string(c.Status)), c.Name, known, c.Doc, c.Rule)
		if len(c.Causes) > 0 {
			fmt.Fprintf(ew, "  causes: %s\n", strings.Join(c.Causes, ", "))
		}
		for i, x := range c.Evidence {
			if i == textExchanges {
				fmt.Fprintf(ew, "  … and %d more: --json or --html shows them all\n", len(c.Evidence)-i)
				break
			}
			writeExchange(ew, x, r.KeyHeader)
		}
	}
	return ew.err
}

// writeExchange writes one exchange in three lines: its label, the request (method,
// URL, the key and the body) and the answer.
func writeExchange(w io.Writer, x *Exchange, keyHeader string) {
	req := x.Request
	if req.Method == hookMethod {
		outcome := "exit status 0"
		if x.Error != "" {
			outcome = x.Error
		}
		out := ""
		if x.Response != nil && x.Response.Body != "" {
			out = "  " + cut(x.Response.Body, textBody)
		}
		fmt.Fprintf(w, "  %s\n    $ %s\n    ← %s%s  (%s)\n", x.Label, req.URL, outcome, out, x.Elapsed)
		return
	}
	line := "    → " + req.Method + " " + req.URL
	if keys, ok := req.Header[keyHeader]; ok {
		for _, k := range keys {
			if k == "" || strings.ContainsAny(k, " ,\"") {
				k = strconv.Quote(k)
			}
			line += fmt.Sprintf("  %s: %s", keyHeader, k)
		}
	} else {
		line += "  (no key)"
	}
	if b := shownText(req.Body, req.BodySHA256, req.BodyBytes); b != "" {
		line += "  " + b
	}
	if x.Instance > 0 {
		line += fmt.Sprintf("  (instance %d)", x.Instance)
	}
	fmt.Fprintf(w, "  %s\n%s\n", x.Label, line)
	if x.Response == nil {
		fmt.Fprintf(w, "    ← no answer: %s\n", x.Error)
		return
	}
	a := x.Response
	extra := ""
	for _, h := range append([]string{HeaderReplayed, "Retry-After"}, replayedHeaders...) {
		if v := a.Header.Get(h); v != "" {
			extra += fmt.Sprintf("  %s: %s", h, v)
		}
	}
	body := shownText(a.Body, a.BodySHA256, a.BodyBytes)
	switch {
	case a.Body != "" && !json.Valid(a.raw) && (strings.Contains(a.Header.Get("Content-Type"), "html") || looksHTML(a.raw)):
		body = fmt.Sprintf("[HTML, %d bytes] %s", len(a.raw), summary("text/html", a.raw))
	case a.Body == "" && x.Resource != "":
		body = x.Resource + "  " + body
	case a.Body == "" && !is2xx(a.Status) && a.BodyBytes > 0:
		// An error's words are the evidence: its one-line summary, never a 2xx body.
		body = cut(strings.TrimPrefix(a.describe(), fmt.Sprint(a.Status)), textBody) + "  " + body
	}
	fmt.Fprintf(w, "    ← %d%s  %s  (%s)\n", a.Status, extra, strings.TrimSpace(body), x.Elapsed)
}

// shownText renders a body for one line: the body when the report has it, else its
// length and hash ("[31 bytes sha256:9f86d081884c]").
func shownText(body, sum string, n int) string {
	switch {
	case body != "":
		return cut(body, textBody)
	case n > 0:
		return fmt.Sprintf("[%d bytes sha256:%s]", n, sum)
	}
	return ""
}

// cut shortens s to n bytes on one line.
func cut(s string, n int) string {
	s = oneLine(s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}

// errWriter keeps the first error of a sequence of writes.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return len(p), nil
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, nil
}
