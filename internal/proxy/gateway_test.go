package proxy_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/h2fault"
	"github.com/idem-go/idem/internal/proxy"
	"github.com/idem-go/idem/internal/testkit"
)

// A request the upstream provably did not process (RFC 9113: a stream refused with
// REFUSED_STREAM, §8.7, or above a GOAWAY's last stream id, §6.8) is sent again under
// the same derived key, counted, and executes once; without re-sends
// (UpstreamResends < 0) it is released, never kept unknown: nothing reached the
// application.
func TestAStreamTheUpstreamDidNotProcessIsSentAgainAndCounted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		mode h2fault.Mode
	}{{"REFUSED_STREAM", h2fault.RefuseOnce}, {"GOAWAY", h2fault.GoAwayOnce}} {
		for _, method := range []string{"POST", "PUT", "DELETE"} {
			t.Run(tc.name+"/"+method, func(t *testing.T) {
				t.Parallel()
				up := startH2(t, tc.mode)
				hooked, access := &hookCounts{}, &testkit.Buffer{}
				b := setup(t, via(up), func(c *proxy.Config) {
					c.Methods = []string{method}
					c.Hooks = hooked.hooks()
					c.AccessLog, c.AccessLogger = true, slog.New(slog.NewTextHandler(access, nil))
				})
				// A warm-up opens the connection the keyed request is left out of.
				if a := b.send("GET", "/v1/warm", "", "", ""); a.status != http.StatusOK {
					t.Fatalf("the warm-up GET: %d %s", a.status, a.body)
				}
				a := b.send(method, "/v1/charges", key1, "tok_a", `{"amount":1}`)
				if a.status != http.StatusCreated {
					t.Fatalf("a keyed %s the upstream did not process at first: %d %s, want the 201 of its re-send", method, a.status, a.body)
				}
				if keys, total := up.Counts(); keys != 1 || total != 1 || up.Refused() != 1 {
					t.Fatalf("the upstream processed %d requests under %d derived keys and refused %d, want 1, 1 and 1", total, keys, up.Refused())
				}
				if n := hooked.get("resent:not_processed"); n != 1 {
					t.Fatalf("Hooks.Resent told of %d re-sends not_processed, want 1", n)
				}
				if !strings.Contains(access.String(), "resends=1") {
					t.Fatalf("the access log line does not count the re-send:\n%s", access)
				}
				if retry := b.send(method, "/v1/charges", key1, "tok_a", `{"amount":1}`); !retry.replayed() || retry.body != a.body {
					t.Fatalf("its retry: %d %s, want the replay", retry.status, retry.body)
				}
			})
		}
	}
	t.Run("no re-sends", func(t *testing.T) {
		t.Parallel()
		up := startH2(t, h2fault.RefuseOnce)
		b := setup(t, via(up), func(c *proxy.Config) { c.UpstreamResends = -1 })
		// Nothing reached the application: released, never kept unknown.
		a := b.send("POST", "/v1/charges", key1, "tok_a", `{"amount":1}`)
		if a.status != http.StatusBadGateway || a.code() != proxy.CodeUpstreamUnavailable {
			t.Fatalf("a refused stream without re-sends: %d %s, want 502 upstream_unavailable", a.status, a.body)
		}
		if retry := b.send("POST", "/v1/charges", key1, "tok_a", `{"amount":1}`); retry.status != http.StatusCreated {
			t.Fatalf("its retry: %d %s, want the 201 of its one execution", retry.status, retry.body)
		}
		if _, total := up.Counts(); total != 1 {
			t.Fatalf("the upstream processed %d requests, want 1", total)
		}
	})
}

// A stream reset with PROTOCOL_ERROR after the upstream acted is not a stream the
// upstream did not process: net/http's own HTTP/2 client would re-send it
// (http2canRetryError), golang.org/x/net/http2's does not, and neither does the proxy.
// When a Go or x/net upgrade makes the transport take it for re-sendable, this test
// fails (send.go's GetBody signal would then re-send a request that was processed).
func TestProxyNeverResendsAStreamResetAfterActing(t *testing.T) {
	t.Parallel()
	up := startH2(t, h2fault.ResetAlways)
	hooked := &hookCounts{}
	b := setup(t, via(up), func(c *proxy.Config) { c.Hooks, c.UpstreamResends = hooked.hooks(), 5 })
	a := b.send("POST", "/v1/charges", key1, "tok_a", `{"amount":1}`)
	if a.code() != "outcome_unknown" {
		t.Fatalf("a stream reset after acting: %d %s, want outcome_unknown", a.status, a.body)
	}
	if _, total := up.Counts(); total != 1 || hooked.get("resent:not_processed") != 0 {
		t.Fatalf("the upstream processed the request %d times (%d re-sends), want once and none", total, hooked.get("resent:not_processed"))
	}
}

// A gateway that marks its 5xx with NotForwardedHeader says the application never got
// the request: the key is released (the retry executes once), the marker is not
// passed on, and it is counted; without the marker a 502 stays unknown. A marker on a
// 2xx changes nothing.
func TestAGatewaysNotForwardedAnswerReleasesTheKey(t *testing.T) {
	t.Parallel()
	for _, status := range []int{502, 503, 504} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			hooked := &hookCounts{}
			b := setup(t, func(c *proxy.Config) { c.NotForwardedHeader, c.Hooks = "X-Idem-Not-Forwarded", hooked.hooks() })
			first := b.send("POST", fmt.Sprintf("/v1/echo?status=%d&header=X-Idem-Not-Forwarded", status), key1, "tok_a", `{}`)
			if first.status != status || first.header.Get("X-Idem-Not-Forwarded") != "" {
				t.Fatalf("first: %d %v, want the gateway's %d without the marker", first.status, first.header, status)
			}
			if hooked.get("not_forwarded") != 1 || hooked.get("gateway") != 0 {
				t.Fatalf("hooks: %v, want one not_forwarded", hooked.n)
			}
			retry := b.send("POST", fmt.Sprintf("/v1/echo?status=%d&header=X-Idem-Not-Forwarded", status), key1, "tok_a", `{}`)
			if retry.status != status || retry.code() == "outcome_unknown" || b.up.count("/v1/echo") != 2 {
				t.Fatalf("retry: %d %s after %d deliveries, want it forwarded afresh", retry.status, retry.body, b.up.count("/v1/echo"))
			}
		})
	}
	t.Run("unmarked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *proxy.Config) { c.NotForwardedHeader = "X-Idem-Not-Forwarded" })
		b.send("POST", "/v1/echo?status=502", key1, "tok_a", `{}`)
		if retry := b.send("POST", "/v1/echo?status=502", key1, "tok_a", `{}`); retry.code() != "outcome_unknown" {
			t.Fatalf("an unmarked 502's retry: %d %s, want outcome_unknown", retry.status, retry.body)
		}
	})
	t.Run("on a 201", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *proxy.Config) { c.NotForwardedHeader = "X-Idem-Not-Forwarded" })
		first := b.send("POST", "/v1/echo?header=X-Idem-Not-Forwarded", key1, "tok_a", `{}`)
		if retry := b.send("POST", "/v1/echo?header=X-Idem-Not-Forwarded", key1, "tok_a", `{}`); first.status != 201 || !retry.replayed() {
			t.Fatalf("a marked 201: %d, its retry %d %s, want it stored and replayed", first.status, retry.status, retry.body)
		}
	})
}

// An upstream that speaks only HTTP/2 without TLS (h2c): with UpstreamH2C the proxy
// speaks it, stores and replays; without it, the health check of the upstream fails
// (an HTTP/1.1 request there gets no answer), rather than /healthz saying 200 while
// every keyed request would be outcome_unknown. An https upstream with UpstreamH2C is
// refused by name.
func TestAnH2CUpstreamIsSpokenToOrItsHealthCheckFails(t *testing.T) {
	t.Parallel()
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			http.Error(w, "h2c only", http.StatusHTTPVersionNotSupported)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"proto":%q}`, r.Proto)
	}))
	up.Config.Protocols = new(http.Protocols)
	up.Config.Protocols.SetUnencryptedHTTP2(true)
	up.Start()
	t.Cleanup(up.Close)
	target, _ := url.Parse(up.URL)
	t.Run("--upstream-h2c", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *proxy.Config) { c.Upstream, c.UpstreamH2C, c.UpstreamHealthPath = target, true, "/health" })
		a := b.send("POST", "/v1/charges", key1, "tok_a", `{"amount":1}`)
		if a.status != http.StatusCreated || !strings.Contains(a.body, "HTTP/2.0") {
			t.Fatalf("a keyed POST over h2c: %d %s, want the upstream's 201 over HTTP/2", a.status, a.body)
		}
		if retry := b.send("POST", "/v1/charges", key1, "tok_a", `{"amount":1}`); !retry.replayed() || retry.body != a.body {
			t.Fatalf("its retry: %d %s, want the replay", retry.status, retry.body)
		}
		if h := b.send("GET", "/healthz", "", "", ""); h.status != http.StatusOK {
			t.Fatalf("/healthz: %d %s, want 200", h.status, h.body)
		}
	})
	t.Run("without it", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *proxy.Config) { c.Upstream, c.UpstreamHealthPath = target, "/health" })
		if h := b.send("GET", "/healthz", "", "", ""); h.status != http.StatusServiceUnavailable || !strings.Contains(h.body, "upstream") {
			t.Fatalf("/healthz in front of an h2c-only upstream spoken to in HTTP/1.1: %d %s, want 503 naming the upstream", h.status, h.body)
		}
	})
	t.Run("https", func(t *testing.T) {
		t.Parallel()
		u, _ := url.Parse("https://127.0.0.1:1")
		err := proxy.Config{Upstream: u, UpstreamH2C: true}.Validate()
		if err == nil || !strings.Contains(err.Error(), "Config.UpstreamH2C") {
			t.Fatalf("Validate of UpstreamH2C with an https upstream: %v, want an error naming the field", err)
		}
	})
}

// A gateway's 504 that comes before UpstreamWaitLimit says that the gateway's read
// timeout is shorter than the proxy's wait: warned of, naming both.
func TestAGateways504BeforeTheWaitLimitIsWarnedOf(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.send("POST", "/v1/echo?status=504", key1, "tok_a", `{}`)
	if logs := b.logs.String(); !strings.Contains(logs, "timed out first") || !strings.Contains(logs, "upstream_wait_limit=10m0s") {
		t.Fatalf("no warning of the gateway's shorter read timeout:\n%s", logs)
	}
}
