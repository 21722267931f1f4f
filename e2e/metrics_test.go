package e2e

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idem-go/idem/internal/load"
)

// metricsAttr finds the metrics listener's address in the start line.
var metricsAttr = regexp.MustCompile(`\bmetrics=(\S+)`)

// metricsURL returns the URL of the metrics of a server started with --metrics-addr,
// which its start line names.
func (s *server) metricsURL(t testing.TB) string {
	t.Helper()
	m := metricsAttr.FindStringSubmatch(s.output())
	if m == nil {
		t.Fatalf("the start line names no metrics listener:\n%s", s.output())
	}
	return "http://" + m[1] + "/metrics"
}

// scrape reads the Prometheus metrics served at url.
type scrape map[string]*dto.MetricFamily

func scrapeMetrics(t *testing.T, url string) scrape {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return families
}

// sum adds up the counters (or histogram counts) of metric name whose labels have the
// given values; a label with several values ("outcome", "replayed|waited_replayed")
// matches any of them.
func (s scrape) sum(name string, labels ...string) int64 {
	f := s[name]
	if f == nil {
		return -1
	}
	var n float64
	for _, m := range f.GetMetric() {
		if matches(m, labels) {
			switch {
			case m.Counter != nil:
				n += m.GetCounter().GetValue()
			case m.Histogram != nil:
				n += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return int64(n)
}

func matches(m *dto.Metric, labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		ok := false
		for _, l := range m.GetLabel() {
			if l.GetName() == labels[i] && slices.Contains(strings.Split(labels[i+1], "|"), l.GetValue()) {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// The metrics `idem payments` serves on --metrics-addr, scraped after a load with
// duplicates (some resent later, some sent from four clients at once), count exactly
// what the load tool counted from its answers: every request by status, the replays
// (Idempotent-Replayed), the in-progress answers (409 request_in_progress), and one
// execution and one stored completion per key answered 201 first. The replays come
// from the middleware's observer, not from reading a response header.
func TestMetricsUnderLoadCountWhatTheLoadToolCounted(t *testing.T) {
	t.Parallel()
	for _, kind := range allStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			s := startServer(t, append(storeFlags(t, kind), "--metrics-addr", "127.0.0.1:0", "--processor-latency", "10ms")...)
			metricsURL := s.metricsURL(t)

			ctx := context.Background()
			var results []*load.Result
			var requests, replayed, inProgress, errors int64
			status := map[string]int64{}
			for _, cfg := range []load.Config{
				{Requests: 600, DuplicateRatio: 0.3},     // duplicates resent later: replays
				{Requests: 400, ConcurrentDuplicates: 4}, // duplicates at once: in progress
			} {
				cfg.URL, cfg.Concurrency, cfg.Endpoint = s.URL(), 8, load.EndpointCharges
				res, err := load.Run(ctx, cfg)
				if err != nil {
					t.Fatalf("load: %v", err)
				}
				results = append(results, res)
				sum := res.Summary
				requests, replayed, errors = requests+sum.Requests, replayed+sum.Replayed, errors+sum.Errors
				inProgress += sum.ConflictCodes["request_in_progress"]
				for code, n := range sum.Status {
					status[code] += n
				}
			}
			// Scraped before the verification, which sends requests of its own.
			sc := scrapeMetrics(t, metricsURL)
			executed := status["201"] - replayed
			const route = "POST /v1/charges"
			t.Logf("load tool: %d requests (statuses %v), %d replayed, %d in progress, %d executed; metrics: %d requests, claims %d acquired, %d replayed, %d in progress, %d stored",
				requests, status, replayed, inProgress, executed,
				sc.sum("idem_http_requests_total", "route", route),
				sc.sum("idem_claims_total", "outcome", "acquired"),
				sc.sum("idem_claims_total", "outcome", "replayed|replayed_cache|waited_replayed"),
				sc.sum("idem_claims_total", "outcome", "in_progress"),
				sc.sum("idem_completions_total", "result", "stored"))
			if errors != 0 || replayed == 0 || inProgress == 0 || executed == 0 {
				t.Fatalf("%d errors, %d replayed, %d in progress, %d executed: want a load without errors that meets every count",
					errors, replayed, inProgress, executed)
			}

			same := func(what string, metric, tool int64) {
				t.Helper()
				if metric != tool {
					t.Errorf("%s: the metrics count %d, the load tool %d", what, metric, tool)
				}
			}
			same("requests", sc.sum("idem_http_requests_total", "route", route), requests)
			for _, code := range slices.Sorted(maps.Keys(status)) {
				same("answers "+code, sc.sum("idem_http_requests_total", "route", route, "code", code), status[code])
			}
			same("claims (every request is keyed)", sc.sum("idem_claims_total", "route", route), requests)
			same("replays", sc.sum("idem_claims_total", "route", route, "outcome", "replayed|replayed_cache|waited_replayed"), replayed)
			same("in-progress answers", sc.sum("idem_claims_total", "route", route, "outcome", "in_progress"), inProgress)
			same("executions", sc.sum("idem_claims_total", "route", route, "outcome", "acquired|took_over|resumed"), executed)
			same("stored completions", sc.sum("idem_completions_total", "route", route, "result", "stored"), executed)
			same("releases", sc.sum("idem_releases_total"), 0)
			same("store errors", sc.sum("idem_store_errors_total"), 0)
			same("timed requests", sc.sum("idem_http_request_duration_seconds", "route", route), requests)
			// Every request's claim is one store call at least: the claim statement, or,
			// while the route's retries are frequent, the read of its key first (a
			// replay is then that read alone); a §7 completion is the SQL
			// transaction's, the others the guard's.
			if calls := sc.sum("idem_store_duration_seconds", "op", "claim|lookup"); calls < requests {
				t.Errorf("%d claim and lookup store calls for %d requests", calls, requests)
			}

			for i, res := range results {
				v, err := load.Verify(ctx, res)
				if err != nil {
					t.Fatalf("verify run %d: %v", i+1, err)
				}
				if v.Result != load.ExactlyOnceOK {
					t.Errorf("run %d: %s\n%s", i+1, v.Line(), strings.Join(v.Discrepancies, "\n"))
				}
			}
		})
	}
}

// The Grafana dashboard (deploy/grafana/idem.json) asks only for metrics that `idem
// payments` serves, grouped by labels they have, so that a renamed metric or label
// cannot leave a panel empty unnoticed (scripts/check-dashboard runs every query
// against a real Prometheus); compose.yaml mounts it and its provisioning.
func TestDashboardAsksForServedMetricsAndLabels(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../deploy/grafana/idem.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
		Templating struct{ List []struct{ Definition string } }
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("deploy/grafana/idem.json: %v", err)
	}
	s := startServer(t, "--store", sqliteStore(t), "--metrics-addr", "127.0.0.1:0")
	want201(t, "a charge", newClient().postCharge(t, s.URL(), newKey(), chargeJSON(2000)))
	sc := scrapeMetrics(t, s.metricsURL(t))
	labels := func(family string) map[string]bool {
		out := map[string]bool{"le": strings.HasSuffix(family, "_bucket"), "job": true, "instance": true}
		f := sc[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(family, "_bucket"), "_count"), "_sum")]
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				out[l.GetName()] = true
			}
		}
		return out
	}
	metricName := regexp.MustCompile(`\b(idem_[a-z_]+)`)
	grouping := regexp.MustCompile(`\bby \(([a-z_, ]+)\)`)
	selector := regexp.MustCompile(`\b([a-z_]+)(=~|!=|=)"`)
	queries := 0
	check := func(where, expr string) {
		queries++
		names := metricName.FindAllString(expr, -1)
		if len(names) == 0 {
			t.Errorf("%s: %s asks for no idem metric", where, expr)
		}
		for _, name := range names {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_count"), "_sum")
			if sc[base] == nil {
				t.Errorf("%s: %s: idem payments serves no %s", where, expr, name)
				continue
			}
			have := labels(name)
			var used []string
			for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
				used = append(used, strings.Split(strings.ReplaceAll(g[1], " ", ""), ",")...)
			}
			for _, m := range selector.FindAllStringSubmatch(expr, -1) {
				used = append(used, m[1])
			}
			for _, l := range used {
				if !have[l] {
					t.Errorf("%s: %s: %s has no label %s", where, expr, name, l)
				}
			}
		}
	}
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			check("panel "+p.Title, target.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Definition != "" {
			check("variable", v.Definition)
		}
	}
	if queries < 15 {
		t.Fatalf("%d queries checked: the dashboard was not read", queries)
	}
	compose, err := os.ReadFile("../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, mount := range regexp.MustCompile(`- \./(deploy/grafana/[^:\s]+):`).FindAllStringSubmatch(string(compose), -1) {
		if _, err := os.Stat("../" + mount[1]); err != nil {
			t.Errorf("compose.yaml mounts %s: %v", mount[1], err)
		}
	}
}
