package main

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem/internal/payments"
)

// newHandlers returns the API, instrumented, and the handler of the metrics listener
// (--metrics-addr), which serves its Prometheus metrics at GET /metrics.
func newHandlers(api *payments.Server) (apiHandler, metricsHandler http.Handler) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(reg)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return m.instrument(api.Pattern, api.Handler()), mux
}

// metrics count the API's requests by route, status and idempotency outcome.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_http_requests_total",
			Help: "HTTP requests by route, status code and idempotency outcome (none: no key sent; keyed: a key was sent and the request was not a replay; replayed: answered from a stored response).",
		}, []string{"route", "code", "idempotency"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_http_request_duration_seconds",
			Help:    "HTTP request durations by route.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10),
		}, []string{"route"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

// instrument records every request that next serves; pattern names its route.
func (m *metrics) instrument(pattern func(*http.Request) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := pattern(r)
		if route == "" {
			route = "unmatched"
		}
		start := time.Now()
		sw := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		outcome := "none"
		switch {
		case sw.Header().Get("Idempotent-Replayed") == "true":
			outcome = "replayed"
		case r.Header.Get("Idempotency-Key") != "":
			outcome = "keyed"
		}
		m.requests.WithLabelValues(route, strconv.Itoa(sw.status), outcome).Inc()
		m.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
	})
}

// statusRecorder remembers the final status written through it.
type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusRecorder) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's Flush and deadlines.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
