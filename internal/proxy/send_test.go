package proxy_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/internal/h2fault"
	"github.com/idem-go/idem/internal/proxy"
)

// Nothing below the proxy re-sends a protected request (SPEC §17): Go's transport
// takes a body-less GET, HEAD or OPTIONS for replayable and sends it again by itself
// when a kept-alive connection breaks after the request was written; the proxy's
// protected requests never are.
func TestAKeyedRequestWhoseReplyIsLostOnAKeptAliveConnectionReachesTheUpstreamOnce(t *testing.T) {
	t.Parallel()
	for _, method := range []string{"GET", "HEAD", "OPTIONS", "DELETE", "POST"} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *proxy.Config) { c.Methods = []string{method} })
			// A keyless request first opens a kept-alive connection to the upstream,
			// which the keyed one reuses.
			if a := b.send("GET", "/v1/warm", "", "", ""); a.status != http.StatusOK {
				t.Fatalf("the warm-up GET: %d %s", a.status, a.body)
			}
			a := b.send(method, "/v1/drop", key1, "tok_a", "")
			if a.status != http.StatusInternalServerError || (method != "HEAD" && a.code() != "outcome_unknown") {
				t.Fatalf("a keyed %s whose reply was lost: %d %s, want 500 outcome_unknown", method, a.status, a.body)
			}
			if n := b.up.count("/v1/drop"); n != 1 {
				t.Fatalf("the upstream received the keyed %s %d times, want once", method, n)
			}
			if a := b.send(method, "/v1/drop", key1, "tok_a", ""); a.status != http.StatusInternalServerError {
				t.Fatalf("its retry: %d %s, want 500 outcome_unknown", a.status, a.body)
			}
			if n := b.up.count("/v1/drop"); n != 1 {
				t.Fatalf("after the retry the upstream received it %d times, want once", n)
			}
			if strings.Contains(b.logs.String(), "level=ERROR") {
				t.Fatalf("the transport tried to send the request again:\n%s", b.logs)
			}
		})
	}
}

// An HTTPS upstream speaking HTTP/2 that resets the stream (RST_STREAM PROTOCOL_ERROR)
// after acting: Go's HTTP/2 client would retry the stream by itself; the proxy's
// request is written once, and its outcome is unknown.
func TestAnHTTP2StreamResetAfterActingIsNeverRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode h2fault.Mode
	}{{"reset once", h2fault.ResetOnce}, {"reset every time", h2fault.ResetAlways}} {
		for _, method := range []string{"POST", "GET"} {
			t.Run(tc.name+"/"+method, func(t *testing.T) {
				t.Parallel()
				up := startH2(t, tc.mode)
				hooked := &hookCounts{}
				b := setup(t, via(up), func(c *proxy.Config) {
					c.Methods = []string{method}
					c.Hooks = hooked.hooks()
				})
				body := `{"amount":1}`
				if method == "GET" {
					body = ""
				}
				for i := range 3 {
					a := b.send(method, "/v1/charges", key1, "tok_a", body)
					if a.status != http.StatusInternalServerError || a.code() != "outcome_unknown" {
						t.Fatalf("answer %d: %d %s, want 500 outcome_unknown", i+1, a.status, a.body)
					}
				}
				if keys, total := up.Counts(); keys != 1 || total != 1 {
					t.Fatalf("the upstream received %d requests under %d derived keys, want 1 and 1", total, keys)
				}
				if strings.Contains(b.logs.String(), "level=ERROR") || hooked.get("resend_refused") > 0 || hooked.get("resent") > 0 {
					t.Fatalf("the transport tried to re-send:\n%s", b.logs)
				}
			})
		}
	}
}

// tlsTrusting is a TLS configuration that trusts up's certificate.
func tlsTrusting(up *h2fault.Server) *tls.Config { return &tls.Config{RootCAs: up.RootCAs} }

// startH2 starts an h2fault upstream of mode, closed when t ends.
func startH2(t *testing.T, mode h2fault.Mode) *h2fault.Server {
	t.Helper()
	up, err := h2fault.Start(mode, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(up.Close)
	return up
}

// via makes the proxy's upstream up, trusting its certificate.
func via(up *h2fault.Server) func(*proxy.Config) {
	return func(c *proxy.Config) {
		c.Upstream, _ = url.Parse(up.URL)
		c.UpstreamTLS = tlsTrusting(up)
	}
}

// hookCounts counts the proxy's hooks by outcome.
type hookCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *hookCounts) add(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[string]int{}
	}
	h.n[what]++
}

func (h *hookCounts) get(what string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[what]
}

func (h *hookCounts) hooks() *proxy.Hooks {
	return &proxy.Hooks{
		UpstreamFailed: func(_, outcome string) { h.add(outcome) },
		Resent:         func(_, reason string) { h.add("resent:" + reason) },
	}
}

// faultyTransport plays what a transport may do, through the request's httptrace,
// before it hands the request to http.DefaultTransport (which calls the trace again).
type faultyTransport struct {
	calls atomic.Int32
	// first runs on the first call: it returns an error to fail it, or nil to go on.
	first func(trace *httptrace.ClientTrace) error
	// again, when set, makes every call a second attempt after a write: the trace
	// is told of a connection once more before the request goes.
	again bool
}

func (f *faultyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	trace := httptrace.ContextClientTrace(req.Context())
	if f.calls.Add(1) == 1 && f.first != nil {
		if err := f.first(trace); err != nil {
			return nil, err
		}
	}
	if f.again {
		// A retry of the transport's own: a write, then another attempt.
		trace.GotConn(httptrace.GotConnInfo{Reused: true})
		trace.WroteHeaders()
		trace.GotConn(httptrace.GotConnInfo{Reused: true})
		if err := req.Context().Err(); err != nil {
			return nil, context.Cause(req.Context())
		}
	}
	return http.DefaultTransport.RoundTrip(req)
}

// The one re-send the proxy makes is its own, and said: a request nothing of which
// was written on a kept-alive connection that turned out closed is sent once more.
func TestARequestNotWrittenOnAClosedKeptAliveConnectionIsSentOnceMoreAndCounted(t *testing.T) {
	t.Parallel()
	hooked := &hookCounts{}
	ft := &faultyTransport{first: func(trace *httptrace.ClientTrace) error {
		trace.GotConn(httptrace.GotConnInfo{Reused: true})
		return errors.New("write: broken pipe (nothing written)")
	}}
	b := setup(t, func(c *proxy.Config) { c.Transport, c.Hooks = ft, hooked.hooks() })
	a := b.send("POST", "/v1/echo", key1, "tok_a", `{"amount":1}`)
	if a.status != http.StatusCreated || b.up.count("/v1/echo") != 1 {
		t.Fatalf("%d %s, %d deliveries: want the 201 of one delivery", a.status, a.body, b.up.count("/v1/echo"))
	}
	if n := hooked.get("resent:not_written"); n != 1 {
		t.Fatalf("Hooks.Resent told of %d re-sends, want 1", n)
	}
}

// A transport that tries to send a written request again is stopped before it
// writes, and the outcome is unknown; so is one that did write it twice.
func TestATransportThatSendsAWrittenRequestAgainIsStoppedAndTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	t.Run("another attempt after a write", func(t *testing.T) {
		t.Parallel()
		hooked := &hookCounts{}
		b := setup(t, func(c *proxy.Config) { c.Transport, c.Hooks = &faultyTransport{again: true}, hooked.hooks() })
		a := b.send("POST", "/v1/echo", key1, "tok_a", `{"amount":1}`)
		if a.status != http.StatusInternalServerError || a.code() != "outcome_unknown" || b.up.count("/v1/echo") != 0 {
			t.Fatalf("%d %s, %d deliveries: want 500 outcome_unknown and the attempt stopped", a.status, a.body, b.up.count("/v1/echo"))
		}
		if hooked.get("resend_refused") != 1 || !strings.Contains(b.logs.String(), "tried to send a protected request again") {
			t.Fatalf("the refused attempt was not counted and logged:\n%s", b.logs)
		}
	})
	t.Run("a second write", func(t *testing.T) {
		t.Parallel()
		hooked := &hookCounts{}
		ft := &faultyTransport{first: func(trace *httptrace.ClientTrace) error {
			trace.WroteHeaders() // and http.DefaultTransport writes it once more
			return nil
		}}
		b := setup(t, func(c *proxy.Config) { c.Transport, c.Hooks = ft, hooked.hooks() })
		a := b.send("POST", "/v1/echo", key1, "tok_a", `{"amount":1}`)
		if a.status != http.StatusInternalServerError || a.code() != "outcome_unknown" {
			t.Fatalf("%d %s: want 500 outcome_unknown", a.status, a.body)
		}
		if hooked.get("resent") != 1 || !strings.Contains(b.logs.String(), "sent a protected request twice") {
			t.Fatalf("the second write was not counted and logged:\n%s", b.logs)
		}
		if a := b.send("POST", "/v1/echo", key1, "tok_a", `{"amount":1}`); a.code() != "outcome_unknown" {
			t.Fatalf("its retry: %d %s, want outcome_unknown", a.status, a.body)
		}
	})
}
