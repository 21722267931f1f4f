package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ResumeFunc finishes the operation of a record whose holder died (or released it)
// after one of its steps committed, for the [Completer] (SPEC §13). It runs under h,
// which holds the key: h.Context() carries h, its lease is renewed while the function
// runs, h.RecoveryPoint() is the last committed step, and every committed step
// returns its saved result (store/sqlite's Step, store/postgres's Step, [Step]) without
// running again, so the function is usually the operation itself, minus what only a
// request has: it takes its input from the first step's saved result.
//
// The function sets the result to store with [Handle.SetResponse] (or
// [Handle.SetResult], for an operation run with [Do]) before it returns, or before the
// store's SPEC §7 helper completes the record in its final transaction. When it
// returns nil the completer stores that result, so that the client's retry (or none)
// finds the finished operation; when it returns an error (or panics, or sets no
// result) the record is kept, its lease ended, and the completer tries again at a later
// pass, with backoff.
type ResumeFunc func(ctx context.Context, h *Handle) error

// RegisterResume registers fn as the resume function of the operation called name
// ([Call.Name], [RouteOptions.Name]), for the [Completer]s of g. It panics when name
// is empty, fn is nil, or name has a resume function already. Register every
// operation before starting a completer; [Middleware.Route] registers
// [RouteOptions.Resume] itself.
func (g *Guard) RegisterResume(name string, fn ResumeFunc) {
	if name == "" || fn == nil {
		panic("idem: Guard.RegisterResume needs a name and a function")
	}
	g.resumeMu.Lock()
	defer g.resumeMu.Unlock()
	if _, dup := g.resumes[name]; dup {
		panic(fmt.Sprintf("idem: operation %q has a resume function already", name))
	}
	if g.resumes == nil {
		g.resumes = map[string]ResumeFunc{}
	}
	g.resumes[name] = fn
}

// resumeFunc returns the resume function registered for the operation name, or nil.
func (g *Guard) resumeFunc(name string) ResumeFunc {
	g.resumeMu.RLock()
	defer g.resumeMu.RUnlock()
	return g.resumes[name]
}

// Defaults of [CompleterConfig].
const (
	// DefaultCompleterInterval is the pause between two passes of a Completer.
	DefaultCompleterInterval = 10 * time.Second
	// DefaultCompleterBatchSize bounds how many records one query of a pass returns.
	DefaultCompleterBatchSize = 100
	// DefaultCompleterBatchTimeout bounds one query for resumable records.
	DefaultCompleterBatchTimeout = 30 * time.Second
	// DefaultCompleterRetryBackoff is how long a record whose resume failed waits
	// before the next attempt; it doubles at every failure.
	DefaultCompleterRetryBackoff = 30 * time.Second
	// DefaultCompleterMaxRetryBackoff caps the wait between attempts on one record.
	DefaultCompleterMaxRetryBackoff = 10 * time.Minute
)

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
	// MaxRetryBackoff caps the wait between attempts on one record. Defaults to
	// [DefaultCompleterMaxRetryBackoff].
	MaxRetryBackoff time.Duration
	// Logger receives the completer's logs (keys as a short hash). Defaults to the
	// guard's logger.
	Logger *slog.Logger
}

// Completer finishes, in the background, operations whose holder died after one of
// their steps committed (SPEC §13), so that a client that gave up still gets a
// finished operation, and one that retries finds it finished. Each pass lists the
// records whose lease lapsed (or was ended by a release) and whose recovery point
// advanced, in bounded batches; takes each over with the claim of SPEC §5, which one
// process wins when several completers (or a completer and a client's retry) race;
// runs the resume function registered under the record's operation name
// ([Guard.RegisterResume]) with a [Handle] positioned after the last committed step;
// and completes the record with the result the function set.
//
// A record whose resume fails is tried again at a later pass, after a backoff that
// doubles at every failure; one whose operation has no resume function in this process
// (or no name) is logged once and left to the client's retry. A Completer runs on the
// guard's store, lease and clock; build it with [NewCompleter] and Run it for the
// process's life. Stores without Capabilities.RecoveryPoints (Redis) have nothing to
// complete: Run returns at once.
type Completer struct {
	g      *Guard
	cfg    CompleterConfig
	passes chan CompleterPass

	// mu serialises passes and guards what they remember of records.
	mu sync.Mutex
	// failing holds the records whose resume failed, with when to try again;
	// unresumable those logged as having no resume function. Both forget records that
	// a pass no longer finds.
	failing     map[recordRef]*resumeFailure
	unresumable map[recordRef]bool
}

// recordRef identifies one record: (scope, key) and the record id, which is new when
// the key starts a new operation.
type recordRef struct{ scope, key, id string }

type resumeFailure struct {
	attempts int
	next     time.Time
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
	// Err is the error that ended the pass early (a failed query), or nil.
	Err error
}

// NewCompleter returns a Completer of the operations of g. It panics when cfg has a
// negative field.
func NewCompleter(g *Guard, cfg CompleterConfig) *Completer {
	if g == nil {
		panic("idem: NewCompleter needs a guard")
	}
	for name, d := range map[string]time.Duration{"Interval": cfg.Interval, "BatchTimeout": cfg.BatchTimeout,
		"RetryBackoff": cfg.RetryBackoff, "MaxRetryBackoff": cfg.MaxRetryBackoff} {
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
	if cfg.Logger == nil {
		cfg.Logger = g.cfg.Logger
	}
	return &Completer{g: g, cfg: cfg, passes: make(chan CompleterPass, 16),
		failing: map[recordRef]*resumeFailure{}, unresumable: map[recordRef]bool{}}
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
			c.cfg.Logger.WarnContext(ctx, "idem: finding resumable records failed; retrying at the next pass", slog.Any("error", p.Err))
		}
		signal(c.passes, p)
	})
}

// Pass resumes the resumable records it finds, batch after batch, until a batch comes
// back short (or ctx ends, or a query fails), and says what it did. Passes of one
// Completer run one at a time.
func (c *Completer) Pass(ctx context.Context) CompleterPass {
	c.mu.Lock()
	defer c.mu.Unlock()
	var (
		p     CompleterPass
		after recordRef
		seen  = map[recordRef]bool{}
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
			ref := recordRef{rec.Scope, rec.Key, rec.ID}
			seen[ref] = true
			switch c.resume(ctx, rec, ref) {
			case resumeDone:
				p.Resumed++
			case resumeFailed:
				p.Failed++
			default:
				p.Skipped++
			}
		}
		if len(recs) < c.cfg.BatchSize {
			break
		}
		last := recs[len(recs)-1]
		after = recordRef{scope: last.Scope, key: last.Key}
	}
	// Forget what the store no longer lists (completed, expired, resumed elsewhere).
	for ref := range c.failing {
		if !seen[ref] {
			delete(c.failing, ref)
		}
	}
	for ref := range c.unresumable {
		if !seen[ref] {
			delete(c.unresumable, ref)
		}
	}
	return p
}

// list returns one batch of resumable records after the cursor.
func (c *Completer) list(ctx context.Context, after recordRef) ([]*Record, error) {
	lctx, cancel := context.WithTimeout(ctx, c.cfg.BatchTimeout)
	defer cancel()
	ob := c.g.cfg.Observer
	var start time.Time
	if ob != nil && ob.StoreCall != nil {
		start = time.Now()
	}
	recs, err := c.g.cfg.Store.RecordListResumable(lctx, &RecordListResumableParams{
		AfterScope: after.scope, AfterKey: after.key, Limit: c.cfg.BatchSize, Now: c.g.storeNow(),
	})
	if !start.IsZero() {
		ob.StoreCall(StoreCallEvent{Context: context.WithoutCancel(ctx), Op: StoreOpListResumable, Duration: time.Since(start), Err: err})
	}
	return recs, err
}

// observe tells the observer what became of the resumable record rec, whose resume
// began at start (zero when nothing ran).
func (c *Completer) observe(ctx context.Context, h *Handle, rec *Record, r ResumeResult, start time.Time, err error) {
	ob := c.g.cfg.Observer
	if ob == nil || ob.Resumed == nil {
		return
	}
	var d time.Duration
	if !start.IsZero() {
		d = time.Since(start)
	}
	ob.Resumed(ResumeEvent{Context: context.WithoutCancel(ctx), Route: rec.Operation, KeyHash: h.keyHash,
		RecoveryPoint: rec.RecoveryPoint, Result: r, Duration: d, Err: err})
}

// resumeOutcome is what resuming one record came to.
type resumeOutcome int

const (
	resumeSkipped resumeOutcome = iota
	resumeDone
	resumeFailed
)

// resume takes rec over and finishes its operation, unless it must wait for its
// backoff, has no resume function, or another caller got it first.
func (c *Completer) resume(ctx context.Context, rec *Record, ref recordRef) resumeOutcome {
	g := c.g
	if f := c.failing[ref]; f != nil && g.localNow().Before(f.next) {
		return resumeSkipped
	}
	// The operation's name is the route of its events, as for the caller that began it.
	h := &Handle{route: rec.Operation, operation: rec.Operation}
	// The record's TTL: a resumable record is in flight and not expired, so its
	// expires_at is created_at + TTL (its lease ended before it).
	h.init(g, ctx, rec.Scope, rec.Key, rec.Fingerprint, rec.ExpiresAt.Sub(rec.CreatedAt))
	fn := g.resumeFunc(rec.Operation)
	if fn == nil {
		if !c.unresumable[ref] {
			c.unresumable[ref] = true
			c.cfg.Logger.WarnContext(ctx, "idem: a record's holder died after a step committed, but its operation has no resume function here; "+
				"it waits for the client's retry (register one with Guard.RegisterResume or RouteOptions.Resume)",
				h.attrs(slog.String("operation", rec.Operation), slog.String("recovery_point", rec.RecoveryPoint))...)
			c.observe(ctx, h, rec, ResumeNoFunction, time.Time{}, nil)
		}
		return resumeSkipped
	}
	start := h.storeCallStart() // zero without an observer: no clock read
	res, err := h.claimKey(ctx, time.Time{})
	if err != nil {
		c.cfg.Logger.WarnContext(ctx, "idem: the completer's claim failed", h.attrs(slog.Any("error", err))...)
		c.observe(ctx, h, rec, ResumeFailed, start, err)
		return c.failed(ref)
	}
	switch {
	case res.Outcome != ClaimAcquired:
		c.observe(ctx, h, rec, ResumeTaken, time.Time{}, nil)
		return resumeSkipped // completed, or held, by a retry or another completer
	case !res.TookOver:
		// The record expired between the list and the claim, which claimed the key
		// afresh: give that back to the client's next request.
		h.claimed = res.Record
		_ = h.release()
		return resumeSkipped
	}
	h.acquired(res.Record)
	h.start(ctx)
	c.cfg.Logger.InfoContext(ctx, "idem: resuming an operation whose holder died after a step committed",
		h.attrs(slog.String("operation", rec.Operation), slog.String("recovery_point", res.Record.RecoveryPoint))...)
	if err := c.run(fn, h); err != nil {
		c.cfg.Logger.WarnContext(ctx, "idem: resuming an operation failed; the record is kept and tried again later",
			h.attrs(slog.String("operation", rec.Operation), slog.Any("error", err))...)
		c.observe(ctx, h, rec, ResumeFailed, start, err)
		return c.failed(ref)
	}
	delete(c.failing, ref)
	c.observe(ctx, h, rec, ResumeResumed, start, nil)
	return resumeDone
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
	case endReleased:
		return errNoResult
	default:
		return err
	}
}

// failed notes a failed resume of ref and when to try it again.
func (c *Completer) failed(ref recordRef) resumeOutcome {
	f := c.failing[ref]
	if f == nil {
		f = &resumeFailure{}
		c.failing[ref] = f
	}
	f.attempts++
	wait := c.cfg.RetryBackoff << min(f.attempts-1, 20)
	if wait <= 0 || wait > c.cfg.MaxRetryBackoff {
		wait = c.cfg.MaxRetryBackoff
	}
	f.next = c.g.localNow().Add(jitter(wait))
	return resumeFailed
}
