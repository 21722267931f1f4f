package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"sync"

	"github.com/felixge/httpsnoop"

	"github.com/idem-go/idem"
)

// accessNote is what the exchange tells the access log of a request it forwarded. The
// exchange's timer (the upstream's header timeout) and its request goroutine both
// write it.
type accessNote struct {
	mu      sync.Mutex
	outcome string // forwarded, not_sent, outcome_unknown, upstream_timeout, not_forwarded
	keyHash string
	resends int // re-sends of a request the upstream did not process
}

// noteResend counts a re-send in the request's access log line, if it has one.
func noteResend(ctx context.Context) {
	if n, _ := ctx.Value(accessNoteKey{}).(*accessNote); n != nil {
		n.mu.Lock()
		n.resends++
		n.mu.Unlock()
	}
}

type accessNoteKey struct{}

// note records what happened to the request in its access log line, if it has one.
func note(ctx context.Context, x *exchange, outcome string) {
	n, _ := ctx.Value(accessNoteKey{}).(*accessNote)
	if n == nil {
		return
	}
	var hash string
	if x.h != nil {
		hash = keyHash(x.h.Scope(), x.h.Key())
	}
	n.mu.Lock()
	n.outcome = outcome
	if hash != "" {
		n.keyHash = hash
	}
	n.mu.Unlock()
}

// logAccess serves r through next and logs one line about it at info level (Config.
// AccessLog): method, route, status, outcome, duration and, for a protected request,
// the key's short hash. The outcome is what the exchange said (forwarded, not_sent,
// outcome_unknown, upstream_timeout), "replayed" for a replay, or "answered" for an
// answer of idem's own (a refusal, 409 in flight, 503).
func (p *Proxy) logAccess(next http.Handler, w http.ResponseWriter, r *http.Request, route string) {
	n := &accessNote{}
	var replayed bool
	hooks := httpsnoop.Hooks{WriteHeader: func(write httpsnoop.WriteHeaderFunc) httpsnoop.WriteHeaderFunc {
		return func(code int) {
			if code >= 200 && !replayed {
				replayed = w.Header().Get("Idempotent-Replayed") == "true"
			}
			write(code)
		}
	}}
	m := httpsnoop.CaptureMetricsFn(w, func(w http.ResponseWriter) {
		next.ServeHTTP(httpsnoop.Wrap(w, hooks), r.WithContext(context.WithValue(r.Context(), accessNoteKey{}, n)))
	})
	n.mu.Lock()
	outcome, hash, resends := n.outcome, n.keyHash, n.resends
	n.mu.Unlock()
	switch {
	case replayed:
		outcome = "replayed"
	case outcome == "":
		outcome = "answered"
	}
	attrs := []slog.Attr{slog.String("method", r.Method), slog.String("route", route), slog.Int("status", m.Code),
		slog.String("outcome", outcome), slog.Duration("duration", m.Duration), slog.Int64("bytes", m.Written)}
	if hash == "" {
		hash = p.requestKeyHash(r)
	}
	if hash != "" {
		attrs = append(attrs, slog.String("key_hash", hash))
	}
	if resends > 0 {
		attrs = append(attrs, slog.Int("resends", resends))
	}
	p.access.LogAttrs(r.Context(), slog.LevelInfo, "idem proxy: request", attrs...)
}

// requestKeyHash is the short hash of r's key in its scope, as the middleware's log
// lines name it, or "" when r has no valid key or scope.
func (p *Proxy) requestKeyHash(r *http.Request) string {
	values := r.Header[p.keyHeader]
	if len(values) == 0 {
		return ""
	}
	key, err := idem.ParseKey(values, 1)
	if err != nil {
		return ""
	}
	scope, err := p.scope(r)
	if err != nil {
		return ""
	}
	return keyHash(scope, key)
}
