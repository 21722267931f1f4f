package logsummary

import "log/slog"

// EndIntervals ends every open interval of h (a handler New made) now, as their timers
// would: the tests control when an interval ends instead of racing a short one.
func EndIntervals(h slog.Handler) {
	st := h.(*summaryHandler).state
	st.mu.Lock()
	open := make(map[summaryKey]*summaryWindow, len(st.open))
	for k, w := range st.open {
		if w.timer.Stop() {
			open[k] = w
		}
	}
	st.mu.Unlock()
	for k, w := range open {
		st.close(k, w)
	}
}
