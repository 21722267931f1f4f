package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/store/memory"
)

// What the requests send that must never reach a span or a metric.
const (
	token = "sk_live_SECRET_token_77"
	card  = "4242424242424242"
)

func keyOf(i int) string { return fmt.Sprintf("SECRET-key-%02d-6a3e1f0c9b2d4e5f", i) }

// bundle is an API behind the idem middleware and idemotel, in a request span as
// otelhttp would start it, with spans and metrics recorded in memory.
type bundle struct {
	api     http.Handler
	spans   *tracetest.InMemoryExporter
	metrics *sdkmetric.ManualReader
	// gate holds the handler of a request with X-Hold until closed; entered tells
	// that such a request runs.
	gate, entered chan struct{}
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{spans: tracetest.NewInMemoryExporter(), metrics: sdkmetric.NewManualReader(),
		gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(b.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.metrics))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
	tel, err := idemotel.New(idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	mw := idem.New(idem.Config{
		Store:    memory.New(),
		Scope:    func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		Observer: tel.Observer(),
	})
	tracer := tp.Tracer("test")
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw.Handler(tel.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The handler's own span, a child of idem.operation.
		_, span := tracer.Start(r.Context(), "charge the card")
		defer span.End()
		if r.Header.Get("X-Hold") != "" {
			b.entered <- struct{}{}
			<-b.gate
		}
		if r.Header.Get("X-Unavailable") != "" {
			w.WriteHeader(http.StatusServiceUnavailable) // releases the key
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_1","card":%q}`, card)
	}))))
	b.api = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), "POST /v1/charges", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		mux.ServeHTTP(w, r.WithContext(ctx))
	})
	return b
}

// send posts a charge with key and returns its status.
func (b *bundle) send(key, body string, headers ...string) int {
	r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer "+token)
	r.Header.Set("Idempotency-Key", key)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	b.api.ServeHTTP(w, r)
	return w.Code
}

func chargeBody(i int) string { return fmt.Sprintf(`{"amount":%d,"card":%q}`, 1000+i, card) }

// request is what one request's trace holds: the idem spans under its request span,
// by name ("idem.claim:acquired" for a claim).
type request struct {
	spans   []string
	orphans int // idem spans whose parent is not the request span
}

// requests groups the recorded idem spans by their request (their trace).
func (b *bundle) requests(t *testing.T) map[trace.TraceID]*request {
	t.Helper()
	roots := map[trace.TraceID]trace.SpanID{}
	ops := map[trace.SpanID]bool{} // idem.operation spans
	all := b.spans.GetSpans()
	for _, s := range all {
		switch s.Name {
		case "POST /v1/charges":
			roots[s.SpanContext.TraceID()] = s.SpanContext.SpanID()
		case "idem.operation":
			ops[s.SpanContext.SpanID()] = true
		}
	}
	out := map[trace.TraceID]*request{}
	for _, s := range all {
		id := s.SpanContext.TraceID()
		if out[id] == nil {
			out[id] = &request{}
		}
		r := out[id]
		switch {
		case s.Name == "charge the card":
			if !ops[s.Parent.SpanID()] {
				t.Errorf("the handler's span is not a child of idem.operation")
			}
			continue
		case !strings.HasPrefix(s.Name, "idem."):
			continue
		}
		name := s.Name
		for _, a := range s.Attributes {
			if a.Key == idemotel.OutcomeKey || a.Key == idemotel.CompletionResultKey || a.Key == idemotel.ReleaseResultKey {
				name += ":" + a.Value.AsString()
			}
		}
		r.spans = append(r.spans, name)
		if s.Parent.SpanID() != roots[id] {
			r.orphans++
		}
	}
	return out
}

// One claim span and one completion span per executed request, both children of the
// request's span, and the handler's span under idem.operation; a replay, a reused
// key and a request in progress have a claim span only; a release has a release
// span.
func TestSpansOfEachRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const executed = 5
	for i := range executed {
		if got := b.send(keyOf(i), chargeBody(i)); got != http.StatusCreated {
			t.Fatalf("charge %d: %d", i, got)
		}
	}
	for i := range executed {
		b.send(keyOf(i), chargeBody(i)) // replays
	}
	b.send(keyOf(0), chargeBody(99)) // key reused
	b.send(keyOf(10), chargeBody(10), "X-Unavailable", "1")
	done := make(chan int)
	go func() { done <- b.send(keyOf(11), chargeBody(11), "X-Hold", "1") }()
	<-b.entered
	if got := b.send(keyOf(11), chargeBody(11)); got != http.StatusConflict {
		t.Fatalf("duplicate of a request in flight: %d, want 409", got)
	}
	close(b.gate)
	<-done

	kinds := map[string]int{}
	for _, r := range b.requests(t) {
		if r.orphans > 0 {
			t.Errorf("request with spans %v: %d idem spans are not children of the request's span", r.spans, r.orphans)
		}
		kinds[strings.Join(r.spans, " ")]++
	}
	want := map[string]int{
		"idem.claim:acquired idem.operation idem.complete:stored": executed + 1,
		"idem.claim:replayed":    executed,
		"idem.claim:key_reused":  1,
		"idem.claim:in_progress": 1,
		"idem.claim:acquired idem.operation idem.release:released": 1,
	}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("requests by their idem spans (in the order they ended):\n  %v\nwant\n  %v", kinds, want)
	}
}

// No span, span event or metric names a key, the token or the body in any attribute
// (nor in a span's name or status).
func TestNoKeyTokenOrBodyInAnyAttribute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 3 {
		b.send(keyOf(i), chargeBody(i))
		b.send(keyOf(i), chargeBody(i))
	}
	b.send(keyOf(0), chargeBody(7))
	b.send(keyOf(5), chargeBody(5), "X-Unavailable", "1")

	var values []string
	add := func(where string, attrs ...attribute.KeyValue) {
		for _, a := range attrs {
			values = append(values, where+" "+string(a.Key)+"="+a.Value.Emit())
		}
	}
	spans := b.spans.GetSpans()
	for _, s := range spans {
		add("span "+s.Name, s.Attributes...)
		add("span "+s.Name, attribute.String("name", s.Name), attribute.String("status", s.Status.Description))
		for _, e := range s.Events {
			add("event "+e.Name, e.Attributes...)
		}
	}
	points := b.points(t)
	for _, p := range points {
		add("metric "+p.name, p.attrs.ToSlice()...)
	}
	if len(spans) < 10 || len(points) < 5 {
		t.Fatalf("%d spans and %d metric points: the scan would prove nothing", len(spans), len(points))
	}
	secrets := []string{token, "SECRET", card, "amount"}
	for i := range 6 {
		secrets = append(secrets, keyOf(i))
	}
	for _, v := range values {
		for _, s := range secrets {
			if strings.Contains(v, s) {
				t.Errorf("%s reveals %q", v, s)
			}
		}
	}
}

// The metrics count claims by outcome, completions and releases by result, and store
// calls by operation.
func TestMetricsCountEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 4 {
		b.send(keyOf(i), chargeBody(i))
	}
	b.send(keyOf(0), chargeBody(0))
	b.send(keyOf(1), chargeBody(1))
	b.send(keyOf(9), chargeBody(9), "X-Unavailable", "1")

	got := map[string]int64{}
	for _, p := range b.points(t) {
		if strings.HasSuffix(p.name, ".duration") && p.unit != "s" {
			t.Errorf("%s: unit %q, want s", p.name, p.unit)
		}
		got[p.name+label(p.attrs)] += p.value
	}
	want := map[string]int64{
		"idem.claims{acquired}":         5,
		"idem.claims{replayed}":         2,
		"idem.completions{stored}":      4,
		"idem.releases{released}":       1,
		"idem.store.duration{claim}":    7,
		"idem.store.duration{complete}": 4,
		"idem.store.duration{release}":  1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
}

// label names a data point by its one idem-specific attribute besides the route.
func label(set attribute.Set) string {
	for _, k := range []attribute.Key{idemotel.OutcomeKey, idemotel.CompletionResultKey, idemotel.ReleaseResultKey, idemotel.StoreOperationKey} {
		if v, ok := set.Value(k); ok {
			return "{" + v.AsString() + "}"
		}
	}
	return ""
}

// point is one data point of a counter (its value) or a histogram (its count).
type point struct {
	name, unit string
	attrs      attribute.Set
	value      int64
}

// points collects the metrics, failing on a scope other than the package's.
func (b *bundle) points(t *testing.T) []point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := b.metrics.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []point
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != idemotel.ScopeName {
			t.Errorf("scope %q, want %q", sm.Scope.Name, idemotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out = append(out, point{m.Name, m.Unit, p.Attributes, p.Value})
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out = append(out, point{m.Name, m.Unit, p.Attributes, int64(p.Count)})
				}
			default:
				t.Errorf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// A failed renewal and a lost lease are events on the caller's span, and counted.
func TestRenewalFailuresAndLostLeasesAreEventsOfTheCallersSpan(t *testing.T) {
	t.Parallel()
	tel, tp, spans, reader := newTelemetry(t)
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	ob := tel.Observer()
	ob.RenewalFailed(observe.RenewalEvent{Context: ctx, Route: "charges", Err: fmt.Errorf("renew: %w", context.DeadlineExceeded)})
	ob.RenewalFailed(observe.RenewalEvent{Context: ctx, Route: "charges", Err: idem.ErrLeaseLost})
	ob.LeaseLost(observe.LeaseLostEvent{Context: ctx, Route: "charges", Cause: observe.LeaseTakenOver})
	span.End()
	got := spans.GetSpans()
	if len(got) != 1 {
		t.Fatalf("%d spans, want the request's only", len(got))
	}
	events := spanEvents(got[0])
	want := []string{
		"idem.renewal_failed idem.route=charges error.type=timeout",
		"idem.renewal_failed idem.route=charges error.type=lease_lost",
		"idem.lease_lost idem.route=charges idem.lease_lost.cause=taken_over",
	}
	if strings.Join(events, "\n") != strings.Join(want, "\n") {
		t.Errorf("events of the request's span:\n%s\nwant\n%s", strings.Join(events, "\n"), strings.Join(want, "\n"))
	}
	counts := counterSums(t, reader)
	if counts["idem.lease.renewal_failures"] != 2 || counts["idem.leases.lost"] != 1 {
		t.Errorf("counts %v, want 2 renewal failures and 1 lost lease", counts)
	}
}

// A step is an event on the caller's span, counted by result; a completer's resume is
// a span of its own (when something ran), counted by result.
func TestStepsAreEventsOfTheCallersSpanAndResumesAreSpans(t *testing.T) {
	t.Parallel()
	tel, tp, spans, reader := newTelemetry(t)
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	ob := tel.Observer()
	ob.Step(observe.StepEvent{Context: ctx, Route: "charges", Step: "charge_pending", Result: observe.StepCommitted})
	ob.Step(observe.StepEvent{Context: ctx, Route: "charges", Step: "charge_pending", Result: observe.StepLeaseLost, Err: idem.ErrLeaseLost})
	span.End()
	ob.Resumed(observe.ResumeEvent{Context: context.Background(), Route: "charges", RecoveryPoint: "charge_pending",
		Result: observe.ResumeFailed, Duration: time.Second, Err: errors.New("processor down")})
	ob.Resumed(observe.ResumeEvent{Context: context.Background(), Route: "charges", Result: observe.ResumeNoFunction})

	got := spans.GetSpans()
	if len(got) != 2 || got[0].Name != "request" || got[1].Name != "idem.resume" {
		t.Fatalf("spans %v, want the request's and one idem.resume", got)
	}
	events := spanEvents(got[0])
	want := []string{
		"idem.step idem.route=charges idem.step.name=charge_pending idem.step.result=committed",
		"idem.step idem.route=charges idem.step.name=charge_pending idem.step.result=lease_lost error.type=lease_lost",
	}
	if strings.Join(events, "\n") != strings.Join(want, "\n") {
		t.Errorf("events of the request's span:\n%s\nwant\n%s", strings.Join(events, "\n"), strings.Join(want, "\n"))
	}
	resume := got[1]
	if resume.Status.Code != codes.Error || resume.EndTime.Sub(resume.StartTime) < time.Second {
		t.Errorf("idem.resume: status %v, %v long; want Error, the resume's second", resume.Status, resume.EndTime.Sub(resume.StartTime))
	}
	for _, a := range resume.Attributes {
		if a.Key == idemotel.RecoveryPointKey && a.Value.AsString() != "charge_pending" {
			t.Errorf("idem.resume's recovery point = %q", a.Value.AsString())
		}
	}
	counts := counterSums(t, reader, idemotel.StepResultKey, idemotel.ResumeResultKey)
	wantCounts := map[string]int64{"idem.steps{committed}": 1, "idem.steps{lease_lost}": 1, "idem.resumes{failed}": 1, "idem.resumes{no_function}": 1}
	if fmt.Sprint(counts) != fmt.Sprint(wantCounts) {
		t.Errorf("counts %v, want %v", counts, wantCounts)
	}
}

// A completer's count of unfinished operations is two gauges, the last count winning.
func TestUnfinishedOperationsAreGauges(t *testing.T) {
	t.Parallel()
	tel, _, _, reader := newTelemetry(t)
	ob := tel.Observer()
	ob.Unfinished(observe.UnfinishedEvent{Context: context.Background(), Count: 5, OldestAge: time.Hour})
	ob.Unfinished(observe.UnfinishedEvent{Context: context.Background(), Count: 2, OldestAge: 90 * time.Second})
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		switch d := m.Data.(type) {
		case metricdata.Gauge[int64]:
			got[m.Name+" "+m.Unit] = float64(d.DataPoints[0].Value)
		case metricdata.Gauge[float64]:
			got[m.Name+" "+m.Unit] = d.DataPoints[0].Value
		}
	}
	want := map[string]float64{"idem.unfinished.operations {operation}": 2, "idem.unfinished.oldest_age s": 90}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("gauges %v, want %v", got, want)
	}
}

// newTelemetry returns telemetry recording spans and metrics in memory, and its tracer
// provider.
func newTelemetry(t *testing.T) (*idemotel.Telemetry, *sdktrace.TracerProvider, *tracetest.InMemoryExporter, *sdkmetric.ManualReader) {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	reader := sdkmetric.NewManualReader()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	tel, err := idemotel.New(idemotel.WithTracerProvider(tp),
		idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	return tel, tp, spans, reader
}

// spanEvents returns the events of span, each as its name and its attributes.
func spanEvents(span tracetest.SpanStub) []string {
	var events []string
	for _, e := range span.Events {
		s := e.Name
		for _, a := range e.Attributes {
			s += " " + string(a.Key) + "=" + a.Value.Emit()
		}
		events = append(events, s)
	}
	return events
}

// counterSums sums the counters' data points by name, and by the value of the first of
// keys a point has ("idem.steps{committed}").
func counterSums(t *testing.T, reader *sdkmetric.ManualReader, keys ...attribute.Key) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
			name := m.Name
			for _, k := range keys {
				if v, ok := p.Attributes.Value(k); ok {
					name += "{" + v.AsString() + "}"
					break
				}
			}
			counts[name] += p.Value
		}
	}
	return counts
}
