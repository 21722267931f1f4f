package main

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemprom"
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

// observer feeds the idempotency metrics (idem.Config.Observer).
func (m *metrics) observer() *idem.Observer { return m.idem.Observer() }

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
