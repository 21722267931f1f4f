package idemprom_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/store/memory"
)

// Each event counts once, under its own labels: claims by outcome, completions by
// result (and expired ones), releases by result, failed renewals by error, lost
// leases by cause, store calls by operation with their failures.
func TestEachEventCountsOnceUnderItsLabels(t *testing.T) {
	t.Parallel()
	m := idemprom.New(idemprom.Config{})
	ob := m.Observer()
	const route = "POST /v1/charges"
	ob.Claimed(observe.ClaimEvent{Route: route, Outcome: observe.OutcomeAcquired})
	ob.Claimed(observe.ClaimEvent{Route: route, Outcome: observe.OutcomeTookOver})
	ob.Claimed(observe.ClaimEvent{Route: route, Outcome: observe.OutcomeReplayed})
	ob.Claimed(observe.ClaimEvent{Route: route, Outcome: observe.OutcomeReplayed})
	ob.Claimed(observe.ClaimEvent{Route: "orders.create", Outcome: observe.OutcomeInProgress})
	ob.Completed(observe.CompletionEvent{Route: route, Result: observe.CompletionStored})
	ob.Completed(observe.CompletionEvent{Route: route, Result: observe.CompletionStored, Expired: true})
	ob.Completed(observe.CompletionEvent{Route: route, Result: observe.CompletionLeaseLost, Err: idem.ErrLeaseLost})
	ob.Released(observe.ReleaseEvent{Route: route})
	ob.Released(observe.ReleaseEvent{Route: route, Err: idem.ErrLeaseLost})
	ob.Released(observe.ReleaseEvent{Route: route, Err: errors.New("connection reset")})
	ob.RenewalFailed(observe.RenewalEvent{Route: route, Err: idem.ErrLeaseLost})
	ob.RenewalFailed(observe.RenewalEvent{Route: route, Err: fmt.Errorf("renew: %w", context.DeadlineExceeded)})
	ob.LeaseLost(observe.LeaseLostEvent{Route: route, Cause: observe.LeaseTakenOver})
	ob.LeaseLost(observe.LeaseLostEvent{Route: route, Cause: observe.LeaseExpired})
	ob.StoreCall(observe.StoreCallEvent{Op: observe.StoreOpClaim, Duration: 2 * time.Millisecond})
	ob.StoreCall(observe.StoreCallEvent{Op: observe.StoreOpClaim, Duration: 3 * time.Second, Err: context.DeadlineExceeded})
	ob.StoreCall(observe.StoreCallEvent{Op: observe.StoreOpRenew, Duration: time.Millisecond, Err: idem.ErrLeaseLost})
	ob.StoreCall(observe.StoreCallEvent{Op: observe.StoreOpWait, Duration: time.Millisecond, Err: idemstore.ErrNotFound})
	ob.StoreCall(observe.StoreCallEvent{Op: observe.StoreOpListResumable, Duration: time.Millisecond, Err: context.DeadlineExceeded})
	ob.Step(observe.StepEvent{Route: route, Step: "charge_pending", Result: observe.StepCommitted})
	ob.Step(observe.StepEvent{Route: route, Step: "charge_pending", Result: observe.StepSaved})
	ob.Step(observe.StepEvent{Route: route, Step: "charge_pending", Result: observe.StepLeaseLost, Err: idem.ErrLeaseLost})
	ob.Resumed(observe.ResumeEvent{Route: route, Result: observe.ResumeResumed})
	ob.Resumed(observe.ResumeEvent{Route: route, Result: observe.ResumeFailed, Err: errors.New("processor down")})
	ob.Resumed(observe.ResumeEvent{Route: "refunds.create", Result: observe.ResumeNoFunction})
	ob.Unfinished(observe.UnfinishedEvent{Count: 3, OldestAge: 90 * time.Second})
	ob.StoreCall(observe.StoreCallEvent{Op: observe.StoreOpCountUnfinished, Duration: time.Millisecond})

	want := map[string]float64{
		`idem_unfinished_operations`:                                               3,
		`idem_unfinished_oldest_age_seconds`:                                       90,
		`idem_store_duration_seconds_count{op="count_unfinished"}`:                 1,
		`idem_claims_total{outcome="acquired",route="POST /v1/charges"}`:           1,
		`idem_claims_total{outcome="took_over",route="POST /v1/charges"}`:          1,
		`idem_claims_total{outcome="replayed",route="POST /v1/charges"}`:           2,
		`idem_claims_total{outcome="in_progress",route="POST /v1/charges"}`:        0,
		`idem_claims_total{outcome="in_progress",route="orders.create"}`:           1,
		`idem_completions_total{result="stored",route="POST /v1/charges"}`:         2,
		`idem_completions_total{result="lease_lost",route="POST /v1/charges"}`:     1,
		`idem_completions_total{result="failed",route="POST /v1/charges"}`:         0,
		`idem_expired_completions_total{route="POST /v1/charges"}`:                 1,
		`idem_releases_total{result="released",route="POST /v1/charges"}`:          1,
		`idem_releases_total{result="not_held",route="POST /v1/charges"}`:          1,
		`idem_releases_total{result="error",route="POST /v1/charges"}`:             1,
		`idem_renewal_failures_total{error="lease_lost",route="POST /v1/charges"}`: 1,
		`idem_renewal_failures_total{error="timeout",route="POST /v1/charges"}`:    1,
		`idem_leases_lost_total{cause="taken_over",route="POST /v1/charges"}`:      1,
		`idem_leases_lost_total{cause="expired",route="POST /v1/charges"}`:         1,
		`idem_leases_lost_total{cause="expired",route="orders.create"}`:            0,
		`idem_store_duration_seconds_count{op="claim"}`:                            2,
		`idem_store_duration_seconds_count{op="renew"}`:                            1,
		`idem_store_duration_seconds_count{op="wait"}`:                             1,
		`idem_store_duration_seconds_count{op="release"}`:                          0,
		`idem_store_duration_seconds_bucket{op="claim",le="0.0025"}`:               1,
		`idem_store_duration_seconds_bucket{op="claim",le="5"}`:                    2,
		`idem_store_errors_total{error="timeout",op="claim"}`:                      1,
		`idem_store_errors_total{error="error",op="renew"}`:                        0, // lease lost: an answer
		`idem_store_errors_total{error="error",op="wait"}`:                         0, // not found: an answer
		`idem_store_errors_total{error="timeout",op="complete"}`:                   0,
		`idem_store_errors_total{error="timeout",op="list_resumable"}`:             1,
		`idem_store_duration_seconds_count{op="step"}`:                             0,
		`idem_steps_total{result="committed",route="POST /v1/charges"}`:            1,
		`idem_steps_total{result="saved",route="POST /v1/charges"}`:                1,
		`idem_steps_total{result="lease_lost",route="POST /v1/charges"}`:           1,
		`idem_steps_total{result="failed",route="POST /v1/charges"}`:               0,
		`idem_steps_total{result="committed",route="orders.create"}`:               0,
		`idem_resumes_total{result="resumed",route="POST /v1/charges"}`:            1,
		`idem_resumes_total{result="failed",route="POST /v1/charges"}`:             1,
		`idem_resumes_total{result="taken",route="POST /v1/charges"}`:              0,
		`idem_resumes_total{result="no_function",route="refunds.create"}`:          1,
	}
	got := samples(t, m)
	for series, v := range want {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s = %v (present: %v), want %v", series, g, ok, v)
		}
	}
}

// The metrics follow Prometheus' naming conventions (promlint): _total counters,
// base units, help on every metric.
func TestMetricsPassPrometheusLint(t *testing.T) {
	t.Parallel()
	m := idemprom.New(idemprom.Config{})
	m.Observer().Claimed(observe.ClaimEvent{Route: "r", Outcome: observe.OutcomeAcquired})
	problems, err := testutil.CollectAndLint(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
}

// Wired into a middleware, the metrics count what happened to real requests, and no
// label carries the key, the body or the token.
func TestMetricsOfAMiddlewareCountItsRequestsAndRevealNoSecret(t *testing.T) {
	t.Parallel()
	m := idemprom.New(idemprom.Config{ConstLabels: prometheus.Labels{"store": "memory"}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	mw := idem.New(idem.Config{
		Store:    memory.New(),
		Scope:    func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		Observer: m.Observer(),
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Unavailable") != "" {
			w.WriteHeader(http.StatusServiceUnavailable) // a 5xx releases the key
			return
		}
		w.WriteHeader(http.StatusCreated)
	})))
	const (
		key   = "6a3e1f0c-secret-key-9b2d4e5f6a7b"
		token = "Bearer sk_live_secret_token"
		body  = `{"card":"4242424242424242"}`
	)
	send := func(key, body string, unavailable bool) int {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(body))
		r.Header.Set("Authorization", token)
		r.Header.Set("Idempotency-Key", key)
		if unavailable {
			r.Header.Set("X-Unavailable", "yes")
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code
	}
	send(key, body, false)               // acquired, stored
	send(key, body, false)               // replayed
	send(key, `{"card":"other"}`, false) // key_reused
	send(key+"-2", body, true)           // acquired, released
	send(key+"-2", body, false)          // acquired again, stored

	const r = `route="POST /v1/charges",store="memory"`
	want := map[string]float64{
		`idem_claims_total{outcome="acquired",` + r + `}`:                 3,
		`idem_claims_total{outcome="replayed",` + r + `}`:                 1,
		`idem_claims_total{outcome="key_reused",` + r + `}`:               1,
		`idem_completions_total{result="stored",` + r + `}`:               2,
		`idem_releases_total{result="released",` + r + `}`:                1,
		`idem_store_duration_seconds_count{op="claim",store="memory"}`:    5,
		`idem_store_duration_seconds_count{op="complete",store="memory"}`: 2,
		`idem_store_duration_seconds_count{op="release",store="memory"}`:  1,
	}
	got := samples(t, reg)
	for series, v := range want {
		if got[series] != v {
			t.Errorf("%s = %v, want %v", series, got[series], v)
		}
	}
	for series := range got {
		for _, secret := range []string{key, "secret", "4242", "sk_live"} {
			if strings.Contains(series, secret) {
				t.Errorf("series %s reveals %q", series, secret)
			}
		}
	}
}

// samples gathers g as "name{label="value",...}" → value, labels sorted by name as
// the exposition format sorts them; histograms give _count and _bucket series.
func samples(t *testing.T, g prometheus.Collector) map[string]float64 {
	t.Helper()
	reg, ok := g.(*prometheus.Registry)
	if !ok {
		reg = prometheus.NewPedanticRegistry()
		reg.MustRegister(g)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			series := func(name string, extra ...string) string {
				return name + "{" + strings.Join(append(append([]string(nil), labels...), extra...), ",") + "}"
			}
			switch {
			case s.Counter != nil:
				out[series(f.GetName())] = s.GetCounter().GetValue()
			case s.Gauge != nil && len(labels) == 0:
				out[f.GetName()] = s.GetGauge().GetValue()
			case s.Gauge != nil:
				out[series(f.GetName())] = s.GetGauge().GetValue()
			case s.Histogram != nil:
				out[series(f.GetName()+"_count")] = float64(s.GetHistogram().GetSampleCount())
				for _, b := range s.GetHistogram().GetBucket() {
					out[series(f.GetName()+"_bucket", fmt.Sprintf("le=%q", fmt.Sprint(b.GetUpperBound())))] = float64(b.GetCumulativeCount())
				}
			}
		}
	}
	return out
}
