package logsummary_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/logsummary"
	"github.com/idem-go/idem/internal/testkit"
)

// Under an outage every request fails alike; the log says so once per interval with a
// count instead of once per attempt (issue 19: two consumers wrote ~14,500 lines in a
// 3-second PostgreSQL outage).
func TestRepeatedFailuresAreSummarisedOncePerInterval(t *testing.T) {
	t.Parallel()
	buf := &testkit.Buffer{}
	// An interval no loaded machine reaches within the loop (a 50-ms one did, beside
	// other tests: a summary came before the hundredth record); EndIntervals ends it.
	const interval = time.Hour
	h := logsummary.New(slog.NewTextHandler(buf, nil), interval)
	log := slog.New(h)
	for i := range 100 {
		log.Error("idem: store claim failed", "key_hash", i)
		log.With("route", "r").Warn("consume: not processed")
		log.Info("idem: took over a key")
	}
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }
	if got := lines(); len(got) != 102 ||
		!strings.Contains(got[0], `msg="idem: store claim failed" key_hash=0`) || !strings.Contains(got[1], "route=r") {
		t.Fatalf("%d lines before the interval ended, want the first error, the first warning and 100 infos:\n%s", len(got), buf)
	}
	logsummary.EndIntervals(h)
	for _, want := range []string{
		`level=ERROR msg="idem: store claim failed" repeated=99 interval=1h0m0s`,
		`level=WARN msg="consume: not processed" route=r repeated=99 interval=1h0m0s`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("no summary %q:\n%s", want, buf)
		}
	}
	// A new interval begins with the next failure, written in full.
	log.Error("idem: store claim failed", "key_hash", "again")
	if got := lines(); !strings.Contains(got[len(got)-1], "key_hash=again") {
		t.Fatalf("the first failure after the interval was not written: %s", got[len(got)-1])
	}
}

// The interval's own timer writes the summary: nothing else has to come.
func TestAnIntervalEndsByItselfWithItsSummary(t *testing.T) {
	t.Parallel()
	buf := &testkit.Buffer{}
	const interval = 20 * time.Millisecond
	log := slog.New(logsummary.New(slog.NewTextHandler(buf, nil), interval))
	// However slow this machine, some interval gets a second record before it ends.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), "repeated=") {
		if time.Now().After(deadline) {
			t.Fatalf("no summary written by an interval's end:\n%s", buf)
		}
		log.Error("idem: store claim failed")
		time.Sleep(interval / 4) // polling for the timer's write, bounded by the deadline
	}
	if !strings.Contains(buf.String(), `level=ERROR msg="idem: store claim failed" repeated=`) {
		t.Fatalf("the summary lacks its level and message:\n%s", buf)
	}
}
