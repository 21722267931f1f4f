// Package idemprom counts what idem does as Prometheus metrics (SPEC §15): a
// [prometheus.Collector] built on [observe.Observer].
//
//	metrics := idemprom.New(idemprom.Config{})
//	prometheus.MustRegister(metrics)
//	mw := idem.New(idem.Config{Store: st, Scope: scope, Observer: metrics.Observer()})
//
// To tell an observer of your own too, join them: idem.MultiObserver(metrics.Observer(),
// yours).
//
// # Metrics
//
// Every name starts with the [Config.Namespace], "idem" by default. route is the
// operation's name in the observer's events: the middleware route's
// [idem.RouteOptions.Name], else the request's ServeMux pattern (such as
// "POST /v1/charges"), or [idem.Call.Name]. Keep route names to a small set; an
// unnamed route has route="".
//
//	idem_claims_total{route, outcome}        counter: claims of a key, by outcome:
//	    acquired, took_over (a lapsed lease: its holder died or stalled; the
//	    operation runs again), resumed (a record its holder released after a step
//	    committed, SPEC §13: the operation resumes; nothing died), replayed,
//	    replayed_cache, waited_replayed, not_stored, key_reused, in_progress,
//	    outcome_unknown (SPEC §13), store_error, quota_exceeded (SPEC §19)
//	idem_completions_total{route, result}    counter: ends of executed operations that
//	    stored their result or failed to: stored, not_stored, lease_lost, failed
//	idem_expired_completions_total{route}    counter: results stored after their TTL ran
//	    out (a retry executes again: make the TTL longer than the operation)
//	idem_releases_total{route, result}       counter: keys released so that a retry
//	    executes afresh (a releasing status, an error, a panic): released, not_held (the
//	    key was taken over or completed by a SPEC §7 transaction), error
//	idem_renewal_failures_total{route, error} counter: failed lease renewals: lease_lost
//	    (the key was taken over), timeout, canceled, error
//	idem_leases_lost_total{route, cause}     counter: operations cancelled because their
//	    lease was lost: taken_over, expired (renewals failed until the lease ended)
//	idem_steps_total{route, result}          counter: steps of resumable operations (SPEC
//	    §13): committed, saved (committed in an earlier run: its saved result returned
//	    without running again, a resume), lease_lost (fenced out: the key was taken
//	    over), failed
//	idem_resumes_total{route, result}        counter: records a Completer found resumable:
//	    resumed, failed (tried again after a backoff), taken (another process or the
//	    client's retry got it first), no_function (no resume function registered here;
//	    counted at every look, on the backoff of a failure)
//	idem_unfinished_operations               gauge: the store's unfinished operations
//	    (SPEC §13: in flight after a step committed, which never expire), as the last
//	    pass of a Completer counted them; every process counts the whole store
//	idem_unfinished_oldest_age_seconds       gauge: how long the oldest of them has
//	    existed (0 when none): alert on it
//	idem_store_duration_seconds{op}          histogram: store calls by operation: claim,
//	    lookup (a ClaimInHandler route's read of its key before the handler), wait (a
//	    poll of an in-flight key), complete, release, renew, step (a result saved
//	    by idem.Step), list_resumable and count_unfinished (a Completer's queries)
//	idem_store_errors_total{op, error}       counter: store calls that failed: timeout,
//	    canceled, error (an answer such as "lease lost" or "not found" is no failure)
//
// Replays are idem_claims_total with outcome replayed, replayed_cache or
// waited_replayed; executions are acquired, took_over and resumed. A route's series start at
// zero when its first event arrives, so that rate() and increase() see every change.
//
// No key, body or token is ever a label value: the events carry none (SPEC §15).
package idemprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem/internal/telemetry"
	"github.com/idem-go/idem/observe"
)

// DefaultNamespace is the prefix of every metric name.
const DefaultNamespace = "idem"

// DefaultStoreBuckets are the buckets of idem_store_duration_seconds, in seconds:
// 0.5 ms to 5 s (the default store timeout), for calls that take a millisecond on a
// healthy store and seconds on a stalled one.
var DefaultStoreBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// Config configures [New]. Its zero value is ready to use.
type Config struct {
	// Namespace is the prefix of every metric name ("idem" makes idem_claims_total).
	// Defaults to [DefaultNamespace].
	Namespace string

	// ConstLabels are added to every metric, such as {"store": "postgres"} when
	// several idem middlewares report to one registry. Defaults to none.
	ConstLabels prometheus.Labels

	// StoreBuckets are the buckets of the store call duration histogram, in seconds.
	// Defaults to [DefaultStoreBuckets].
	StoreBuckets []float64
}

// The known values of each label, whose series a route gets at zero.
var (
	outcomes = []observe.Outcome{observe.OutcomeAcquired, observe.OutcomeTookOver, observe.OutcomeResumed, observe.OutcomeReplayed,
		observe.OutcomeReplayedFromCache, observe.OutcomeWaitedThenReplayed, observe.OutcomeNotStored,
		observe.OutcomeKeyReused, observe.OutcomeInProgress, observe.OutcomeStoreError, observe.OutcomeUnknown,
		observe.OutcomeQuotaExceeded}
	results = []observe.CompletionResult{observe.CompletionStored, observe.CompletionNotStored,
		observe.CompletionLeaseLost, observe.CompletionFailed}
	releaseResults = []string{telemetry.ReleaseReleased, telemetry.ReleaseNotHeld, telemetry.ReleaseError}
	renewalErrors  = []string{telemetry.ErrLeaseLost, telemetry.ErrTimeout, telemetry.ErrCanceled, telemetry.ErrOther}
	causes         = []observe.LeaseLostCause{observe.LeaseTakenOver, observe.LeaseExpired}
	stepResults    = []observe.StepResult{observe.StepCommitted, observe.StepSaved, observe.StepLeaseLost, observe.StepFailed}
	resumeResults  = []observe.ResumeResult{observe.ResumeResumed, observe.ResumeFailed, observe.ResumeTaken, observe.ResumeNoFunction}
	storeOps       = []observe.StoreOp{observe.StoreOpClaim, observe.StoreOpWait, observe.StoreOpComplete,
		observe.StoreOpRelease, observe.StoreOpRenew, observe.StoreOpStep, observe.StoreOpListResumable, observe.StoreOpCountUnfinished}
	storeErrors = []string{telemetry.ErrTimeout, telemetry.ErrCanceled, telemetry.ErrOther}
)

// Metrics is a [prometheus.Collector] of idem's metrics, fed by its [Metrics.Observer].
// Register it once; it is safe for concurrent use. Build it with [New].
type Metrics struct {
	claims          *prometheus.CounterVec
	completions     *prometheus.CounterVec
	expired         *prometheus.CounterVec
	releases        *prometheus.CounterVec
	renewalFailures *prometheus.CounterVec
	leasesLost      *prometheus.CounterVec
	steps           *prometheus.CounterVec
	resumes         *prometheus.CounterVec
	unfinished      prometheus.Gauge
	oldest          prometheus.Gauge
	storeDuration   *prometheus.HistogramVec
	storeErrors     *prometheus.CounterVec

	// routes holds the routes whose series exist (at zero or more).
	routes   sync.Map
	observer *observe.Observer
}

// New returns the metrics of cfg, every series at zero.
func New(cfg Config) *Metrics {
	ns := cfg.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	buckets := cfg.StoreBuckets
	if buckets == nil {
		buckets = DefaultStoreBuckets
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help,
			ConstLabels: cfg.ConstLabels}, labels)
	}
	m := &Metrics{
		claims: counter("claims_total",
			"Claims of an idempotency key by route and outcome: acquired, took_over (a lapsed lease) and resumed (a record released after a step) execute the operation; replayed, replayed_cache and waited_replayed answer the stored result; not_stored, key_reused, in_progress, outcome_unknown, store_error and quota_exceeded answer an error.",
			"route", "outcome"),
		completions: counter("completions_total",
			"Ends of executed operations by route and result: stored, not_stored (streamed or too large), lease_lost (taken over: the result is not used), failed (the SPEC §7 transaction did not commit, or the store failed to record the result).",
			"route", "result"),
		expired: counter("expired_completions_total",
			"Results stored after their record's TTL ran out, by route: a retry executes the operation again; make the TTL longer than the operation runs.",
			"route"),
		releases: counter("releases_total",
			"Keys released so that a retry executes afresh, by route and result: released, not_held (taken over, or completed by a SPEC §7 transaction), error (the key frees when its lease lapses).",
			"route", "result"),
		renewalFailures: counter("renewal_failures_total",
			"Lease renewals that failed, by route and error: lease_lost (the key was taken over), timeout, canceled, error.",
			"route", "error"),
		leasesLost: counter("leases_lost_total",
			"Operations cancelled because their lease was lost, by route and cause: taken_over (another caller took the key over), expired (renewals failed until the lease ended).",
			"route", "cause"),
		steps: counter("steps_total",
			"Steps of resumable operations (SPEC §13) by route and result: committed, saved (committed in an earlier run; its saved result returned without running again), lease_lost (the key was taken over), failed.",
			"route", "result"),
		resumes: counter("resumes_total",
			"Records a completer found resumable, by route and result: resumed, failed (tried again after a backoff), taken (another process or the client's retry got it first), no_function (no resume function registered here; at every look).",
			"route", "result"),
		unfinished: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "unfinished_operations",
			Help:        "Unfinished operations in the store (SPEC §13: in flight after a step committed; they never expire), as a completer's last pass counted them.",
			ConstLabels: cfg.ConstLabels}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "unfinished_oldest_age_seconds",
			Help:        "Age of the oldest unfinished operation in the store (0 when none), as a completer's last pass found it.",
			ConstLabels: cfg.ConstLabels}),
		storeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns,
			Name:        "store_duration_seconds",
			Help:        "Durations of the store calls idem makes, by operation: claim, lookup (a ClaimInHandler route's read of its key), wait (a poll of an in-flight key), complete, release, renew, step, list_resumable, count_unfinished.",
			ConstLabels: cfg.ConstLabels, Buckets: buckets}, []string{"op"}),
		storeErrors: counter("store_errors_total",
			"Store calls that failed, by operation and error: timeout, canceled, error.",
			"op", "error"),
	}
	for _, op := range storeOps {
		m.storeDuration.WithLabelValues(string(op))
		for _, e := range storeErrors {
			m.storeErrors.WithLabelValues(string(op), e)
		}
	}
	m.observer = &observe.Observer{
		Claimed:       m.claimed,
		Completed:     m.completed,
		Released:      m.released,
		RenewalFailed: m.renewalFailed,
		LeaseLost:     m.leaseLost,
		StoreCall:     m.storeCall,
		Step:          m.step,
		Resumed:       m.resumed,
		Unfinished:    m.unfinishedOps,
	}
	return m
}

// Observer returns the observer that feeds the metrics, for [idem.Config.Observer]
// or [idem.GuardConfig.Observer] (or [observe.Multi]). Every call returns the
// same one; several middlewares and guards may share it.
func (m *Metrics) Observer() *observe.Observer { return m.observer }

// Describe sends the descriptors of every metric (prometheus.Collector).
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect sends every metric's current value (prometheus.Collector).
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.claims, m.completions, m.expired, m.releases,
		m.renewalFailures, m.leasesLost, m.steps, m.resumes, m.unfinished, m.oldest, m.storeDuration, m.storeErrors}
}

// route makes the series of route at zero the first time it is seen, and returns it.
func (m *Metrics) route(route string) string {
	if _, seen := m.routes.Load(route); seen {
		return route
	}
	if _, seen := m.routes.LoadOrStore(route, struct{}{}); !seen {
		for _, o := range outcomes {
			m.claims.WithLabelValues(route, string(o))
		}
		for _, r := range results {
			m.completions.WithLabelValues(route, string(r))
		}
		m.expired.WithLabelValues(route)
		for _, r := range releaseResults {
			m.releases.WithLabelValues(route, r)
		}
		for _, e := range renewalErrors {
			m.renewalFailures.WithLabelValues(route, e)
		}
		for _, c := range causes {
			m.leasesLost.WithLabelValues(route, string(c))
		}
		for _, r := range stepResults {
			m.steps.WithLabelValues(route, string(r))
		}
		for _, r := range resumeResults {
			m.resumes.WithLabelValues(route, string(r))
		}
	}
	return route
}

func (m *Metrics) claimed(e observe.ClaimEvent) {
	m.claims.WithLabelValues(m.route(e.Route), string(e.Outcome)).Inc()
}

func (m *Metrics) completed(e observe.CompletionEvent) {
	route := m.route(e.Route)
	m.completions.WithLabelValues(route, string(e.Result)).Inc()
	if e.Expired {
		m.expired.WithLabelValues(route).Inc()
	}
}

func (m *Metrics) released(e observe.ReleaseEvent) {
	m.releases.WithLabelValues(m.route(e.Route), telemetry.ReleaseResult(e.Err)).Inc()
}

func (m *Metrics) renewalFailed(e observe.RenewalEvent) {
	m.renewalFailures.WithLabelValues(m.route(e.Route), telemetry.ErrorKind(e.Err)).Inc()
}

func (m *Metrics) leaseLost(e observe.LeaseLostEvent) {
	m.leasesLost.WithLabelValues(m.route(e.Route), string(e.Cause)).Inc()
}

func (m *Metrics) step(e observe.StepEvent) {
	m.steps.WithLabelValues(m.route(e.Route), string(e.Result)).Inc()
}

func (m *Metrics) resumed(e observe.ResumeEvent) {
	m.resumes.WithLabelValues(m.route(e.Route), string(e.Result)).Inc()
}

func (m *Metrics) unfinishedOps(e observe.UnfinishedEvent) {
	m.unfinished.Set(float64(e.Count))
	m.oldest.Set(e.OldestAge.Seconds())
}

func (m *Metrics) storeCall(e observe.StoreCallEvent) {
	m.storeDuration.WithLabelValues(string(e.Op)).Observe(e.Duration.Seconds())
	if telemetry.StoreFailed(e.Err) {
		m.storeErrors.WithLabelValues(string(e.Op), telemetry.ErrorKind(e.Err)).Inc()
	}
}
