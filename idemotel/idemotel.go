// Package idemotel reports what idem does as OpenTelemetry spans and metrics (SPEC
// §15), built on [observe.Observer], as go-redis' redisotel is built on its hooks.
//
//	tel, err := idemotel.New() // the global TracerProvider and MeterProvider
//	if err != nil { ... }
//	mw := idem.New(idem.Config{Store: st, Scope: scope, Observer: tel.Observer()})
//	http.Handle("POST /v1/charges", otelhttp.NewHandler(mw.Handler(tel.Handler(charges)), "charges"))
//
// To tell an observer of your own too (or idemprom's), join them with
// [observe.Multi].
//
// # Spans
//
// Each span is a child of the span in the caller's context (the request's, say from
// otelhttp, or the one given to [idem.Do]):
//
//	idem.claim      every claim, over its store calls and any in-flight wait:
//	                idem.route, idem.claim.outcome, idem.claim.waited; status Error
//	                with error.type for store_error
//	idem.operation  the handler under an acquired claim ([Telemetry.Handler]): the
//	                parent of the handler's own spans; idem.route, idem.took_over
//	idem.complete   the storing of an executed operation's result, over its store call
//	                (instant in a SPEC §7 transaction, whose own span covers it):
//	                idem.route, idem.completion.result, idem.completion.in_tx,
//	                idem.completion.expired; status Error for lease_lost and failed
//	idem.release    the release of a key, over its store call: idem.route,
//	                idem.release.result; status Error when the store failed
//	idem.resume     a Completer's resume of a record (SPEC §13), from its takeover to
//	                its completion: idem.route (the operation), idem.resume.result
//	                (resumed or failed), idem.recovery_point; status Error when it
//	                failed. A child of the span in the completer's context, if any.
//
// A replay has an idem.claim span only. A failed lease renewal, a lost lease and a
// step of a resumable operation are events on the caller's span (idem.renewal_failed
// with error.type; idem.lease_lost with idem.lease_lost.cause; idem.step with
// idem.step.name, idem.step.result and, when it failed, error.type). Store calls are
// metrics, not spans.
//
// # Metrics
//
//	idem.claims                {claim}   idem.route, idem.claim.outcome
//	idem.completions           {completion} idem.route, idem.completion.result
//	idem.completions.expired   {completion} idem.route: stored after their TTL ran out
//	idem.releases              {release} idem.route, idem.release.result
//	idem.lease.renewal_failures {renewal} idem.route, error.type
//	idem.leases.lost           {lease}   idem.route, idem.lease_lost.cause
//	idem.steps                 {step}    idem.route, idem.step.result: committed, saved
//	                                     (returned without running: a resume),
//	                                     lease_lost, failed
//	idem.resumes               {resume}  idem.route, idem.resume.result: resumed,
//	                                     failed, taken, no_function
//	idem.unfinished.operations {operation} the store's unfinished operations (SPEC
//	                                     §13), as a Completer's last pass counted them
//	                                     (gauge)
//	idem.unfinished.oldest_age s         the oldest one's age, 0 when none (gauge)
//	idem.store.duration        s         idem.store.operation, and error.type when the
//	                                     call failed (histogram)
//
// The values are those of package idemprom's labels. No key, body or token is ever an
// attribute: the events carry none, and error texts are never recorded (error.type is
// lease_lost, timeout, canceled or error).
package idemotel

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/telemetry"
	"github.com/idem-go/idem/observe"
)

// ScopeName is the instrumentation scope of the package's tracer and meter.
const ScopeName = "github.com/idem-go/idem/idemotel"

// The attribute keys of the package's spans and metrics.
const (
	RouteKey            = attribute.Key("idem.route")
	OutcomeKey          = attribute.Key("idem.claim.outcome")
	WaitedKey           = attribute.Key("idem.claim.waited")
	TookOverKey         = attribute.Key("idem.took_over")
	CompletionResultKey = attribute.Key("idem.completion.result")
	InTxKey             = attribute.Key("idem.completion.in_tx")
	ExpiredKey          = attribute.Key("idem.completion.expired")
	ReleaseResultKey    = attribute.Key("idem.release.result")
	LeaseLostCauseKey   = attribute.Key("idem.lease_lost.cause")
	StepNameKey         = attribute.Key("idem.step.name")
	StepResultKey       = attribute.Key("idem.step.result")
	ResumeResultKey     = attribute.Key("idem.resume.result")
	RecoveryPointKey    = attribute.Key("idem.recovery_point")
	StoreOperationKey   = attribute.Key("idem.store.operation")
	// ErrorTypeKey is OpenTelemetry's error.type: lease_lost, timeout, canceled or
	// error.
	ErrorTypeKey = attribute.Key("error.type")
)

// StoreDurationBuckets are the bucket boundaries of idem.store.duration, in seconds:
// 0.5 ms to 5 s (the default store timeout).
var StoreDurationBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// An Option configures [New].
type Option func(*config)

type config struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// WithTracerProvider sets the provider of the spans' tracer. Defaults to the global
// provider (otel.GetTracerProvider) at the time of New.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the provider of the metrics' meter. Defaults to the global
// provider (otel.GetMeterProvider) at the time of New.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// Telemetry turns idem's observer events into spans and metrics. Build it with [New];
// it is safe for concurrent use, and several middlewares and guards may share it.
type Telemetry struct {
	tracer trace.Tracer

	claims          metric.Int64Counter
	completions     metric.Int64Counter
	expired         metric.Int64Counter
	releases        metric.Int64Counter
	renewalFailures metric.Int64Counter
	leasesLost      metric.Int64Counter
	steps           metric.Int64Counter
	resumes         metric.Int64Counter
	unfinished      metric.Int64Gauge
	oldest          metric.Float64Gauge
	storeDuration   metric.Float64Histogram

	observer *observe.Observer
}

// New returns the telemetry of the providers opts name (the global ones by default).
// It fails only when the meter refuses an instrument.
func New(opts ...Option) (*Telemetry, error) {
	c := config{}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	meter := c.mp.Meter(ScopeName)
	t := &Telemetry{tracer: c.tp.Tracer(ScopeName)}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		m, err := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return m
	}
	t.claims = counter("idem.claims", "{claim}", "Claims of an idempotency key, by outcome.")
	t.completions = counter("idem.completions", "{completion}", "Ends of executed operations that stored their result or failed to, by result.")
	t.expired = counter("idem.completions.expired", "{completion}", "Results stored after their record's TTL ran out: a retry executes the operation again.")
	t.releases = counter("idem.releases", "{release}", "Keys released so that a retry executes afresh, by result.")
	t.renewalFailures = counter("idem.lease.renewal_failures", "{renewal}", "Lease renewals that failed, by error type.")
	t.leasesLost = counter("idem.leases.lost", "{lease}", "Operations cancelled because their lease was lost, by cause.")
	t.steps = counter("idem.steps", "{step}", "Steps of resumable operations, by result.")
	t.resumes = counter("idem.resumes", "{resume}", "Records a completer found resumable, by what it did with them.")
	var err error
	t.unfinished, err = meter.Int64Gauge("idem.unfinished.operations", metric.WithUnit("{operation}"),
		metric.WithDescription("Unfinished operations in the store (in flight after a step committed; they never expire), as a completer's last pass counted them."))
	errs = append(errs, err)
	t.oldest, err = meter.Float64Gauge("idem.unfinished.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unfinished operation in the store, 0 when none."))
	errs = append(errs, err)
	t.storeDuration, err = meter.Float64Histogram("idem.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Durations of the store calls idem makes, by operation."),
		metric.WithExplicitBucketBoundaries(StoreDurationBuckets...))
	errs = append(errs, err)
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	t.observer = &observe.Observer{
		Claimed:       t.claimed,
		Completed:     t.completed,
		Released:      t.released,
		RenewalFailed: t.renewalFailed,
		LeaseLost:     t.leaseLost,
		StoreCall:     t.storeCall,
		Step:          t.step,
		Resumed:       t.resumed,
		Unfinished:    t.unfinishedOps,
	}
	return t, nil
}

// Observer returns the observer that makes the spans and metrics, for
// [idem.Config.Observer] or [idem.GuardConfig.Observer] (or [observe.Multi]).
// Every call returns the same one.
func (t *Telemetry) Observer() *observe.Observer { return t.observer }

// Handler wraps the handler behind the idem middleware in an idem.operation span
// when the request runs under an acquired claim (the handler's context carries its
// [idem.Handle]), so that the handler's own spans are its children; other requests
// (no key, or the middleware off) run without one. The route is the request's
// ServeMux pattern.
func (t *Telemetry) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := idem.FromContext(r.Context())
		if h == nil {
			next.ServeHTTP(w, r)
			return
		}
		ctx, span := t.tracer.Start(r.Context(), "idem.operation", trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(RouteKey.String(r.Pattern), TookOverKey.Bool(h.TookOver())))
		defer span.End()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// span records a span named name that began d ago and ends now, as a child of the
// span in ctx.
func (t *Telemetry) span(ctx context.Context, name string, d time.Duration, attrs ...attribute.KeyValue) trace.Span {
	now := time.Now()
	_, span := t.tracer.Start(ctxOf(ctx), name, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(now.Add(-d)), trace.WithAttributes(attrs...))
	return span
}

// end ends span now, with status Error and error.type when err is not nil.
func end(span trace.Span, err error) {
	if err != nil {
		kind := telemetry.ErrorKind(err)
		span.SetAttributes(ErrorTypeKey.String(kind))
		span.SetStatus(codes.Error, kind) // never err's text, which may hold anything
	}
	span.End()
}

func (t *Telemetry) claimed(e observe.ClaimEvent) {
	route, outcome := RouteKey.String(e.Route), OutcomeKey.String(string(e.Outcome))
	end(t.span(e.Context, "idem.claim", e.Duration, route, outcome, WaitedKey.Bool(e.Waited)), e.Err)
	t.claims.Add(ctxOf(e.Context), 1, metric.WithAttributes(route, outcome))
}

func (t *Telemetry) completed(e observe.CompletionEvent) {
	route, result := RouteKey.String(e.Route), CompletionResultKey.String(string(e.Result))
	end(t.span(e.Context, "idem.complete", e.StoreDuration, route, result, InTxKey.Bool(e.InTx),
		ExpiredKey.Bool(e.Expired)), e.Err)
	ctx := ctxOf(e.Context)
	t.completions.Add(ctx, 1, metric.WithAttributes(route, result))
	if e.Expired {
		t.expired.Add(ctx, 1, metric.WithAttributes(route))
	}
}

func (t *Telemetry) released(e observe.ReleaseEvent) {
	route, result := RouteKey.String(e.Route), ReleaseResultKey.String(telemetry.ReleaseResult(e.Err))
	var failure error
	if telemetry.StoreFailed(e.Err) {
		failure = e.Err
	}
	end(t.span(e.Context, "idem.release", e.StoreDuration, route, result), failure)
	t.releases.Add(ctxOf(e.Context), 1, metric.WithAttributes(route, result))
}

func (t *Telemetry) renewalFailed(e observe.RenewalEvent) {
	ctx := ctxOf(e.Context)
	attrs := []attribute.KeyValue{RouteKey.String(e.Route), ErrorTypeKey.String(telemetry.ErrorKind(e.Err))}
	trace.SpanFromContext(ctx).AddEvent("idem.renewal_failed", trace.WithAttributes(attrs...))
	t.renewalFailures.Add(ctx, 1, metric.WithAttributes(attrs...))
}

func (t *Telemetry) leaseLost(e observe.LeaseLostEvent) {
	ctx := ctxOf(e.Context)
	attrs := []attribute.KeyValue{RouteKey.String(e.Route), LeaseLostCauseKey.String(string(e.Cause))}
	trace.SpanFromContext(ctx).AddEvent("idem.lease_lost", trace.WithAttributes(attrs...))
	t.leasesLost.Add(ctx, 1, metric.WithAttributes(attrs...))
}

func (t *Telemetry) step(e observe.StepEvent) {
	ctx := ctxOf(e.Context)
	route, result := RouteKey.String(e.Route), StepResultKey.String(string(e.Result))
	attrs := []attribute.KeyValue{route, StepNameKey.String(e.Step), result}
	if e.Err != nil {
		attrs = append(attrs, ErrorTypeKey.String(telemetry.ErrorKind(e.Err)))
	}
	trace.SpanFromContext(ctx).AddEvent("idem.step", trace.WithAttributes(attrs...))
	t.steps.Add(ctx, 1, metric.WithAttributes(route, result))
}

func (t *Telemetry) resumed(e observe.ResumeEvent) {
	route, result := RouteKey.String(e.Route), ResumeResultKey.String(string(e.Result))
	if e.Result == observe.ResumeResumed || e.Result == observe.ResumeFailed {
		end(t.span(e.Context, "idem.resume", e.Duration, route, result, RecoveryPointKey.String(e.RecoveryPoint)), e.Err)
	}
	t.resumes.Add(ctxOf(e.Context), 1, metric.WithAttributes(route, result))
}

func (t *Telemetry) unfinishedOps(e observe.UnfinishedEvent) {
	ctx := ctxOf(e.Context)
	t.unfinished.Record(ctx, int64(e.Count))
	t.oldest.Record(ctx, e.OldestAge.Seconds())
}

func (t *Telemetry) storeCall(e observe.StoreCallEvent) {
	op := StoreOperationKey.String(string(e.Op))
	attrs := metric.WithAttributes(op)
	if telemetry.StoreFailed(e.Err) {
		attrs = metric.WithAttributes(op, ErrorTypeKey.String(telemetry.ErrorKind(e.Err)))
	}
	t.storeDuration.Record(ctxOf(e.Context), e.Duration.Seconds(), attrs)
}

// ctxOf is an event's context, or the background for an event built by hand.
func ctxOf(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}
