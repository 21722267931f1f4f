package matrix

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

func init() { gin.SetMode(gin.ReleaseMode) }

// duplicates is how many concurrent requests of one key each cell sends.
const duplicates = 16

// mount puts the middleware, with opts, where m says, in front of h on POST
// /v1/charges. It panics when the middleware refuses opts.
func mount(m Mount, mw *idem.Middleware, opts idem.RouteOptions, h http.Handler) http.Handler {
	switch m {
	case OneRoute:
		mux := http.NewServeMux()
		mux.Handle("POST /v1/charges", mw.Route(opts)(h))
		return mux
	case WholeMux:
		mux := http.NewServeMux()
		mux.Handle("POST /v1/charges", h)
		return mw.Route(opts)(mux)
	case Chi:
		r := chi.NewRouter()
		r.Use(mw.Route(opts))
		r.Post("/v1/charges", h.ServeHTTP)
		return r
	case Gin:
		engine := gin.New()
		engine.POST("/v1/charges", gin.WrapH(h))
		return mw.Route(opts)(engine)
	}
	panic("no mount " + string(m))
}

// TestHTTPCombinations runs every cell of the HTTP table: store × route kind × helper
// × mounting.
func TestHTTPCombinations(t *testing.T) {
	t.Parallel()
	for _, s := range Stores {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			for _, r := range Routes {
				for _, h := range Helpers {
					for _, m := range Mounts {
						want, _ := Expect(s, r, h, m)
						if want == None {
							continue
						}
						name := fmt.Sprintf("%s route, %s, mounted on %s, is %s", r, HelperAPI(s, h), m, want)
						t.Run(name, func(t *testing.T) { runHTTPCell(t, s, r, h, m, want, false) })
						if r == ClaimInHandler && want == ExactlyOnce {
							// The route's other regime: while its requests often find
							// their key recorded, it reads the key before the handler.
							t.Run(name+", reading its key first", func(t *testing.T) { runHTTPCell(t, s, r, h, m, want, true) })
						}
					}
				}
			}
		})
	}
}

// answer is what one request got.
type answer struct {
	status     int
	body       string
	replayed   bool
	code       string // the error code of an idem error
	retryAfter string
	trailer    http.Header
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s (replayed %v)", a.status, strings.TrimSpace(a.body), a.replayed)
}

func post(t *testing.T, c *http.Client, url, key string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/charges", strings.NewReader(`{"amount":2000,"currency":"usd"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_matrix")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("POST: %v", err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		retryAfter: resp.Header.Get("Retry-After"), trailer: resp.Trailer}
	if i := strings.Index(a.body, `"code":"`); i >= 0 {
		a.code, _, _ = strings.Cut(a.body[i+len(`"code":"`):], `"`)
	}
	return a
}

func scope(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }

// runHTTPCell builds one cell and holds it to want. With readFirst (a ClaimInHandler
// route that holds) the route is first sent retries of another key until it reads each
// key before its handler (SPEC §7), and every request of the cell must then be such a
// read: the cell checks that regime, not the one of new keys.
func runHTTPCell(t *testing.T, s Store, r Route, h Helper, m Mount, want Outcome, readFirst bool) {
	t.Parallel()
	e := openEnv(t, s)
	logs := &lockedBuffer{}
	var lookups atomic.Int64
	observer := &idem.Observer{StoreCall: func(ev idem.StoreCallEvent) {
		if ev.Op == idem.StoreOpLookup {
			lookups.Add(1)
		}
	}}
	mw := idem.New(idem.Config{Store: e.store, Scope: scope, Logger: slog.New(slog.NewTextHandler(logs, nil)), Observer: observer})
	opts := idem.RouteOptions{ClaimInHandler: r == ClaimInHandler}
	var handler http.Handler
	refusal := func() (p any) {
		defer func() { p = recover() }()
		handler = mount(m, mw, opts, e.handler(h))
		return nil
	}()
	if want == Refused {
		if msg := fmt.Sprint(refusal); refusal == nil || !strings.HasPrefix(msg, "idem: ") {
			t.Fatalf("building it did not panic with an idem error, got %v", refusal)
		}
		return
	}
	if refusal != nil {
		t.Fatalf("building it panicked: %v", refusal)
	}
	if readFirst {
		warmUp(t, handler)
		if lookups.Load() == 0 {
			t.Fatal("retries of one key did not make the ClaimInHandler route read its keys first")
		}
		lookups.Store(0)
	}
	seqKey, concKey, first, retry, conc := sendDuplicates(t, handler)
	all := append([]answer{first, retry}, conc...)
	if n := lookups.Load(); readFirst && n != int64(len(all)) {
		t.Fatalf("%d of the cell's %d requests read their key before the handler, want every one", n, len(all))
	}

	switch want {
	case ExactlyOnce:
		if first.status != http.StatusCreated || first.replayed {
			t.Fatalf("first answer %v, want 201 not replayed", first)
		}
		if retry.status != first.status || retry.body != first.body || !retry.replayed {
			t.Fatalf("retry %v, want the first answer replayed: %v", retry, first)
		}
		wantExactlyOnce(t, "the concurrent duplicates", conc)
		for _, key := range []string{seqKey, concKey} {
			if n := e.charges(t, key); n != 1 {
				t.Fatalf("%d charges of one key, want 1", n)
			}
		}
		if strings.Contains(logs.String(), "level=ERROR") {
			t.Fatalf("an error was logged by a combination that holds:\n%s", logs)
		}
	case Loud:
		if first.status < 500 {
			t.Fatalf("first answer %v, want a 5xx", first)
		}
		for _, a := range all {
			if a.status/100 == 2 || a.replayed {
				t.Fatalf("an answer %v is a 2xx or a replay: a misuse must fail loudly on every request", a)
			}
		}
		if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "/v1/charges") {
			t.Fatalf("no error naming the route was logged:\n%s", l)
		}
	}
}

// wantExactlyOnce checks the answers of concurrent duplicates of one key: exactly one
// execution answered (a 201 not replayed); every other answer is its replay, byte for
// byte, or an in-flight 409.
func wantExactlyOnce(t *testing.T, what string, answers []answer) {
	t.Helper()
	var executed []answer
	for _, a := range answers {
		if a.status/100 == 2 && !a.replayed {
			executed = append(executed, a)
		}
	}
	if len(executed) != 1 {
		t.Fatalf("%s: %d answers from an execution, want 1: %v", what, len(executed), answers)
	}
	for _, a := range answers {
		switch {
		case a.status/100 == 2 && a.body != executed[0].body:
			t.Fatalf("%s: an answer %v differs from the execution's %v", what, a, executed[0])
		case a.status/100 == 2:
		case a.status == http.StatusConflict && a.code == idem.CodeRequestInProgress:
		default:
			t.Fatalf("%s: an answer %v is neither the execution's nor 409 request_in_progress", what, a)
		}
	}
}

// The suite needs its services: it fails without them under CI=true, and skips cells
// without them otherwise (testenv).
var _ = testenv.CI

// warmUp sends handler a request and 24 retries of one key, one at a time: enough
// for a ClaimInHandler route's rate of keys found recorded to pass a quarter (weight
// 1/32: after about 10), and to stay above an eighth through a cell's 18 requests.
func warmUp(t *testing.T, handler http.Handler) {
	t.Helper()
	srv := httptest.NewServer(handler)
	defer srv.Close()
	key := "warm-" + newID()
	for i := range 25 {
		if a := post(t, srv.Client(), srv.URL, key); a.status != http.StatusCreated || a.replayed != (i > 0) {
			t.Fatalf("warming up, request %d of one key: %v", i+1, a)
		}
	}
}

// sendDuplicates serves handler on a loopback port and sends it what every cell sends:
// a request and its sequential retry under seqKey, then 16 concurrent duplicates under
// concKey.
func sendDuplicates(t *testing.T, handler http.Handler) (seqKey, concKey string, first, retry answer, conc []answer) {
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	client := srv.Client()
	client.Transport.(*http.Transport).MaxIdleConnsPerHost = duplicates
	return sendDuplicatesTo(t, client, srv.URL)
}

// sendDuplicatesTo is sendDuplicates to the server at url, through client.
func sendDuplicatesTo(t *testing.T, client *http.Client, url string) (seqKey, concKey string, first, retry answer, conc []answer) {
	t.Helper()
	seqKey, concKey = "seq-"+newID(), "conc-"+newID()
	first = post(t, client, url, seqKey)
	retry = post(t, client, url, seqKey)
	conc = make([]answer, duplicates)
	var wg sync.WaitGroup
	for i := range conc {
		wg.Go(func() { conc[i] = post(t, client, url, concKey) })
	}
	wg.Wait()
	t.Logf("first %v; retry %v; concurrent %v", first, retry, conc)
	return seqKey, concKey, first, retry, conc
}
