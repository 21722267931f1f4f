package idem_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

func TestNewPanicsNamingTheField(t *testing.T) {
	t.Parallel()
	valid := func() idem.Config { return idem.Config{Store: memory.New(), Scope: bearerScope} }
	tests := []struct {
		want string
		mod  func(*idem.Config)
	}{
		{"Config.Store is required", func(c *idem.Config) { c.Store = nil }},
		{"Config.Scope is required", func(c *idem.Config) { c.Scope = nil }},
		{"Config.TTL", func(c *idem.Config) { c.TTL = -1 }},
		{"Config.Lease", func(c *idem.Config) { c.Lease = -1 }},
		{"Config.Heartbeat", func(c *idem.Config) { c.Heartbeat = time.Minute }},
		{"Config.InFlightWait", func(c *idem.Config) { c.InFlightWait = -1 }},
		{"Config.MinKeyLength", func(c *idem.Config) { c.MinKeyLength = 256 }},
		{"Config.MaxBodyBytes", func(c *idem.Config) { c.MaxBodyBytes = -1 }},
		{"Config.MaxResponseBytes", func(c *idem.Config) { c.MaxResponseBytes = -1 }},
		{"Config.Profile", func(c *idem.Config) { c.Profile = 7 }},
		{"Config.StoredHeaders: Set-Cookie carries a credential, which is never stored", func(c *idem.Config) { c.StoredHeaders = []string{"set-cookie"} }},
		{"Config.StoredHeaders: Authorization carries a credential", func(c *idem.Config) { c.StoredHeaders = []string{"authorization"} }},
		{"Config.StoredHeaders: X-Api-Key carries a credential", func(c *idem.Config) { c.StoredHeaders = []string{"X-API-Key"} }},
		{"Config.StoredHeaders: Www-Authenticate carries a credential", func(c *idem.Config) { c.StoredHeaders = []string{"WWW-Authenticate"} }},
		{"Config.StoredHeaders: Set-Cookie2 carries a credential", func(c *idem.Config) { c.StoredHeaders = []string{"Set-Cookie2"} }},
		{"Config.StoredHeaders: Cookie carries a credential", func(c *idem.Config) { c.StoredHeaders = []string{"Cookie"} }},
		{"Config.StoredHeaders: Authentication-Info carries a credential", func(c *idem.Config) { c.StoredHeaders = []string{"Authentication-Info"} }},
		{"Config.StoredHeaders: Proxy-Authorization carries a credential", func(c *idem.Config) { c.StoredHeaders = []string{"Proxy-Authorization"} }},
		{"Config.StoredHeaders: Date is never stored", func(c *idem.Config) { c.StoredHeaders = []string{"Date"} }},
		{"Config.StoredHeaders: Transfer-Encoding is never stored", func(c *idem.Config) { c.StoredHeaders = []string{"Transfer-Encoding"} }},
		{`Config.Methods["POST"]`, func(c *idem.Config) { c.Methods = map[string]idem.Requirement{"POST": idem.KeyByMethod} }},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			defer func() {
				got := fmt.Sprint(recover())
				if !strings.HasPrefix(got, "idem: ") || !strings.Contains(got, tt.want) {
					t.Errorf("panic %q, want one naming %q", got, tt.want)
				}
			}()
			c := valid()
			tt.mod(&c)
			idem.New(c)
		})
	}
}

func TestRoutePanicsOnInvalidOptions(t *testing.T) {
	t.Parallel()
	m := idem.New(idem.Config{Store: memory.New(), Scope: bearerScope})
	defer func() {
		if got := fmt.Sprint(recover()); !strings.Contains(got, "RouteOptions.TTL") {
			t.Errorf("panic %q", got)
		}
	}()
	m.Route(idem.RouteOptions{TTL: -1})
}

func TestStoredHeadersAddToTheAllowList(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.StoredHeaders = []string{"x-charge-id"} })
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Charge-Id", "ch_1")
		w.Header().Set("ETag", `"v1"`)
		w.Header().Set("X-Other", "o")
		w.WriteHeader(201)
	}))
	serve(mw, req("POST", "/x", key, "{}"))
	w := serve(mw, req("POST", "/x", key, "{}"))
	if w.Header().Get("X-Charge-Id") != "ch_1" || w.Header().Get("ETag") != `"v1"` || w.Header().Get("X-Other") != "" {
		t.Errorf("replayed headers %v", w.Header())
	}
}

func TestMethodsTableIsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) {
		c.Methods = map[string]idem.Requirement{"PATCH": idem.KeyOptional, "PUT": idem.KeyRequired}
	})
	mw := b.mw.Handler(&counter{})
	if w := serve(mw, req("PATCH", "/x", "", "{}")); w.Code != 201 {
		t.Errorf("optional PATCH without key: %d", w.Code)
	}
	wantCode(t, serve(mw, req("PUT", "/x", "", "{}")), 400, idem.CodeKeyRequired)
	wantCode(t, serve(mw, req("POST", "/x", "", "{}")), 400, idem.CodeKeyRequired)
	if w := serve(mw, req("PURGE", "/x", "", "{}")); w.Code != 201 {
		t.Errorf("a method missing from the table is optional: %d", w.Code)
	}
}

func TestMinKeyLengthIsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.MinKeyLength = 36 })
	mw := b.mw.Handler(&counter{})
	wantCode(t, serve(mw, req("POST", "/x", key[:35], "{}")), 400, idem.CodeKeyInvalid)
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 201 {
		t.Errorf("36-byte key: %d", w.Code)
	}
}

// A TTL longer than idem.MaxTTL is refused wherever a TTL is given: every store must
// represent every record's expiry (issue 19 item 6: SQLite turned an overflowing
// expires_at into a REAL, and every retry of the key answered 503 forever).
func TestTTLsLongerThanMaxTTLAreRefused(t *testing.T) {
	t.Parallel()
	tooLong := idem.MaxTTL + time.Hour
	wantPanic := func(t *testing.T, want string, f func()) {
		t.Helper()
		defer func() {
			t.Helper()
			got := fmt.Sprint(recover())
			if !strings.HasPrefix(got, "idem: ") || !strings.Contains(got, want) || !strings.Contains(got, "MaxTTL") {
				t.Errorf("panic %q, want one naming %q and MaxTTL", got, want)
			}
		}()
		f()
	}
	wantPanic(t, "Config.TTL", func() { idem.New(idem.Config{Store: memory.New(), Scope: bearerScope, TTL: tooLong}) })
	wantPanic(t, "GuardConfig.TTL", func() { idem.NewGuard(idem.GuardConfig{Store: memory.New(), TTL: tooLong}) })
	m := idem.New(idem.Config{Store: memory.New(), Scope: bearerScope})
	wantPanic(t, "RouteOptions.TTL", func() { m.Route(idem.RouteOptions{TTL: tooLong}) })
	wantPanic(t, "Call.TTL", func() {
		_, _, _ = m.Guard().Begin(t.Context(), idem.Call{Scope: "s", Key: "key-too-long-ttl", TTL: tooLong})
	})
	if err := m.Guard().CheckTTL(tooLong); err == nil || !strings.Contains(err.Error(), "MaxTTL") {
		t.Errorf("Guard.CheckTTL(MaxTTL + 1h) = %v, want an error naming MaxTTL", err)
	}
	for _, ok := range []time.Duration{0, idem.MaxTTL} {
		if err := m.Guard().CheckTTL(ok); err != nil {
			t.Errorf("Guard.CheckTTL(%v) = %v, want nil", ok, err)
		}
	}
	h, _, err := m.Guard().Begin(t.Context(), idem.Call{Scope: "s", Key: "key-set-ttl", TTL: idem.MaxTTL})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Release()
	if err := h.SetTTL(tooLong); err == nil || !strings.Contains(err.Error(), "MaxTTL") {
		t.Errorf("Handle.SetTTL(MaxTTL + 1h) = %v, want an error naming MaxTTL", err)
	}
}
