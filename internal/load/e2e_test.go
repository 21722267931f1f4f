package load_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/load"
	"github.com/idem-go/idem/internal/payments/paymentstest"
	"github.com/idem-go/idem/internal/testenv"
)

// paymentsServer serves the real payments API on a SQLite temp file, in-process.
func paymentsServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(paymentstest.Handler(t, nil))
	t.Cleanup(srv.Close)
	return srv
}

// runAndVerify runs cfg and verifies it, failing the test on an error.
func runAndVerify(t *testing.T, cfg load.Config) (*load.Result, *load.Verification) {
	t.Helper()
	ctx := testenv.Context(t)
	res, err := load.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	v, err := load.Verify(ctx, res)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return res, v
}

func report(res *load.Result) string {
	var b bytes.Buffer
	res.Summary.WriteText(&b)
	return b.String()
}

func TestLoadOfThePaymentsAPIIsExactlyOnce(t *testing.T) {
	t.Parallel()
	cases := map[string]load.Config{
		"charges with duplicates":            {Endpoint: load.EndpointCharges, DuplicateRatio: 0.3, Duration: 1500 * time.Millisecond},
		"orders with concurrent duplicates":  {Endpoint: load.EndpointOrders, ConcurrentDuplicates: 4, Duration: time.Second},
		"replays of one charge":              {Endpoint: load.EndpointReplay, Requests: 200},
		"charges with concurrent duplicates": {Endpoint: load.EndpointCharges, ConcurrentDuplicates: 3, Requests: 300},
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg.URL, cfg.Concurrency = paymentsServer(t).URL, 8
			res, v := runAndVerify(t, cfg)
			out := report(res)
			if v.Result != load.ExactlyOnceOK || !strings.HasSuffix(out, "exactly-once: ok\n") {
				t.Fatalf("verification %q, want ok; report:\n%s", v.Result, out)
			}
			if res.Summary.Requests == 0 || v.Created == 0 || v.Objects != v.Created {
				t.Fatalf("requests %d, created %d, objects %d: want a load with one object per created key:\n%s",
					res.Summary.Requests, v.Created, v.Objects, out)
			}
		})
	}
}

func TestLoadWithoutKeysOnlyCounts(t *testing.T) {
	t.Parallel()
	srv := fakeAPI(t, func(f *fake, key string, n int) (int, string) { return f.create(key) })
	// More charges than one page of the list holds.
	res, v := runAndVerify(t, load.Config{URL: srv.URL, Concurrency: 4, Requests: 1500, NoKey: true})
	if v.Result != load.ExactlyOnceUnchecked || v.Created != 1500 || v.Objects != 1500 {
		t.Fatalf("verification %+v, want unchecked with 1500 created and 1500 charges", v)
	}
	if out := report(res); !strings.Contains(out, "exactly-once: not checked: exactly-once cannot be checked without keys") {
		t.Fatalf("report does not say exactly-once cannot be checked:\n%s", out)
	}
}

func TestLoadRetriesUntilEachRequestHasAFinalAnswer(t *testing.T) {
	t.Parallel()
	// The first two sends of each key find it in progress (Retry-After: 0), then 503;
	// the third creates the charge.
	srv := fakeAPI(t, func(f *fake, key string, n int) (int, string) {
		switch n {
		case 1:
			return -http.StatusConflict, "request_in_progress"
		case 2:
			return -http.StatusServiceUnavailable, "store_unavailable"
		}
		if id := f.first(key); id != "" {
			return http.StatusCreated, id
		}
		return f.create(key)
	})
	res, v := runAndVerify(t, load.Config{URL: srv.URL, Concurrency: 4, Requests: 20})
	if v.Result != load.ExactlyOnceOK || v.Created != 20 || v.Retries < 40 {
		t.Fatalf("verification %+v, want ok after at least 40 retries:\n%s", v, report(res))
	}
	if res.Summary.Status["409"] != 20 || res.Summary.ConflictCodes["request_in_progress"] != 20 {
		t.Fatalf("status counts %v, 409 codes %v: want 20 request_in_progress in the load phase", res.Summary.Status, res.Summary.ConflictCodes)
	}
}

func TestLoadReportsRequestsLeftWithoutAnAnswerAsUnresolved(t *testing.T) {
	t.Parallel()
	srv := fakeAPI(t, func(f *fake, key string, n int) (int, string) {
		return -http.StatusServiceUnavailable, "store_unavailable"
	})
	res, v := runAndVerify(t, load.Config{URL: srv.URL, Concurrency: 2, Requests: 4, RetryDeadline: 300 * time.Millisecond})
	if v.Result != load.ExactlyOnceUnresolved || v.Unresolved != 4 {
		t.Fatalf("verification %+v, want 4 unresolved", v)
	}
	if out := report(res); !strings.Contains(out, "exactly-once: UNRESOLVED: 4 of 4 logical requests got no final answer") {
		t.Fatalf("report:\n%s", out)
	}
}

// fake is a stand-in payments API whose POST /v1/charges does what behave says.
// behave gets the key and how many times it was sent (1 the first time) and returns
// 201 and a charge id, or a negated error status and its error code.
type fake struct {
	mu      sync.Mutex
	charges []charge // oldest first
	sends   map[string]int
	lists   int // GET /v1/charges served

	// hide, when set, leaves out of the listing the charges it reports true for.
	hide func(c charge) bool
	// afterList, when set, runs after each listing is served (n is 1 for the first).
	afterList func(f *fake, n int)
}

type charge struct {
	ID             string  `json:"id"`
	IdempotencyKey *string `json:"idempotency_key"`
}

// fakeAPI serves a fake; configure, when given, sets its listing hooks first.
func fakeAPI(t *testing.T, behave func(f *fake, key string, n int) (int, string), configure ...func(f *fake)) *httptest.Server {
	t.Helper()
	f := &fake{sends: map[string]int{}}
	for _, c := range configure {
		c(f)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/charges", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		f.mu.Lock()
		f.sends[key]++
		n := f.sends[key]
		f.mu.Unlock()
		status, s := behave(f, key, n)
		w.Header().Set("Content-Type", "application/json")
		if status < 0 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(-status)
			fmt.Fprintf(w, `{"error":{"type":"idempotency_error","code":%q}}`, s)
			return
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"id":%q,"object":"charge"}`, s)
	})
	mux.HandleFunc("GET /v1/charges", f.list)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// create records a new charge for key and returns 201 and its id.
func (f *fake) create(key string) (int, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := charge{ID: "ch_" + strconv.Itoa(len(f.charges)+1)}
	if key != "" {
		c.IdempotencyKey = &key
	}
	f.charges = append(f.charges, c)
	return http.StatusCreated, c.ID
}

// first returns the id of key's first charge, or "".
func (f *fake) first(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.charges {
		if c.IdempotencyKey != nil && *c.IdempotencyKey == key {
			return c.ID
		}
	}
	return ""
}

// list pages newest first like the real API, limit and starting_after included.
func (f *fake) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.lists++
	n := f.lists
	f.page(w, r)
	f.mu.Unlock()
	if f.afterList != nil {
		f.afterList(f, n)
	}
}

func (f *fake) page(w http.ResponseWriter, r *http.Request) {
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	after := r.URL.Query().Get("starting_after")
	var page []charge
	started := after == ""
	more := false
	for i := len(f.charges) - 1; i >= 0; i-- {
		c := f.charges[i]
		if !started {
			started = c.ID == after
			continue
		}
		if f.hide != nil && f.hide(c) {
			continue
		}
		if len(page) == limit {
			more = true
			break
		}
		page = append(page, c)
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": page, "has_more": more})
}

// TestUnkeyedAPIIsMatchedByTheIDsItsAnswersNamed: an API that records no key on its
// charges (behind idem proxy), which executes each key once and replays its first
// answer to the duplicates, is exactly once when Config.UnkeyedAPI gives each charge
// the key whose answers named it; read by their keys, its charges have none.
func TestUnkeyedAPIIsMatchedByTheIDsItsAnswersNamed(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		answered = map[string]string{} // key → its charge
	)
	once := func(f *fake, key string, n int) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if id, ok := answered[key]; ok {
			return http.StatusCreated, id
		}
		_, id := f.create("")
		answered[key] = id
		return http.StatusCreated, id
	}
	for _, unkeyed := range []bool{true, false} {
		cfg := load.Config{URL: fakeAPI(t, once).URL, Concurrency: 4, ConcurrentDuplicates: 2, Requests: 40, UnkeyedAPI: unkeyed}
		_, v := runAndVerify(t, cfg)
		if want := map[bool]string{true: load.ExactlyOnceOK, false: load.ExactlyOnceFail}[unkeyed]; v.Result != want || v.Created == 0 {
			t.Fatalf("UnkeyedAPI %v: verification %s (%d created), want %s: %s", unkeyed, v.Result, v.Created, want, v.Line())
		}
	}
}
