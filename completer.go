package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
)

// ResumeFunc finishes the operation of a record whose holder died (or released it)
// after one of its steps committed, for the [Completer] (SPEC §13). It runs under h,
// which holds the key: h.Context() carries h, its lease is renewed while the function
// runs, h.RecoveryPoint() is the last committed step, and every committed step
// returns its saved result (store/sqlite's Step, store/postgres's Step, [Step]) without
// running again, so the function is usually the operation itself, minus what only a
// request has: it takes its input from the first step's saved result.
//
// The function sets the result to store by ending, as the handler does, with [Finish]
// (the response its function returns is the result), or with [Handle.SetResponse]
// (or [Handle.SetResult], for an operation run with [Do]) before it returns, or
// before the store's SPEC §7 helper completes the record in its final transaction. When it
// returns nil the completer stores that result, so that the client's retry (or none)
// finds the finished operation; when it returns an error (or panics, or sets no
// result) the record is kept, its lease ended, and the completer tries again at a later
// pass, with backoff.
type ResumeFunc func(ctx context.Context, h *Handle) error

// RegisterResume registers fn as the resume function of the operation called name
// ([Call.Name], [RouteOptions.Name]), for the [Completer]s of g; the records it
// completes live the guard's TTL. It panics when name is empty, fn is nil, or name has
// a resume function already. Register every operation before starting a completer;
// [Middleware.Route] registers [RouteOptions.Resume] itself, with the route's TTL.
func (g *Guard) RegisterResume(name string, fn ResumeFunc) {
	g.registerResume(name, fn, g.cfg.TTL, "Guard.RegisterResume")
}

// resumer is a registered resume function and the TTL of the records it completes.
type resumer struct {
	fn  ResumeFunc
	ttl time.Duration
}

// registerResume registers fn under name with the TTL of its operation's records;
// caller names the API, for panics.
func (g *Guard) registerResume(name string, fn ResumeFunc, ttl time.Duration, caller string) {
	if name == "" || fn == nil {
		panic("idem: " + caller + " needs a name and a function")
	}
	g.resumeMu.Lock()
	defer g.resumeMu.Unlock()
	if _, dup := g.resumes[name]; dup {
		panic(fmt.Sprintf("idem: operation %q has a resume function already", name))
	}
	if g.resumes == nil {
		g.resumes = map[string]resumer{}
	}
	g.resumes[name] = resumer{fn: fn, ttl: ttl}
}

// resumer returns what is registered for the operation name (a nil fn when nothing
// is).
func (g *Guard) resumer(name string) resumer {
	g.resumeMu.RLock()
	defer g.resumeMu.RUnlock()
	return g.resumes[name]
}

// CompleterConfig configures a [Completer].
type CompleterConfig struct {
	// Interval is the pause between passes, jittered by ±10% so that the completers of
	// several processes drift apart. Defaults to [DefaultCompleterInterval].
	Interval time.Duration
	// BatchSize bounds how many records one query returns; a pass queries batch after
	// batch until one comes back short. Defaults to [DefaultCompleterBatchSize].
	BatchSize int
	// BatchTimeout bounds each query for resumable records. Defaults to
	// [DefaultCompleterBatchTimeout].
	BatchTimeout time.Duration
	// RetryBackoff is how long a record whose resume failed is left alone before the
	// next attempt; the wait doubles at every failure of the same record, up to
	// MaxRetryBackoff, jittered by ±10%. Defaults to [DefaultCompleterRetryBackoff].
	RetryBackoff time.Duration
	// MaxRetryBackoff caps the wait between attempts on one record: however long
	// its operation stays unfinished, it is tried again at least this often. Defaults
	// to [DefaultCompleterMaxRetryBackoff].
	MaxRetryBackoff time.Duration
	// WarnAfter is the age (since its key was claimed) past which an unfinished
	// operation that this completer failed to finish, or has no resume function for,
	// is logged once at WARN, with its operation, recovery point, record id, attempts
	// and last error. Defaults to [DefaultCompleterWarnAfter].
	WarnAfter time.Duration
	// Logger receives the completer's logs (keys as a short hash). Defaults to the
	// guard's logger.
	Logger *slog.Logger
}

// Completer finishes, in the background, operations whose holder died after one of
// their steps committed (SPEC §13), so that a client that gave up still gets a
// finished operation, and one that retries finds it finished. Each pass lists the
// records whose lease lapsed (or was ended by a release) and whose recovery point
// advanced, in bounded batches, however long ago their TTL ran out (an unfinished
// operation never expires); takes each over with the claim of SPEC §5, which one
// process wins when several completers (or a completer and a client's retry) race;
// runs the resume function registered under the record's operation name
// ([Guard.RegisterResume]) with a [Handle] positioned after the last committed step;
// and completes the record with the result the function set.
//
// A Completer never gives up on a record: one whose resume fails is tried again at a
// later pass, after a backoff that doubles at every failure up to MaxRetryBackoff, for
// as long as the record stays unfinished; one whose operation has no resume function
// in this process (or no name) is looked at again on the same schedule, and logged at
// every look, since another process's completer, or the client's retry, may finish
// it. Unfinished operations are visible: one that this completer could not finish is
// logged at WARN once it is older than WarnAfter, and every pass counts the store's
// unfinished operations and the oldest one's age ([CompleterPass], Observer.Unfinished,
// idemprom's idem_unfinished_operations). A Completer runs on the guard's store,
// lease and clock; build it with [NewCompleter] and Run it for the process's life.
// Stores without Capabilities.RecoveryPoints (Redis) have nothing to complete: Run
// returns at once.
type Completer struct {
	g      *Guard
	cfg    CompleterConfig
	passes chan CompleterPass

	// mu serialises passes and guards what they remember of records.
	mu sync.Mutex
	// records holds what passes remember of the records they could not finish: the
	// attempts, when to try again, whether the record was logged as old. A record's
	// entry goes once it is finished here, or not seen for forgetAfter.
	records map[recordRef]*recordState
}

// recordRef identifies one record: (scope, key), the record id and its creation.
// The id alone does not tell two records apart: it is derived from the request, the
// same for every record one request makes (SPEC §13); the creation is new for each.
type recordRef struct {
	scope, key, id string
	created        time.Time
}

// recordState is what a Completer remembers of one record it could not finish.
type recordState struct {
	attempts int       // failed attempts (or looks without a resume function)
	next     time.Time // no attempt before then
	lastErr  error     // of the last failed attempt
	warned   bool      // logged as older than WarnAfter
	seen     time.Time // the last pass that listed it
}

// CompleterPass is what one pass of a [Completer] did.
type CompleterPass struct {
	// Resumed is how many records it resumed and completed.
	Resumed int
	// Failed is how many resumes failed (tried again after a backoff).
	Failed int
	// Skipped is how many resumable records it left alone: taken by another process
	// or a retry first, waiting for their backoff, or without a resume function.
	Skipped int
	// Unfinished is how many unfinished operations the store held after the pass
	// (Store.RecordCountUnfinished: in flight after a step committed, those running
	// now included), and OldestUnfinished how long the oldest of them has existed.
	Unfinished       int
	OldestUnfinished time.Duration
	// Err is the error that ended the pass early (a failed query), or of the count of
	// unfinished operations, or nil.
	Err error
}

// NewCompleter returns a Completer of the operations of g. It panics when cfg has a
// negative field.
func NewCompleter(g *Guard, cfg CompleterConfig) *Completer {
	if g == nil {
		panic("idem: NewCompleter needs a guard")
	}
	for name, d := range map[string]time.Duration{"Interval": cfg.Interval, "BatchTimeout": cfg.BatchTimeout,
		"RetryBackoff": cfg.RetryBackoff, "MaxRetryBackoff": cfg.MaxRetryBackoff, "WarnAfter": cfg.WarnAfter} {
		if d < 0 {
			panic(fmt.Sprintf("idem: CompleterConfig.%s must not be negative, got %v", name, d))
		}
	}
	if cfg.BatchSize < 0 {
		panic(fmt.Sprintf("idem: CompleterConfig.BatchSize must not be negative, got %d", cfg.BatchSize))
	}
	setDefault(&cfg.Interval, DefaultCompleterInterval)
	setDefault(&cfg.BatchSize, DefaultCompleterBatchSize)
	setDefault(&cfg.BatchTimeout, DefaultCompleterBatchTimeout)
	setDefault(&cfg.RetryBackoff, DefaultCompleterRetryBackoff)
	setDefault(&cfg.MaxRetryBackoff, DefaultCompleterMaxRetryBackoff)
	setDefault(&cfg.WarnAfter, DefaultCompleterWarnAfter)
	if cfg.Logger == nil {
		cfg.Logger = g.cfg.Logger
	}
	return &Completer{g: g, cfg: cfg, passes: make(chan CompleterPass, 16), records: map[recordRef]*recordState{}}
}

// Passes receives what every pass of [Completer.Run] did, so that tests wait on a
// pass instead of sleeping. A pass that finds the channel full is not reported;
// nothing needs to read it in production.
func (c *Completer) Passes() <-chan CompleterPass { return c.passes }

// Run completes until ctx ends: a first pass at once, then one after every jittered
// Interval. It returns at once when the store keeps no recovery points
// (Capabilities.RecoveryPoints is false). A resume in progress when ctx ends sees its
// context end; the record is then kept for another pass or process.
func (c *Completer) Run(ctx context.Context) {
	if !c.g.cfg.Store.Capabilities().RecoveryPoints {
		c.cfg.Logger.InfoContext(ctx, "idem: the store keeps no recovery points (SPEC §13); completer not running")
		return
	}
	runPasses(ctx, c.cfg.Interval, func() {
		p := c.Pass(ctx)
		if p.Err != nil && ctx.Err() == nil {
			c.cfg.Logger.WarnContext(ctx, "idem: a completer pass failed; retrying at the next pass", slog.Any("error", p.Err))
		}
		signal(c.passes, p)
	})
}

// Pass resumes the resumable records it finds, batch after batch, until a batch comes
// back short (or ctx ends, or a query fails), then counts the store's unfinished
// operations, and says what it did. Passes of one Completer run one at a time.
func (c *Completer) Pass(ctx context.Context) CompleterPass {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.resumeAll(ctx)
	c.forget()
	if ctx.Err() == nil {
		n, err := c.countUnfinished(ctx)
		switch {
		case err != nil && p.Err == nil:
			p.Err = fmt.Errorf("counting unfinished operations: %w", err)
		case err == nil:
			p.Unfinished, p.OldestUnfinished = n.Count, n.OldestAge()
		}
	}
	return p
}

// resumeAll resumes the resumable records, batch after batch.
func (c *Completer) resumeAll(ctx context.Context) CompleterPass {
	var (
		p     CompleterPass
		after recordRef
	)
	for {
		if err := ctx.Err(); err != nil {
			p.Err = err
			return p
		}
		recs, err := c.list(ctx, after)
		if err != nil {
			p.Err = err
			return p
		}
		for _, rec := range recs {
			switch c.resume(ctx, rec) {
			case resumeDone:
				p.Resumed++
			case resumeFailed:
				p.Failed++
			default:
				p.Skipped++
			}
		}
		if len(recs) < c.cfg.BatchSize {
			return p
		}
		last := recs[len(recs)-1]
		after = recordRef{scope: last.Scope, key: last.Key}
	}
}

// forget drops what passes remember of records not listed for longer than the
// longest wait between two attempts, or WarnAfter: they were finished (or settled)
// elsewhere. A record held by a retry at every pass for a while keeps its entry, so
// that it is not logged as old twice.
func (c *Completer) forget() {
	keep := max(c.cfg.MaxRetryBackoff, c.cfg.WarnAfter)
	now := c.g.localNow()
	for ref, st := range c.records {
		if now.Sub(st.seen) > keep {
			delete(c.records, ref)
		}
	}
}

// list returns one batch of resumable records after the cursor.
func (c *Completer) list(ctx context.Context, after recordRef) ([]*idemstore.Record, error) {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.BatchTimeout)
	defer cancel()
	start := c.callStart()
	recs, err := c.g.cfg.Store.RecordListResumable(lctx, &idemstore.ListResumableParams{
		AfterScope: after.scope, AfterKey: after.key, Limit: c.cfg.BatchSize, Now: c.g.storeNow(),
	})
	c.observeCall(ctx, observe.StoreOpListResumable, start, err)
	return recs, err
}

// countUnfinished counts the store's unfinished operations and tells the observer.
func (c *Completer) countUnfinished(ctx context.Context) (*idemstore.CountUnfinishedResult, error) {
	cctx, cancel := context.WithTimeout(ctx, c.cfg.BatchTimeout)
	defer cancel()
	start := c.callStart()
	n, err := c.g.cfg.Store.RecordCountUnfinished(cctx, &idemstore.CountUnfinishedParams{Now: c.g.storeNow()})
	c.observeCall(ctx, observe.StoreOpCountUnfinished, start, err)
	if err != nil {
		return nil, err
	}
	if ob := c.g.cfg.Observer; ob != nil && ob.Unfinished != nil {
		ob.Unfinished(observe.UnfinishedEvent{Context: context.WithoutCancel(ctx), Count: n.Count, OldestAge: n.OldestAge()})
	}
	return n, nil
}

// callStart is the start of a store call of the completer: the time when there is an
// observer of store calls, zero otherwise (no clock read).
func (c *Completer) callStart() time.Time {
	if ob := c.g.cfg.Observer; ob != nil && ob.StoreCall != nil {
		return time.Now()
	}
	return time.Time{}
}

// observeCall reports the store call op that began at start (zero: not observed).
func (c *Completer) observeCall(ctx context.Context, op observe.StoreOp, start time.Time, err error) {
	if !start.IsZero() {
		c.g.cfg.Observer.StoreCall(observe.StoreCallEvent{Context: context.WithoutCancel(ctx), Op: op, Duration: time.Since(start), Err: err})
	}
}

// observe tells the observer what became of the resumable record rec, whose resume
// began at start (zero when nothing ran).
func (c *Completer) observe(ctx context.Context, h *Handle, rec *idemstore.Record, r observe.ResumeResult, start time.Time, err error) {
	ob := c.g.cfg.Observer
	if ob == nil || ob.Resumed == nil {
		return
	}
	var d time.Duration
	if !start.IsZero() {
		d = time.Since(start)
	}
	ob.Resumed(observe.ResumeEvent{Context: context.WithoutCancel(ctx), Route: rec.Operation, KeyHash: h.keyHash,
		RecoveryPoint: rec.RecoveryPoint, Result: r, Duration: d, Err: err})
}

// resumeOutcome is what resuming one record came to.
type resumeOutcome int

const (
	resumeSkipped resumeOutcome = iota
	resumeDone
	resumeFailed
	// resumeWaiting: the record waits for its backoff, or has no resume function.
	resumeWaiting
)

// resume takes rec over and finishes its operation, unless it must wait for its
// backoff, has no resume function, or another caller got it first. A record it could
// not finish is logged once at WARN when older than WarnAfter.
func (c *Completer) resume(ctx context.Context, rec *idemstore.Record) resumeOutcome {
	ref := recordRef{rec.Scope, rec.Key, rec.ID, rec.CreatedAt.UTC()}
	st := c.records[ref]
	if st == nil {
		st = &recordState{}
		c.records[ref] = st
	}
	st.seen = c.g.localNow()
	// The operation's name is the route of its events, as for the caller that began it.
	h := &Handle{route: rec.Operation, operation: rec.Operation}
	r := c.g.resumer(rec.Operation)
	h.init(c.g, ctx, rec.Scope, rec.Key, rec.Fingerprint, r.ttl)
	o := c.attempt(ctx, h, rec, st, r.fn)
	switch o {
	case resumeDone:
		delete(c.records, ref)
	case resumeFailed, resumeWaiting:
		c.warnIfOld(ctx, h, rec, st)
	}
	return o
}

// attempt runs one attempt at rec, unless it waits for its backoff.
func (c *Completer) attempt(ctx context.Context, h *Handle, rec *idemstore.Record, st *recordState, fn ResumeFunc) resumeOutcome {
	g := c.g
	if g.localNow().Before(st.next) {
		return resumeWaiting
	}
	if fn == nil {
		c.failed(st, errNoResumeFunction)
		c.cfg.Logger.WarnContext(ctx, "idem: an unfinished operation (a step committed, no holder) has no resume function here; "+
			"it waits for the client's retry or another process's completer, and this one looks again later "+
			"(register one with Guard.RegisterResume or RouteOptions.Resume)",
			h.attrs(slog.String("operation", rec.Operation), slog.String("recovery_point", rec.RecoveryPoint),
				slog.Time("next_look", st.next))...)
		c.observe(ctx, h, rec, observe.ResumeNoFunction, time.Time{}, nil)
		return resumeWaiting
	}
	start := h.storeCallStart() // zero without an observer: no clock read
	res, err := h.claimKey(ctx, time.Time{})
	if err != nil {
		c.cfg.Logger.WarnContext(ctx, "idem: the completer's claim failed", h.attrs(slog.Any("error", err))...)
		c.observe(ctx, h, rec, observe.ResumeFailed, start, err)
		return c.failed(st, err)
	}
	switch {
	case res.Outcome != idemstore.ClaimAcquired:
		c.observe(ctx, h, rec, observe.ResumeTaken, time.Time{}, nil)
		return resumeSkipped // completed, or held, by a retry or another completer
	case !res.TookOver:
		// The record went (completed and expired, or settled by an operator) between
		// the list and the claim, which claimed the key afresh: give that back to the
		// client's next request.
		h.claimed = res.Record
		_ = h.release()
		return resumeSkipped
	}
	opened, err := h.open(ctx, res.Record)
	if err != nil {
		_ = h.release() // keeps the record, whose recovery point advanced
		c.cfg.Logger.ErrorContext(ctx, "idem: the completer cannot open a sealed record; it is kept and never run again until its key is configured",
			h.attrs(slog.String("operation", rec.Operation), slog.Any("error", err))...)
		c.observe(ctx, h, rec, observe.ResumeFailed, start, err)
		return c.failed(st, err)
	}
	h.acquired(opened)
	h.start(ctx)
	msg := "idem: resuming an operation whose holder's lease lapsed after a step committed"
	if res.Released {
		msg = "idem: resuming an operation its holder released after a step committed"
	}
	c.cfg.Logger.InfoContext(ctx, msg,
		h.attrs(slog.String("operation", rec.Operation), slog.String("recovery_point", res.Record.RecoveryPoint))...)
	if err := c.run(fn, h); err != nil {
		c.cfg.Logger.WarnContext(ctx, "idem: resuming an operation failed; the record is kept and tried again later",
			h.attrs(slog.String("operation", rec.Operation), slog.Any("error", err))...)
		c.observe(ctx, h, rec, observe.ResumeFailed, start, err)
		return c.failed(st, err)
	}
	c.observe(ctx, h, rec, observe.ResumeResumed, start, nil)
	return resumeDone
}

// errNoResumeFunction is the last error of a record whose operation has no resume
// function in this process.
var errNoResumeFunction = errors.New("idem: no resume function registered for the operation in this process")

// warnIfOld logs, once per record, an unfinished operation older than WarnAfter that
// this completer could not finish.
func (c *Completer) warnIfOld(ctx context.Context, h *Handle, rec *idemstore.Record, st *recordState) {
	age := c.g.localNow().Sub(rec.CreatedAt)
	if st.warned || age < c.cfg.WarnAfter {
		return
	}
	st.warned = true
	c.cfg.Logger.WarnContext(ctx, "idem: an operation is still unfinished after the completer's WarnAfter; it never expires, and is tried again "+
		"until it completes or an operator settles it (idem keys list --state unfinished, idem keys resolve)",
		h.attrs(slog.String("operation", rec.Operation), slog.String("recovery_point", rec.RecoveryPoint),
			slog.String("record_id", rec.ID), slog.Duration("age", age.Round(time.Second)),
			slog.Int("attempts", st.attempts), slog.Any("last_error", st.lastErr))...)
}

// errNoResult is the failure of a resume function that set no result.
var errNoResult = errors.New("idem: the resume function returned without setting a result (Handle.SetResponse or Handle.SetResult)")

// run runs fn under h and ends the claim: it stores the result fn set, or releases
// the key (keeping the record, whose recovery point advanced) when fn failed.
func (c *Completer) run(fn ResumeFunc, h *Handle) (err error) {
	_, _ = h.end()
	defer h.cancel(nil)
	defer func() {
		if p := recover(); p != nil {
			_ = h.abort()
			err = fmt.Errorf("idem: the resume function panicked: %v", p)
		}
	}()
	if err := fn(h.Context(), h); err != nil {
		_ = h.abort()
		return err
	}
	switch end, err := h.finish(); end {
	case endStored:
		return nil
	case endReleased, endUnknown:
		return errNoResult
	default:
		return err
	}
}

// failed notes a failed attempt at a record (err) and when to try it again: after
// RetryBackoff, doubled at every failure, at most MaxRetryBackoff, jittered.
func (c *Completer) failed(st *recordState, err error) resumeOutcome {
	st.attempts++
	st.lastErr = err
	wait := c.cfg.RetryBackoff << min(st.attempts-1, 20)
	if wait <= 0 || wait > c.cfg.MaxRetryBackoff {
		wait = c.cfg.MaxRetryBackoff
	}
	st.next = c.g.localNow().Add(jitter(wait))
	return resumeFailed
}
