package idemprom_test

import (
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/store/memory"
)

// The middleware's events as Prometheus metrics, beside an observer of one's own, with
// the metrics served on a listener apart from the API's.
func Example() {
	metrics := idemprom.New(idemprom.Config{}) // idem_claims_total{route,outcome}, idem_store_duration_seconds{op}, …
	prometheus.MustRegister(metrics)
	mw := idem.New(idem.Config{Store: memory.New(), Scope: principal,
		Observer: observe.Multi(metrics.Observer(), &observe.Observer{
			LeaseLost: func(e observe.LeaseLostEvent) { log.Printf("lease lost on %s: %s", e.Route, e.Cause) },
		})})
	go func() { log.Fatal(http.ListenAndServe("127.0.0.1:9090", promhttp.Handler())) }()
	_ = mw // mw.Handler(api) serves the API
}

func principal(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }
