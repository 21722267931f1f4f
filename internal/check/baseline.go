package check

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Baseline is what a previous run's JSON report ([Report.WriteJSON]) says failed:
// the failed checks and their causes. Applied to a report ([Report.ApplyBaseline]),
// it accepts the failures it already holds, as linters' baselines do, so that only
// new failures fail the run.
type Baseline struct {
	// File is where the baseline was read from, for the report.
	File string
	// failed are the causes of each check that failed in it; an empty list (a
	// report written before causes were named) accepts any failure of that check.
	failed map[string][]string
}

// ReadBaseline reads a baseline, a JSON report of `idem check`, from r; file names
// it in errors and in the report.
func ReadBaseline(r io.Reader, file string) (*Baseline, error) {
	var rep struct {
		Checks *[]struct {
			Name   string   `json:"name"`
			Status Status   `json:"status"`
			Causes []string `json:"causes"`
		} `json:"checks"`
	}
	dec := json.NewDecoder(r)
	if err := dec.Decode(&rep); err != nil {
		return nil, fmt.Errorf("baseline %s is not a JSON report of idem check (--json): %w", file, err)
	}
	if rep.Checks == nil {
		return nil, fmt.Errorf("baseline %s is not a JSON report of idem check (--json): it has no \"checks\"", file)
	}
	b := &Baseline{File: file, failed: map[string][]string{}}
	for i, c := range *rep.Checks {
		if c.Name == "" {
			return nil, fmt.Errorf("baseline %s: check %d has no name", file, i+1)
		}
		if c.Status == StatusFail {
			b.failed[c.Name] = c.Causes
		}
	}
	return b, nil
}

// accepts reports whether the baseline holds the failure c: the same check failed
// in it, of every cause c names.
func (b *Baseline) accepts(c *CheckReport) bool {
	causes, ok := b.failed[c.Name]
	if !ok || c.Status != StatusFail {
		return false
	}
	if len(causes) == 0 {
		return true
	}
	for _, cause := range c.Causes {
		if !slices.Contains(causes, cause) {
			return false
		}
	}
	return true
}

// BaselineResult says what a baseline changed in a report.
type BaselineResult struct {
	// File is the baseline's file.
	File string `json:"file"`
	// Accepted are the checks whose failures the baseline held.
	Accepted []string `json:"accepted"`
	// New are the checks that failed with a cause the baseline did not hold: they
	// fail the run.
	New []string `json:"new"`
	// Fixed are the checks that failed in the baseline and now passed or warned:
	// the baseline can lose them.
	Fixed []string `json:"fixed"`
}

// Summary renders the result in one line: "1 failure accepted (replay); no new
// failure; fixed since: per-principal".
func (b *BaselineResult) Summary() string {
	var parts []string
	if n := len(b.Accepted); n > 0 {
		parts = append(parts, fmt.Sprintf("%d %s accepted (%s)", n, plural(n, "failure", "failures"), strings.Join(b.Accepted, ", ")))
	} else {
		parts = append(parts, "no failure accepted")
	}
	if n := len(b.New); n > 0 {
		parts = append(parts, fmt.Sprintf("%d new (%s)", n, strings.Join(b.New, ", ")))
	} else {
		parts = append(parts, "no new failure")
	}
	if len(b.Fixed) > 0 {
		parts = append(parts, fmt.Sprintf("fixed since: %s (the baseline can lose them)", strings.Join(b.Fixed, ", ")))
	}
	return strings.Join(parts, "; ")
}

// ApplyBaseline marks the failures that b holds as accepted, records what b
// changed, and sets ExitStatus: 1 only when a failure is new.
func (r *Report) ApplyBaseline(b *Baseline) error {
	if b == nil {
		return errors.New("no baseline")
	}
	res := &BaselineResult{File: b.File, Accepted: []string{}, New: []string{}, Fixed: []string{}}
	for i := range r.Checks {
		c := &r.Checks[i]
		_, failedBefore := b.failed[c.Name]
		switch {
		case c.Status == StatusFail && b.accepts(c):
			c.Accepted = true
			res.Accepted = append(res.Accepted, c.Name)
		case c.Status == StatusFail:
			res.New = append(res.New, c.Name)
		case failedBefore && (c.Status == StatusPass || c.Status == StatusWarn):
			res.Fixed = append(res.Fixed, c.Name)
		}
	}
	r.Baseline = res
	r.count()
	return nil
}
