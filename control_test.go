package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// Control per middleware and per route (SPEC §16): the key's header name, the
// fingerprint, the error writer and the TTL.

// keyedReq is req with the key in header name.
func keyedReq(method, path, name, key, body string) *http.Request {
	r := req(method, path, "", body)
	r.Header.Set(name, key)
	return r
}

func TestKeyHeaderIsConfigurable(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.KeyHeader = "x-request-key" })
	h := &counter{}
	mw := b.mw.Handler(h)
	first := serve(mw, keyedReq("POST", "/x", "X-Request-Key", key, "{}"))
	if first.Code != 201 || first.Header().Get("X-Request-Key") != key || first.Header().Get("Idempotency-Key") != "" {
		t.Fatalf("first: %d, echoed key %q under X-Request-Key, %q under Idempotency-Key", first.Code,
			first.Header().Get("X-Request-Key"), first.Header().Get("Idempotency-Key"))
	}
	retry := serve(mw, keyedReq("POST", "/x", "X-Request-Key", key, "{}"))
	if retry.Header().Get("Idempotent-Replayed") != "true" || retry.Header().Get("X-Request-Key") != key || h.n.Load() != 1 {
		t.Fatalf("retry: %d, replayed %q, %d executions", retry.Code, retry.Header().Get("Idempotent-Replayed"), h.n.Load())
	}
	// The default header means nothing here: the key is missing.
	w := serve(mw, req("POST", "/x", key, "{}"))
	wantCode(t, w, http.StatusBadRequest, idem.CodeKeyRequired)
	if !strings.Contains(w.Body.String(), "X-Request-Key header is required") {
		t.Errorf("key_required names another header: %s", w.Body)
	}
	wantCode(t, serve(mw, keyedReq("POST", "/x", "X-Request-Key", "short", "{}")), http.StatusBadRequest, idem.CodeKeyInvalid)
}

func TestRouteKeyHeaderOverridesTheConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Route(idem.RouteOptions{KeyHeader: "Job-Id"})(&counter{})
	if w := serve(mw, keyedReq("POST", "/jobs", "Job-Id", key, "{}")); w.Code != 201 || w.Header().Get("Job-Id") != key {
		t.Fatalf("%d, echoed %q", w.Code, w.Header().Get("Job-Id"))
	}
	defer func() {
		if got := fmt.Sprint(recover()); !strings.Contains(got, "RouteOptions.KeyHeader") {
			t.Errorf("panic %q, want one naming RouteOptions.KeyHeader", got)
		}
	}()
	b.mw.Route(idem.RouteOptions{KeyHeader: "Job Id"})
}

func TestFingerprintFunctionIsConfigurable(t *testing.T) {
	t.Parallel()
	// The path alone identifies the operation: the body may change between retries.
	byPath := func(r *http.Request, _ []byte) idem.Fingerprint { return idem.FingerprintInput(r.URL.Path, nil) }
	b := setup(t, func(c *idem.Config) { c.Fingerprint = byPath })
	h := &counter{}
	mw := b.mw.Handler(h)
	serve(mw, req("POST", "/x", key, `{"a":1}`))
	if w := serve(mw, req("POST", "/x", key, `{"a":2}`)); w.Header().Get("Idempotent-Replayed") != "true" || h.n.Load() != 1 {
		t.Fatalf("retry with another body: %d, %d executions; want a replay", w.Code, h.n.Load())
	}
	wantCode(t, serve(mw, req("POST", "/y", key, `{"a":1}`)), http.StatusConflict, idem.CodeKeyReused)
	// A route may override it with the default.
	route := b.mw.Route(idem.RouteOptions{Fingerprint: idem.FingerprintRequest})(h)
	const other = "8e2b5c1a-0f3d-4c6e-9a7b-1d2e3f4a5b6c"
	serve(route, req("POST", "/z", other, `{"a":1}`))
	wantCode(t, serve(route, req("POST", "/z", other, `{"a":2}`)), http.StatusConflict, idem.CodeKeyReused)
}

func TestFingerprintJSONFieldsCoversTheChosenMembersOnly(t *testing.T) {
	t.Parallel()
	fields := idem.FingerprintJSONFields("amount", "currency")
	except := idem.FingerprintJSONExcept("trace_id")
	fp := func(f idem.FingerprintFunc, path, body string) idem.Fingerprint {
		r := req("POST", path, key, body)
		return f(r, []byte(body))
	}
	base := `{"amount": 2000, "currency": "usd", "trace_id": "t1", "note": {"b": 1, "a": 2}}`
	for _, tt := range []struct {
		name      string
		f         idem.FingerprintFunc
		path, alt string
		same      bool
	}{
		{"fields: other members changed", fields, "/x", `{"currency":"usd","amount":2000,"trace_id":"t2","note":null}`, true},
		{"fields: a chosen member changed", fields, "/x", `{"amount": 2001, "currency": "usd", "trace_id": "t1"}`, false},
		{"fields: a chosen number re-spelt", fields, "/x", `{"amount": 2000.0, "currency": "usd"}`, false},
		{"fields: a chosen member missing", fields, "/x", `{"amount": 2000, "trace_id": "t1"}`, false},
		{"fields: another path", fields, "/y", base, false},
		{"except: the excluded member changed", except, "/x", `{"note":{"a":2,"b":1},"trace_id":"t9","currency":"usd","amount":2000}`, true},
		{"except: another member changed", except, "/x", `{"amount": 2000, "currency": "usd", "trace_id": "t1", "note": {"b": 1, "a": 3}}`, false},
	} {
		if got := fp(tt.f, "/x", base) == fp(tt.f, tt.path, tt.alt); got != tt.same {
			t.Errorf("%s: same fingerprint = %v, want %v", tt.name, got, tt.same)
		}
	}
	// A body that is not a JSON object is fingerprinted as a whole, as by default.
	if fp(fields, "/x", `[1,2]`) != fp(idem.FingerprintRequest, "/x", `[1,2]`) {
		t.Error("a JSON array is not fingerprinted as FingerprintRequest does")
	}
	if fp(fields, "/x", `{"amount": 2000}`) == fp(idem.FingerprintRequest, "/x", `{"amount": 2000}`) {
		t.Error("the chosen members of an object frame like a whole body")
	}
}

// Nested members are named by a dotted path ("payment.amount") or a JSON Pointer
// ("/payment/amount", RFC 6901, for a member whose name holds a dot). Issue 19 item 8:
// "payment.amount" covered nothing, and a different charge under the key was
// answered the first one's 201.
func TestFingerprintJSONFieldsCoversNestedMembersByPath(t *testing.T) {
	t.Parallel()
	fp := func(f idem.FingerprintFunc, body string) idem.Fingerprint {
		return f(req("POST", "/x", key, body), []byte(body))
	}
	base := `{"payment": {"amount": 100, "currency": "usd", "note": "n1"}, "trace": "t1", "a.b": 1}`
	for _, tt := range []struct {
		name string
		f    idem.FingerprintFunc
		alt  string
		same bool
	}{
		{"dotted: the chosen member changed", idem.FingerprintJSONFields("payment.amount"), `{"payment": {"amount": 999999, "currency": "usd", "note": "n1"}, "trace": "t1", "a.b": 1}`, false},
		{"dotted: its siblings changed", idem.FingerprintJSONFields("payment.amount"), `{"payment": {"note": "n2", "amount": 100}, "trace": "t2"}`, true},
		{"dotted: the chosen member missing", idem.FingerprintJSONFields("payment.amount"), `{"payment": {"currency": "usd"}}`, false},
		{"dotted: its parent not an object", idem.FingerprintJSONFields("payment.amount"), `{"payment": [100]}`, false},
		{"pointer: the chosen member changed", idem.FingerprintJSONFields("/payment/amount"), `{"payment": {"amount": 101}}`, false},
		{"pointer: its siblings changed", idem.FingerprintJSONFields("/payment/amount", "/payment/currency"), `{"payment": {"currency": "usd", "amount": 100}}`, true},
		{"pointer: a name with a dot", idem.FingerprintJSONFields("/a.b"), `{"a.b": 2}`, false},
		{"pointer: a name with a dot, others changed", idem.FingerprintJSONFields("/a.b"), `{"a.b": 1, "payment": null}`, true},
		{"a parent covers its members", idem.FingerprintJSONFields("payment", "payment.amount"), `{"payment": {"amount": 100, "currency": "usd", "note": "n2"}}`, false},
		{"except: a nested member changed", idem.FingerprintJSONExcept("payment.note", "trace"), `{"trace": "t9", "a.b": 1, "payment": {"note": "n9", "currency": "usd", "amount": 100}}`, true},
		{"except: another nested member changed", idem.FingerprintJSONExcept("payment.note"), `{"payment": {"amount": 101, "currency": "usd", "note": "n1"}, "trace": "t1", "a.b": 1}`, false},
	} {
		if got := fp(tt.f, base) == fp(tt.f, tt.alt); got != tt.same {
			t.Errorf("%s: same fingerprint = %v, want %v", tt.name, got, tt.same)
		}
	}
	if fp(idem.FingerprintJSONFields("payment.amount"), base) != fp(idem.FingerprintJSONFields("/payment/amount"), base) {
		t.Error("a dotted path and the JSON Pointer of the same member fingerprint differently")
	}
}

// Top-level names fingerprint as they did before nested paths existed, so that the
// retries of records already stored still match them.
func TestFingerprintJSONFieldsOfTopLevelNamesAreUnchanged(t *testing.T) {
	t.Parallel()
	body := `{"amount": 2000, "currency": "usd", "trace_id": "t1", "note": {"b": 1, "a": 2}}`
	r := req("POST", "/x", key, body)
	for _, tt := range []struct {
		f    idem.FingerprintFunc
		want string
	}{
		{idem.FingerprintJSONFields("amount", "currency"), "d44f3951d335ecf85658896252775c89742976cd5d20a8f1bb9f5663fa0f2bfa"},
		{idem.FingerprintJSONExcept("trace_id"), "f9521e1da6bbeb1894202045bf5688056747f92f55c01094fb85fbed367164ef"},
	} {
		if got := fmt.Sprintf("%x", tt.f(r, []byte(body)).Sum); got != tt.want {
			t.Errorf("fingerprint %s, want %s (as before nested paths)", got, tt.want)
		}
	}
}

// A name that can match no member is refused when the function is built, naming it.
func TestFingerprintJSONFieldsRefusesNamesThatCannotMatch(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "payment.", ".amount", "payment..amount", "/payment/~2", "/payment~"} {
		for fn, f := range map[string]func(...string) idem.FingerprintFunc{
			"FingerprintJSONFields": idem.FingerprintJSONFields, "FingerprintJSONExcept": idem.FingerprintJSONExcept,
		} {
			func() {
				defer func() {
					got := fmt.Sprint(recover())
					if !strings.HasPrefix(got, "idem: "+fn) || !strings.Contains(got, fmt.Sprintf("%q", name)) {
						t.Errorf("%s(%q): panic %q, want one naming the function and the name", fn, name, got)
					}
				}()
				f(name)
			}()
		}
	}
	defer func() {
		if got := fmt.Sprint(recover()); !strings.Contains(got, "no name") {
			t.Errorf("FingerprintJSONFields(): panic %q, want one saying it names nothing", got)
		}
	}()
	idem.FingerprintJSONFields()
}

func TestErrorWriterIsConfigurable(t *testing.T) {
	t.Parallel()
	var got []idem.Problem
	writer := func(w http.ResponseWriter, r *http.Request, p *idem.Problem) {
		got = append(got, *p)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(p.Status)
		fmt.Fprintf(w, "%s: %s", p.Code, p.Detail)
	}
	b := setup(t, func(c *idem.Config) { c.ErrorWriter = writer; c.Profile = idem.ProfileIETF })
	h := newHeld()
	mw := b.mw.Handler(h)
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/x", key, "{}")); close(done) }()
	<-h.entered
	w := serve(mw, req("POST", "/x", key, "{}"))
	close(h.gate)
	<-done
	if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" || w.Header().Get("Idempotency-Key") != key ||
		!strings.HasPrefix(w.Body.String(), "request_in_progress: ") {
		t.Fatalf("in progress through the writer: %d, Retry-After %q, key %q, body %q", w.Code,
			w.Header().Get("Retry-After"), w.Header().Get("Idempotency-Key"), w.Body)
	}
	wantStatus := serve(mw, req("POST", "/x", key, `{"other":1}`))
	if wantStatus.Code != http.StatusUnprocessableEntity { // the ietf profile's status for key_reused
		t.Errorf("key_reused through the writer: %d, want the profile's 422", wantStatus.Code)
	}
	if len(got) != 2 || got[0].Code != idem.CodeRequestInProgress || got[0].Status != 409 || got[0].Detail != "" {
		t.Errorf("problems written: %+v", got)
	}
	// A route overrides it.
	route := b.mw.Route(idem.RouteOptions{ErrorWriter: func(w http.ResponseWriter, r *http.Request, p *idem.Problem) {
		w.WriteHeader(p.Status)
		fmt.Fprint(w, "route:"+p.Code)
	}})(&counter{})
	if w := serve(route, req("POST", "/x", "", "{}")); w.Code != 400 || w.Body.String() != "route:key_required" {
		t.Errorf("route writer: %d %q", w.Code, w.Body)
	}
}

func TestHandlerSetsTheTTLOfItsRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.TTL = time.Hour })
	var tooShort, tooLate error
	h := &counter{}
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := idem.FromContext(r.Context())
		tooShort = hd.SetTTL(idem.DefaultLease)
		if err := hd.SetTTL(3 * time.Hour); err != nil {
			t.Errorf("SetTTL(3h): %v", err)
		}
		h.ServeHTTP(w, r)
	}))
	serve(mw, req("POST", "/x", key, "{}"))
	if tooShort == nil || !strings.Contains(tooShort.Error(), "longer than the lease") {
		t.Errorf("SetTTL(the lease) = %v, want it refused", tooShort)
	}
	b.clock.Advance(2 * time.Hour) // past the route's TTL, within the handler's
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Header().Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after 2h: %d, want the replay the handler's TTL keeps", w.Code)
	}
	b.clock.Advance(time.Hour)
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Header().Get("Idempotent-Replayed") != "" || h.n.Load() != 2 {
		t.Fatalf("after 3h: replayed %q, %d executions; want the record expired", w.Header().Get("Idempotent-Replayed"), h.n.Load())
	}
	// Once the response is frozen for the completion, the TTL is fixed.
	hd := newTTLAfterCompletion(t, b)
	if tooLate = hd.SetTTL(5 * time.Hour); tooLate == nil {
		t.Error("SetTTL after the completion was prepared succeeded")
	}
}

// newTTLAfterCompletion runs a handler that prepares its completion (as a §7 helper
// does) and returns its handle.
func newTTLAfterCompletion(t *testing.T, b *bundle) *idem.Handle {
	var hd *idem.Handle
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd = idem.FromContext(r.Context())
		w.WriteHeader(201)
		if err := inTx(r.Context(), b.store, nil, func() error { return nil }); err != nil {
			t.Errorf("inTx: %v", err)
		}
	}))
	serve(mw, req("POST", "/ttl", "0b6d1f3e-7c2a-4e5b-8f9d-a1b2c3d4e5f6", "{}"))
	return hd
}

func TestDefaultKeyRequiredNamesIdempotencyKey(t *testing.T) {
	t.Parallel()
	// The defaults answer exactly as before the options existed: key_required names
	// Idempotency-Key in the profile's shape.
	b := setup(t, nil)
	w := httptest.NewRecorder()
	b.mw.Handler(&counter{}).ServeHTTP(w, req("POST", "/x", "", "{}"))
	if !strings.Contains(w.Body.String(), `"message":"An Idempotency-Key header is required for this request."`) {
		t.Errorf("default key_required: %s", w.Body)
	}
}

func TestRenewalsKeepTheTTLTheHandlerSet(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.TTL = time.Hour })
	renewed := make(chan error, 1)
	idem.OnRenew(b.mw, func(err error) { renewed <- err })
	set, gate := make(chan struct{}), make(chan struct{})
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := idem.FromContext(r.Context()).SetTTL(3 * time.Hour); err != nil {
			t.Errorf("SetTTL: %v", err)
		}
		close(set)
		<-gate
		w.WriteHeader(201)
	}))
	created := b.clock.Now()
	done := make(chan struct{})
	go func() { serve(mw, req("POST", "/x", key, "{}")); close(done) }()
	<-set
	b.clock.Advance(10 * time.Second)
	b.ticker.Tick()
	if err := <-renewed; err != nil {
		t.Fatalf("renewal: %v", err)
	}
	rec, err := b.store.RecordGet(context.Background(), &idemstore.GetParams{Scope: "alice", Key: key, Now: b.clock.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if want := created.Add(3 * time.Hour); !rec.ExpiresAt.Equal(want) {
		t.Errorf("in flight after a renewal, expires_at = %v, want created + the handler's 3h (%v)", rec.ExpiresAt, want)
	}
	close(gate)
	<-done
}
