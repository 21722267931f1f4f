package main

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/payments/paymentstest"
)

func TestLoadFlagErrorsAreOneLineWithExitStatus2(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"load"}, "--url is required"},
		{[]string{"load", "--url", "localhost:8080"}, "--url"},
		{[]string{"load", "--url", "http://h", "--duration", "1s", "--requests", "5"}, "exclude each other"},
		{[]string{"load", "--url", "http://h", "--concurrency", "0"}, "--concurrency"},
		{[]string{"load", "--url", "http://h", "--duplicate-ratio", "1.5"}, "--duplicate-ratio"},
		{[]string{"load", "--url", "http://h", "--concurrent-duplicates", "0"}, "--concurrent-duplicates"},
		{[]string{"load", "--url", "http://h", "--endpoint", "refunds"}, "--endpoint"},
		{[]string{"load", "--url", "http://h", "--endpoint", "replay", "--no-key"}, "--no-key"},
		{[]string{"load", "--url", "http://h", "--bogus"}, "bogus"},
	}
	for _, c := range cases {
		code, stdout, stderr := runCmd(t, c.args...)
		if code != exitUsage || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, c.want) {
			t.Errorf("idem %v: exit %d, stdout %q, stderr %q; want exit 2 and one line naming %s", c.args, code, stdout, stderr, c.want)
		}
	}
}

func TestLoadHelpExplainsItsFlags(t *testing.T) {
	t.Parallel()
	code, stdout, _ := runCmd(t, "load", "--help")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, f := range []string{"-url", "-concurrency", "-duration", "-requests", "-duplicate-ratio", "-concurrent-duplicates", "-endpoint", "-no-key", "-token", "-json", "exactly-once"} {
		if !strings.Contains(stdout, f) {
			t.Errorf("idem load --help does not explain %s:\n%s", f, stdout)
		}
	}
}

func TestLoadJSONSummaryReportsExactlyOnce(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(paymentstest.Handler(t, nil))
	t.Cleanup(srv.Close)

	code, stdout, stderr := runCmd(t, "load", "--url", srv.URL, "--concurrency", "4", "--requests", "100", "--duplicate-ratio", "0.2", "--json")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var sum struct {
		Requests   int64            `json:"requests"`
		Throughput float64          `json:"requests_per_second"`
		P99        float64          `json:"p99_ms"`
		Status     map[string]int64 `json:"status"`
		Verify     struct {
			Result string `json:"exactly_once"`
		} `json:"verification"`
	}
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatalf("stdout is not the JSON summary: %v\n%s", err, stdout)
	}
	if sum.Requests != 100 || sum.Throughput <= 0 || sum.P99 <= 0 || sum.Verify.Result != "ok" {
		t.Fatalf("summary %+v, want 100 requests, figures and exactly_once ok", sum)
	}
	if !strings.Contains(stderr, "exactly-once: ok\n") || !strings.Contains(stderr, "req/s") {
		t.Fatalf("stderr lacks the report:\n%s", stderr)
	}
}
