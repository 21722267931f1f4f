package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idem-go/idem/idemstore"
)

// CleanerConfig configures a [Cleaner]. [Middleware.CleanerConfig] returns one that
// matches a middleware's Retention, Logger and Clock.
type CleanerConfig struct {
	// Interval is the pause between passes, jittered by ±10% so that the cleaners of
	// several processes drift apart. Defaults to [DefaultCleanerInterval].
	Interval time.Duration
	// BatchSize is how many records the first delete of a pass may remove; later
	// batches are sized by the time they take (BatchTarget), between 1 and 64 times
	// BatchSize, and a Cleaner remembers the size from one pass to the next. Defaults
	// to [DefaultCleanerBatchSize].
	BatchSize int
	// BatchTarget is how long one batch should take, so that no batch holds its locks
	// for long whatever the store's speed and size (issue 41: at 10 million records a
	// batch of fixed size took up to 28 s). A batch that took longer makes the next
	// one smaller in proportion; a full one that took less than half of it makes the
	// next one twice as large. A store that walks its records to find the expired
	// ones (PostgreSQL) also stops each batch's walk after BatchTarget
	// ([idemstore.DeleteExpiredParams].MaxDuration). Defaults to
	// [DefaultCleanerBatchTarget].
	BatchTarget time.Duration
	// Retention keeps records this long after they expire (SPEC §8). Defaults to 0.
	Retention time.Duration
	// BatchTimeout bounds each batch delete: one that runs out of it is cancelled
	// (what it deleted rolls back) and the next is a quarter of its size; a pass
	// fails only when a batch of one record runs out of it. Defaults to
	// [DefaultCleanerBatchTimeout].
	BatchTimeout time.Duration
	// BatchPause is the pause between two batches of one pass, so that requests
	// meet the store between them: a backlog of millions of expired records (a
	// cleaner that was off, a burst a day ago) is deleted without slowing request
	// traffic. Defaults to five times as long as the batch before it took, so that a
	// pass keeps the store busy at most a sixth of the time whatever the store's
	// speed. (Back to back, deleting a million expired records raised the p99 of
	// requests beside it 2.3 times on PostgreSQL and 5 times on SQLite, whose one
	// writer the batches held; deleting 10 million on PostgreSQL raised it 1.7–1.8
	// times with a pause three times the batch, and 1.38 and 0.87 times with five in
	// the two runs whose requests before it were undisturbed: docs/benchmarks.md.)
	BatchPause time.Duration
	// Logger receives the cleaner's logs. Defaults to [slog.Default].
	Logger *slog.Logger
	// Clock, when set, replaces the store's clock (tests only). Defaults to nil: the
	// store's clock decides what expired.
	Clock func() time.Time
}

// Cleaner deletes expired records in bounded batches in the background (SPEC §8). An
// expired record already counts as absent to every request; cleaning only reclaims
// space, so a failed pass is logged and retried at the next one.
type Cleaner struct {
	store  idemstore.Store
	cfg    CleanerConfig
	passes chan int

	mu   sync.Mutex // held by a pass
	size batchSizer
}

// Validate reports the first field of cfg that [NewCleaner] refuses: a negative
// Interval, Retention, BatchTimeout or BatchSize. Store packages that start a cleaner
// from their own Config call it to return an error rather than panic.
func (cfg CleanerConfig) Validate() error {
	if cfg.BatchPause < 0 {
		return fmt.Errorf("idem: CleanerConfig.BatchPause must not be negative, got %v", cfg.BatchPause)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Interval", cfg.Interval}, {"Retention", cfg.Retention}, {"BatchTimeout", cfg.BatchTimeout}, {"BatchTarget", cfg.BatchTarget}} {
		if f.d < 0 {
			return fmt.Errorf("idem: CleanerConfig.%s must not be negative, got %v", f.name, f.d)
		}
	}
	if cfg.BatchSize < 0 {
		return fmt.Errorf("idem: CleanerConfig.BatchSize must not be negative, got %d", cfg.BatchSize)
	}
	return nil
}

// NewCleaner returns a Cleaner of store. It panics when cfg has a negative field
// ([CleanerConfig.Validate]).
//
// The SQL stores start one themselves when they open (sqlite.Config.Cleaner,
// postgres.Config.Cleaner); build one with NewCleaner for a store opened with its
// cleaner disabled, in the one process (or cron job) that is to clean.
func NewCleaner(store idemstore.Store, cfg CleanerConfig) *Cleaner {
	if store == nil {
		panic("idem: NewCleaner needs a store")
	}
	if err := cfg.Validate(); err != nil {
		panic(err.Error())
	}
	setDefault(&cfg.Interval, DefaultCleanerInterval)
	setDefault(&cfg.BatchSize, DefaultCleanerBatchSize)
	setDefault(&cfg.BatchTimeout, DefaultCleanerBatchTimeout)
	setDefault(&cfg.BatchTarget, DefaultCleanerBatchTarget)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Cleaner{store: store, cfg: cfg, passes: make(chan int, 16)}
	c.size = batchSizer{n: cfg.BatchSize, max: 64 * cfg.BatchSize, target: cfg.BatchTarget}
	return c
}

// Passes receives, after every pass of [Cleaner.Run], how many records it deleted, so
// that tests wait on a pass instead of sleeping. A pass that finds the channel full is
// not reported; nothing needs to read it in production.
func (c *Cleaner) Passes() <-chan int { return c.passes }

// Run cleans until ctx ends: a first pass at once, then one after every jittered
// Interval. It returns at once when the store expires records itself
// (Capabilities.BatchedCleanup is false).
func (c *Cleaner) Run(ctx context.Context) {
	if !c.store.Capabilities().BatchedCleanup {
		c.cfg.Logger.DebugContext(ctx, "idem: the store expires records itself; cleaner not running")
		return
	}
	runPasses(ctx, c.cfg.Interval, func() {
		n, err := c.Pass(ctx)
		if err != nil && ctx.Err() == nil {
			c.cfg.Logger.WarnContext(ctx, "idem: cleaning expired records failed; retrying at the next pass",
				slog.Int("deleted", n), slog.Any("error", err))
		} else if n > 0 {
			c.cfg.Logger.DebugContext(ctx, "idem: deleted expired records", slog.Int("deleted", n))
		}
		signal(c.passes, n)
	})
}

// Start runs the cleaner in a goroutine of its own and returns stop, which ends it and
// waits for it to return (calling stop again does nothing). Unlike [Cleaner.Run], the
// first pass comes one jittered Interval after the start, so that the processes of a
// deploy, started together, neither clean together nor hold up their own start; then
// one pass follows every jittered Interval. The store packages' Open starts their
// cleaner with it, and their Close calls stop before closing the connections.
func (c *Cleaner) Start() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTimer(jitter(c.cfg.Interval))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.Run(ctx)
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

// runPasses runs pass at once, then again after every jittered interval, until ctx
// ends: the loop of the background workers (Cleaner, Completer).
func runPasses(ctx context.Context, interval time.Duration, pass func()) {
	for {
		pass()
		t := time.NewTimer(jitter(interval))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// signal sends v to a test signal channel unless it is full: nothing needs to read
// it in production.
func signal[T any](ch chan T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// Pass deletes expired records, one batch after another (BatchPause apart), until a
// batch finds nothing more to delete (or ctx ends or a batch fails), and returns how
// many it deleted. A batch finds nothing more when it deleted nothing, or fewer than
// it could in less than half its BatchTarget: it was not cut short by its time. Each
// batch is sized by the time the one before it took (BatchTarget).
func (c *Cleaner) Pass(ctx context.Context) (deleted int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ctx.Err() == nil {
		start := time.Now()
		limit := c.size.n
		n, err := c.batch(ctx, limit)
		took := time.Since(start)
		deleted += n
		switch {
		case err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) && limit > 1:
			// Ran out of BatchTimeout: what it deleted rolled back; a smaller one next.
			c.size.timedOut()
			c.cfg.Logger.DebugContext(ctx, "idem: a cleaner batch ran out of its timeout; shrinking the batches",
				slog.Int("batch_size", limit), slog.Int("next_batch_size", c.size.n), slog.Duration("timeout", c.cfg.BatchTimeout))
		case err != nil:
			return deleted, err
		default:
			c.size.took(limit, n, took)
			if n == 0 || (n < limit && took < c.cfg.BatchTarget/2) {
				return deleted, nil
			}
		}
		pause := c.cfg.BatchPause
		if pause == 0 {
			pause = defaultPauseFactor * took
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
	return deleted, ctx.Err()
}

func (c *Cleaner) batch(ctx context.Context, limit int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.BatchTimeout)
	defer cancel()
	p := &idemstore.DeleteExpiredParams{Retention: c.cfg.Retention, Limit: limit, MaxDuration: c.cfg.BatchTarget}
	if c.cfg.Clock != nil {
		p.Now = c.cfg.Clock()
	}
	return c.store.RecordDeleteExpired(ctx, p)
}

// defaultPauseFactor is the default pause between two batches of a pass, in units of
// the time the batch before it took (CleanerConfig.BatchPause).
const defaultPauseFactor = 5

// batchSizer sizes a Cleaner's batches by the time they take, as River's job cleaner
// does: smaller when a batch ran long, larger when a full one was quick, between 1 and
// max records.
type batchSizer struct {
	n, max int
	target time.Duration
}

// took adapts the size after a batch of limit records deleted n in d.
func (b *batchSizer) took(limit, n int, d time.Duration) {
	switch {
	case d > b.target:
		// In proportion, but at least halved: the time a batch takes grows with
		// what it deletes.
		next := int(int64(limit) * int64(b.target) / int64(d))
		b.n = max(1, min(next, limit/2))
	case n == limit && d < b.target/2:
		b.n = min(b.max, 2*limit)
	}
}

// timedOut shrinks the size after a batch that ran out of its timeout.
func (b *batchSizer) timedOut() { b.n = max(1, b.n/4) }

// jitter is d ±10%, so that the background passes of several processes drift apart.
func jitter(d time.Duration) time.Duration { return d - d/10 + rand.N(d/5+1) }
