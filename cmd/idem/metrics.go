package main

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/internal/proxy"
	"github.com/idem-go/idem/observe"
)

// metrics are the Prometheus metrics of `idem payments` (--metrics-addr): what the
// idempotency middleware does, from its observer (package idemprom), the API's HTTP
// requests by route and status, and the Go and process collectors.
type metrics struct {
	reg      *prometheus.Registry
	idem     *idemprom.Metrics
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		reg:  prometheus.NewRegistry(),
		idem: idemprom.New(idemprom.Config{}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_http_requests_total",
			Help: "HTTP requests of the API by route (the ServeMux pattern, such as \"POST /v1/charges\") and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_http_request_duration_seconds",
			Help:    "Durations of the API's HTTP requests by route, until the handler returned.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10),
		}, []string{"route"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idem_http_requests_in_flight",
			Help: "HTTP requests of the API being served.",
		}),
	}
	m.reg.MustRegister(m.idem, m.requests, m.duration, m.inFlight,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// proxyHooks feeds the metrics of idem proxy's upstream: its latency by route and
// status code, pass-throughs by reason, failed exchanges by outcome, the proxy's own
// re-sends by reason, and the auth endpoint's refusals by status. They are
// registered on first use, so that idem payments does not export them.
func (m *metrics) proxyHooks() *proxy.Hooks {
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idem_proxy_upstream_duration_seconds",
		Help:    "How long the upstream took to send its response headers, by route and status code.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
	}, []string{"route", "code"})
	passThrough := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_proxy_pass_throughs_total",
		Help: "Protected responses passed through as they came, by route and reason: event_stream (stored when it ends within --max-stored-body), trailers, too_large (response_not_stored).",
	}, []string{"route", "reason"})
	failed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_proxy_upstream_failures_total",
		Help: "Upstream exchanges that failed, by route and outcome: not_sent (the key released), unknown (the request was written; the record kept), timeout (the client got 504 and the proxy waited on), gateway (the upstream answered 502 or 504; the record kept), resend_refused and resent (the HTTP transport tried to send a written request again: a defect; the record kept).",
	}, []string{"route", "outcome"})
	resent := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_proxy_resends_total",
		Help: "Protected requests the proxy sent once more by its own decision, by route and reason: not_written (nothing of the first attempt was written on a kept-alive connection that was closed).",
	}, []string{"route", "reason"})
	authRefused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_proxy_auth_refusals_total",
		Help: "Keyed requests the auth endpoint (--auth-url) did not allow, by route and status (503: the endpoint could not be asked).",
	}, []string{"route", "code"})
	m.reg.MustRegister(latency, passThrough, failed, resent, authRefused)
	return &proxy.Hooks{
		UpstreamResponse: func(route string, status int, took time.Duration) {
			latency.WithLabelValues(route, strconv.Itoa(status)).Observe(took.Seconds())
		},
		PassThrough:    func(route, reason string) { passThrough.WithLabelValues(route, reason).Inc() },
		UpstreamFailed: func(route, outcome string) { failed.WithLabelValues(route, outcome).Inc() },
		Resent:         func(route, reason string) { resent.WithLabelValues(route, reason).Inc() },
		AuthRefused:    func(route string, status int) { authRefused.WithLabelValues(route, strconv.Itoa(status)).Inc() },
	}
}

// observer feeds the idempotency metrics (idem.Config.Observer).
func (m *metrics) observer() *observe.Observer { return m.idem.Observer() }

// instrument counts and times every request that next serves; route names the
// request's route, "unmatched" when it returns "".
func (m *metrics) instrument(route func(*http.Request) string, next http.Handler) http.Handler {
	byRoute := promhttp.WithLabelFromRequest("route", func(r *http.Request) string {
		if p := route(r); p != "" {
			return p
		}
		return "unmatched"
	})
	return promhttp.InstrumentHandlerInFlight(m.inFlight,
		promhttp.InstrumentHandlerDuration(m.duration,
			promhttp.InstrumentHandlerCounter(m.requests, next, byRoute), byRoute))
}

// handler serves the metrics at GET /metrics, for the metrics listener.
func (m *metrics) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	return mux
}
