package logsummary

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// DefaultInterval is the interval of [New] that the guard,
// the middleware and the queue consumers log through.
const DefaultInterval = 10 * time.Second

// New returns a slog.Handler that passes every record to h, except
// that it summarises repeated failures, so that logs stay readable while a store is
// down and every request or delivery fails alike: a warning or an error whose level
// and message were already written in the last interval is counted instead of
// written, and when that interval ends one record with the same level and message and
// the attributes "repeated" (how many were left out) and "interval" says so. Records
// below warning level always pass. The guard (and so the middleware, [Do], the gRPC
// interceptor) and package consume log through one; interval 0 means
// [DefaultInterval].
func New(h slog.Handler, interval time.Duration) slog.Handler {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if s, ok := h.(*summaryHandler); ok && s.state.interval == interval {
		return s // summarised already
	}
	return &summaryHandler{h: h, state: &summaryState{interval: interval, open: map[summaryKey]*summaryWindow{}}}
}

// summaryHandler is New's handler; its derived handlers (WithAttrs,
// WithGroup) share its state, so that a message is summarised whatever attributes the
// logger that wrote it carries.
type summaryHandler struct {
	h     slog.Handler
	state *summaryState
}

type summaryState struct {
	interval time.Duration
	mu       sync.Mutex
	open     map[summaryKey]*summaryWindow
}

type summaryKey struct {
	level slog.Level
	msg   string
}

// summaryWindow is the interval that began with a message's record that was written:
// the records of the same message after it are counted until it ends.
type summaryWindow struct {
	h       slog.Handler // the handler that wrote the first record, for the summary
	skipped int
	timer   *time.Timer
}

func (s *summaryHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return s.h.Enabled(ctx, level)
}

func (s *summaryHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return s.h.Handle(ctx, r)
	}
	k := summaryKey{r.Level, r.Message}
	st := s.state
	st.mu.Lock()
	if w := st.open[k]; w != nil {
		w.skipped++
		st.mu.Unlock()
		return nil
	}
	w := &summaryWindow{h: s.h}
	st.open[k] = w
	w.timer = time.AfterFunc(st.interval, func() { st.close(k, w) })
	st.mu.Unlock()
	return s.h.Handle(ctx, r)
}

// close ends the window w of k: it writes the summary when records were left out.
func (st *summaryState) close(k summaryKey, w *summaryWindow) {
	st.mu.Lock()
	if st.open[k] == w {
		delete(st.open, k)
	}
	n := w.skipped
	st.mu.Unlock()
	if n == 0 {
		return
	}
	r := slog.NewRecord(time.Now(), k.level, k.msg, 0)
	r.AddAttrs(slog.Int("repeated", n), slog.Duration("interval", st.interval))
	_ = w.h.Handle(context.Background(), r)
}

func (s *summaryHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &summaryHandler{h: s.h.WithAttrs(attrs), state: s.state}
}

func (s *summaryHandler) WithGroup(name string) slog.Handler {
	return &summaryHandler{h: s.h.WithGroup(name), state: s.state}
}
