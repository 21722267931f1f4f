package matrix

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/seal/cloudkeys"
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
			if s == RedisSentinel {
				useSentinel(t)
			}
			for _, r := range Routes {
				for _, h := range Helpers {
					for _, m := range Mounts {
						want, _ := Expect(s, r, h, m)
						if want == None {
							continue
						}
						name := fmt.Sprintf("%s route, %s, mounted on %s, is %s", r, HelperAPI(s, h), m, want)
						t.Run(name, func(t *testing.T) { runHTTPCell(t, s, r, h, m, want, regime{}) })
						if want == ExactlyOnce && (r == ClaimInHandler || m == OneRoute) {
							// The route's other regime: while its requests often find
							// their key recorded, it reads the key first (a
							// ClaimInHandler route before its handler, a lease route
							// before its claim: issue 31); replays from a replay cache
							// count as such (issue 28). The lease route's mountings change
							// nothing of the read: one is enough.
							t.Run(name+", reading its key first", func(t *testing.T) { runHTTPCell(t, s, r, h, m, want, regime{readFirst: true}) })
							if m == OneRoute {
								t.Run(name+", reading its key first, with a replay cache", func(t *testing.T) {
									runHTTPCell(t, s, r, h, m, want, regime{readFirst: true, cache: true})
								})
								// Sealed records (SPEC §19): the whole promise again, under
								// a keyring, and the records sealed at rest.
								t.Run(name+", sealed", func(t *testing.T) { runHTTPCell(t, s, r, h, m, want, regime{sealed: true}) })
							}
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
	header     http.Header
	replayed   bool
	code       string // the error code of an idem error
	retryAfter string
	trailer    http.Header
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s (replayed %v)", a.status, strings.TrimSpace(a.body), a.replayed)
}

// inFlight reports whether a is the 409 of a key in flight.
func (a answer) inFlight() bool {
	return a.status == http.StatusConflict && a.code == idem.CodeRequestInProgress
}

// executed reports whether a is a 2xx that says it was not replayed: an execution's.
func (a answer) executed() bool { return a.status/100 == 2 && !a.replayed }

// storedHeaders are the headers of the cells' 201 that a replay must carry (SPEC §6's
// default allow-list); it must never carry Set-Cookie, which the 201 has too.
var storedHeaders = []string{"Content-Type", "Location", "Etag", "Cache-Control"}

// notReplayOf says why a is not the replay of the execution's answer of: "" when it
// is one (its status, body and stored headers, marked Idempotent-Replayed: true, and no
// Set-Cookie).
func notReplayOf(a, of answer) string {
	switch {
	case !a.replayed:
		return "it does not say Idempotent-Replayed: true"
	case a.status != of.status || a.body != of.body:
		return "its status or body is not the execution's"
	case a.header.Get("Set-Cookie") != "":
		return "it carries the execution's Set-Cookie, which is never stored"
	}
	for _, name := range storedHeaders {
		if got, want := a.header.Get(name), of.header.Get(name); got != want {
			return fmt.Sprintf("its %s is %q, the execution's %q", name, got, want)
		}
	}
	return ""
}

// A request option: what the cell's request differs in from the usual one.
type reqOption func(*http.Request)

// withBody sends body instead of the usual one.
func withBody(body string) reqOption {
	return func(r *http.Request) {
		r.Body = io.NopCloser(strings.NewReader(body))
		r.ContentLength = int64(len(body))
	}
}

// as sends the request as another principal, of bearer token tok.
func as(tok string) reqOption {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tok) }
}

// failing asks the handler to answer 503 and charge nothing.
func failing(r *http.Request) { r.Header.Set(failHeader, "1") }

// stallingAt asks the handler to pass the cell's gate of that name first.
func stallingAt(gate string) reqOption {
	return func(r *http.Request) { r.Header.Set(stallHeader, gate) }
}

const chargeBody = `{"amount":2000,"currency":"usd"}`

func post(t *testing.T, c *http.Client, url, key string, opts ...reqOption) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/charges", strings.NewReader(chargeBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_matrix")
	req.Header.Set("Idempotency-Key", key)
	for _, o := range opts {
		o(req)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Errorf("POST: %v", err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, body: string(b), header: resp.Header, replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		retryAfter: resp.Header.Get("Retry-After"), trailer: resp.Trailer}
	if i := strings.Index(a.body, `"code":"`); i >= 0 {
		a.code, _, _ = strings.Cut(a.body[i+len(`"code":"`):], `"`)
	}
	return a
}

func scope(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil }

// httpCell is one HTTP cell as it runs: its env, its route, what it observed.
type httpCell struct {
	t       *testing.T
	s       Store
	r       Route
	h       Helper
	e       *env
	logs    *lockedBuffer
	clock   *testkit.Clock
	handler http.Handler
	srv     *httptest.Server
	other   *httptest.Server // another process serving the same route on the same store

	// What the Observer saw: the reads before the handler, the completions made by a
	// store call of their own, and the completions stored, by whether they ran inside
	// the application's transaction.
	lookups, cacheHits, completeCalls, storedInTx, storedApart atomic.Int64

	// gates hold the requests that ask to stall (stallingAt).
	gates testkit.Gates
	// sealed: the cell's records are sealed (regime.sealed).
	sealed bool
}

// regime is how a cell's route runs: with readFirst (a route that holds) the route is
// first sent retries of another key until it reads each key first (a ClaimInHandler
// route before its handler, SPEC §7; a lease route before its claim), and every request of the cell must then be such a read (or an
// answer before it: 409 for a key in flight in the process, a replay from the cache):
// the cell checks that regime, not the one of new keys. With cache the middleware keeps
// a replay cache (Config.ReplayCacheSize).
//
// With sealed the cell's two processes seal records under a keyring each, of one key
// and the store's MAC secret (Config.Seal, SPEC §19), and the cell also checks what the
// store holds (httpCell.sealedAtRest).
type regime struct{ readFirst, cache, sealed bool }

// runHTTPCell builds one cell and holds it to want.
func runHTTPCell(t *testing.T, s Store, r Route, h Helper, m Mount, want Outcome, rg regime) {
	t.Parallel()
	c := &httpCell{t: t, s: s, r: r, h: h, e: openEnv(t, s), logs: &lockedBuffer{}, clock: testkit.NewClock(time.Now())}
	observer := &observe.Observer{
		Claimed: func(ev observe.ClaimEvent) {
			if ev.Outcome == observe.OutcomeReplayedFromCache {
				c.cacheHits.Add(1)
			}
		},
		StoreCall: func(ev observe.StoreCallEvent) {
			switch ev.Op {
			case observe.StoreOpLookup:
				c.lookups.Add(1)
			case observe.StoreOpComplete:
				c.completeCalls.Add(1)
			}
		},
		Completed: func(ev observe.CompletionEvent) {
			switch {
			case ev.Result != observe.CompletionStored:
			case ev.InTx:
				c.storedInTx.Add(1)
			default:
				c.storedApart.Add(1)
			}
		},
	}
	cfg := idem.Config{Store: c.e.store, Scope: scope, Logger: slog.New(slog.NewTextHandler(c.logs, nil)),
		Observer: observer, Clock: c.clock.Now, ReplayCacheSize: cacheSize(rg.cache)}
	otherCfg := cfg
	if rg.sealed {
		cfg.Seal, otherCfg.Seal = keyring(t, c.e.store), keyring(t, c.e.store)
		c.sealed = true
	}
	mw := idem.New(cfg)
	opts := idem.RouteOptions{ClaimInHandler: r == ClaimInHandler}
	refusal := func() (p any) {
		defer func() { p = recover() }()
		c.handler = mount(m, mw, opts, c.e.handler(h, c.gates.Pass))
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
	c.srv = serve(t, c.handler)
	// Another process on the same store: its own middleware, which knows no key.
	c.other = serve(t, mount(m, idem.New(otherCfg), opts, c.e.handler(h, c.gates.Pass)))
	readFirst := rg.readFirst
	if readFirst {
		warmUp(t, c.srv)
		if c.lookups.Load() == 0 && !rg.cache { // with a cache: the cell's first request reads
			t.Fatalf("retries of one key did not make the %s route read its keys first", r)
		}
		c.lookups.Store(0)
		c.cacheHits.Store(0)
	}
	seqKey, concKey, first, retry, conc := sendTo(t, c.srv)
	all := append([]answer{first, retry}, conc...)
	reached := -c.cacheHits.Load() // the requests not answered in flight or from the cache: each reached the store
	for _, a := range all {
		if !a.inFlight() {
			reached++
		}
	}
	if n := c.lookups.Load(); readFirst && n < reached {
		t.Fatalf("%d of the cell's %d requests not answered in flight or from the cache read their key before the handler, want every one", n, reached)
	}

	switch want {
	case ExactlyOnce:
		if h == Respond {
			if n, m := c.e.respondRuns.get(seqKey), c.e.respondRuns.get(concKey); n != RespondRuns || m != RespondRuns {
				t.Fatalf("%s's function ran %d times for a request and its retry, %d for 16 concurrent duplicates; want %d each",
					HelperAPI(s, h), n, m, RespondRuns)
			}
		}
		c.holdsExactlyOnce(seqKey, concKey, first, retry, conc)
		if rg.cache && c.cacheHits.Load() == 0 {
			t.Fatal("no answer came from the replay cache")
		}
	case Loud:
		c.failsLoudly(seqKey, concKey, all)
	}
}

// cacheSize is the Config.ReplayCacheSize of a cell with a replay cache, or none.
func cacheSize(cache bool) int {
	if cache {
		return 64
	}
	return 0
}

// holdsExactlyOnce is the promise of a cell that holds (SPEC §5–§7), all of it, on the
// answers of sendDuplicates and on probes of its own.
func (c *httpCell) holdsExactlyOnce(seqKey, concKey string, first, retry answer, conc []answer) {
	t := c.t
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("the first request was answered %v; want its 201, not marked as a replay", first)
	}
	if why := notReplayOf(retry, first); why != "" {
		t.Fatalf("the retry was answered %v, which is not the first answer's replay: %s", retry, why)
	}
	wantExactlyOnce(t, "the concurrent duplicates", conc)
	for _, key := range []string{seqKey, concKey} {
		if n := c.e.charges(t, key); n != 1 {
			t.Fatalf("one key made %d charges, want 1", n)
		}
	}

	// A retry that another process serves is the first answer's replay too.
	if a := post(t, c.other.Client(), c.other.URL, seqKey); notReplayOf(a, first) != "" {
		t.Fatalf("the retry that another process served was answered %v: %s", a, notReplayOf(a, first))
	}
	// A different body under a used key is refused, and the record is untouched.
	if a := post(t, c.srv.Client(), c.srv.URL, seqKey, withBody(`{"amount":9999,"currency":"usd"}`)); a.status != http.StatusConflict || a.code != idem.CodeKeyReused || a.replayed {
		t.Fatalf("a different body under a used key was answered %v; want 409 key_reused, never the first answer", a)
	}
	if a := post(t, c.srv.Client(), c.srv.URL, seqKey); notReplayOf(a, first) != "" {
		t.Fatalf("after a different body under the key, its retry was answered %v: %s", a, notReplayOf(a, first))
	}
	// Another principal's key is its own: its own execution, never the first's body.
	other := post(t, c.srv.Client(), c.srv.URL, seqKey, as("sk_test_other"))
	if !other.executed() || other.body == first.body {
		t.Fatalf("another principal sending the same key was answered %v; want its own execution, never the first principal's answer", other)
	}
	if n := c.e.charges(t, seqKey); n != 2 {
		t.Fatalf("two principals' executions under one key made %d charges, want 2", n)
	}
	c.releasingStatusFreesTheKey()
	if c.r == Lease {
		c.staleHolderCommitsNothing()
	}

	// Retry-After on every 409 of a key in flight.
	for _, a := range conc {
		if a.inFlight() && a.header.Get("Retry-After") == "" {
			t.Fatalf("a duplicate in flight was answered 409 without Retry-After: %v", a)
		}
	}
	// The SPEC §7 helpers of a store with transactions complete the record inside the
	// application's transaction: no completion of the record of its own.
	if hasTransactions(c.s) && (c.h == Respond || c.h == InTx || c.h == Finish) {
		if n := c.completeCalls.Load(); n != 0 || c.storedApart.Load() != 0 || c.storedInTx.Load() == 0 {
			t.Fatalf("%s completed %d records with a store call of their own (%d completions apart, %d inside the application's transaction); "+
				"want every completion inside the transaction", HelperAPI(c.s, c.h), n, c.storedApart.Load(), c.storedInTx.Load())
		}
	}
	if strings.Contains(c.logs.String(), "level=ERROR") {
		t.Fatalf("an error was logged by a combination that holds:\n%s", c.logs)
	}
	if c.sealed {
		c.sealedAtRest(seqKey, first)
	}
	c.newerFormatLevelFailsClosed()
}

// newerFormatLevelFailsClosed: a release that knows a format level newer than this
// one's finalized its upgrade on the cell's store mid-run (SPEC §20). Once the state
// this process knows is StoreStateRefresh old, its next request reads the store's
// state and fails closed: 503 store_unavailable, no execution, one ERROR naming both
// releases; the other process too.
func (c *httpCell) newerFormatLevelFailsClosed() {
	t := c.t
	ctx := t.Context()
	cur, err := idem.ReadStoreState(ctx, c.e.store)
	if err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("state-%d", cur.Seq+1)
	body, _ := json.Marshal(map[string]any{"level": idem.CurrentFormatLevel + 1, "release": "9.9.9", "written_at": time.Now().UTC()})
	p := &idemstore.ClaimParams{Scope: idemstore.ReservedScope, Key: key, Fingerprint: idem.FingerprintInput("9.9.9", nil),
		Token: "tok-9.9.9", RecordID: "00112233445566778899aabbccddeeff", Lease: time.Minute, TTL: idem.MaxTTL}
	if res, err := c.e.store.RecordClaim(ctx, p); err != nil || res.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("writing the newer release's %s: %+v, %v", key, res, err)
	}
	if err := c.e.store.RecordComplete(ctx, &idemstore.CompleteParams{Scope: idemstore.ReservedScope, Key: key, Token: p.Token,
		Response: &idem.Response{Status: 200, Body: body}, TTL: idem.MaxTTL}); err != nil {
		t.Fatal(err)
	}
	c.clock.Advance(idem.StoreStateRefresh)
	for _, srv := range []*httptest.Server{c.srv, c.other} {
		key := "key-after-a-newer-level-" + rand.Text()
		if a := post(t, srv.Client(), srv.URL, key); a.status != http.StatusServiceUnavailable || a.code != idem.CodeStoreUnavailable || a.replayed {
			t.Fatalf("a request after a newer release raised the store's format level was answered %v; want 503 store_unavailable", a)
		}
		if n := c.e.charges(t, key); n != 0 {
			t.Fatalf("a request refused for the store's newer format level made %d charges, want 0", n)
		}
	}
	if logs := c.logs.String(); strings.Count(logs, "level=ERROR") < 1 || !strings.Contains(logs, "9.9.9") {
		t.Fatalf("no ERROR naming the newer release was logged:\n%s", logs)
	}
}

// keyring opens the matrix's key and a keyring on st: one process's.
func keyring(t *testing.T, st idemstore.Store) *seal.Keyring {
	t.Helper()
	key, err := cloudkeys.Open(t.Context(), sealKeyURL)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := idem.OpenKeyring(t.Context(), st, key)
	if err != nil {
		t.Fatal(err)
	}
	return ring
}

// sealKeyURL is the key the sealed cells seal under.
const sealKeyURL = "base64key://AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

// sealedAtRest: the record of key, whose first answer is first, holds its response
// sealed (no header, no byte of the body in clear) under a keyed fingerprint that the
// request's plain SHA-256 is not; and the response of another principal's record of
// the key, copied onto it in the store, does not open there: 500 record_unreadable, no
// execution, an ERROR naming the key (SPEC §19).
func (c *httpCell) sealedAtRest(key string, first answer) {
	t := c.t
	rec, err := c.e.store.RecordGet(t.Context(), &idemstore.GetParams{Scope: "Bearer sk_test_matrix", Key: key, Now: c.clock.Now()})
	if err != nil {
		t.Fatalf("reading the record: %v", err)
	}
	var id struct{ ID string }
	_ = json.Unmarshal([]byte(first.body), &id)
	if rec.Response == nil || !seal.Sealed(rec.Response.Body) || len(rec.Response.Header) != 0 || id.ID == "" ||
		strings.Contains(string(rec.Response.Body), id.ID) {
		t.Fatalf("the store holds the response %+v; want it sealed, without a header or its id %q in clear", rec.Response, id.ID)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/charges", nil)
	req.Header.Set("Content-Type", "application/json")
	plain := idem.FingerprintRequest(req, []byte(chargeBody))
	if !rec.Fingerprint.Keyed() || rec.Fingerprint.Sum == plain.Sum {
		t.Fatalf("the store holds the fingerprint v%d %x; want a keyed one, not the request's plain SHA-256", rec.Fingerprint.Version, rec.Fingerprint.Sum)
	}
	if c.e.move == nil {
		return // the memory store has no tables to write behind its back
	}
	// Moved whole, and with the record id it names rewritten to the record's: only the
	// associated data (the scope, key and record id) then tells it apart.
	src, err := c.e.store.RecordGet(t.Context(), &idemstore.GetParams{Scope: "Bearer sk_test_other", Key: key, Now: c.clock.Now()})
	if err != nil || !bytes.Contains(src.Response.Body, []byte(src.ID)) {
		t.Fatalf("reading the other principal's record: %v", err)
	}
	c.e.move(t, key, "Bearer sk_test_other", "Bearer sk_test_matrix", bytes.Replace(src.Response.Body, []byte(src.ID), []byte(rec.ID), 1))
	if a := post(t, c.srv.Client(), c.srv.URL, key); a.status != http.StatusInternalServerError || a.code != idem.CodeRecordUnreadable || a.replayed {
		t.Fatalf("the key whose record holds another principal's sealed response was answered %v; want 500 record_unreadable", a)
	}
	if n := c.e.charges(t, key); n != 2 {
		t.Fatalf("after the moved response, %d charges under the key, want 2: it ran again", n)
	}
	if logs := c.logs.String(); !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "key_id=base64key:") {
		t.Fatalf("no ERROR naming the key of the record that does not open:\n%s", logs)
	}
}

// releasingStatusFreesTheKey: a 503 answered through the helper, with nothing charged,
// frees the key (SPEC §6): the retry executes afresh, and its own retry replays it.
func (c *httpCell) releasingStatusFreesTheKey() {
	t := c.t
	key := "release-" + newID()
	if a := post(t, c.srv.Client(), c.srv.URL, key, failing); a.status != http.StatusServiceUnavailable || a.replayed {
		t.Fatalf("a request that the handler answers 503 was answered %v; want its 503, not marked as a replay", a)
	}
	fresh := post(t, c.srv.Client(), c.srv.URL, key)
	if fresh.status != http.StatusCreated || fresh.replayed {
		t.Fatalf("the retry of a request answered 503 was answered %v; want a fresh execution's 201: a 503 releases the key", fresh)
	}
	if a := post(t, c.srv.Client(), c.srv.URL, key); notReplayOf(a, fresh) != "" {
		t.Fatalf("the retry after the fresh execution was answered %v: %s", a, notReplayOf(a, fresh))
	}
	if n := c.e.charges(t, key); n != 1 {
		t.Fatalf("a 503 and a fresh execution made %d charges, want 1", n)
	}
}

// staleHolderCommitsNothing: a holder that stalls past its lease while a duplicate
// takes the key over (the injected clock moves past the lease) commits nothing, and
// its client never gets a success of its own (SPEC §5's fencing), even while the taker
// still holds the key: the taker's execution is the key's only one. With the database
// directly the stale holder's write commits (the table says so: use a helper), but its
// client still gets no success. (On Redis + backstop the record's token cannot fence
// the application's database: the stale holder's transaction commits with its backstop
// row, its client gets no success, and the taker answers that row's response.)
func (c *httpCell) staleHolderCommitsNothing() {
	t := c.t
	key := "lapse-" + newID()
	staleGate, takerGate := c.gates.Add("stale"), c.gates.Add("taker")
	defer proceed(staleGate, takerGate) // a failure below must not leave a handler waiting
	stale, taken := make(chan answer, 1), make(chan answer, 1)
	go func() { stale <- post(t, c.srv.Client(), c.srv.URL, key, stallingAt("stale")) }()
	select {
	case <-staleGate.Entered:
	case a := <-stale:
		t.Fatalf("a request of a new key was answered %v before its handler ran", a)
	}
	if a := post(t, c.srv.Client(), c.srv.URL, key); !a.inFlight() || a.header.Get("Retry-After") == "" {
		t.Fatalf("a duplicate while the holder runs was answered %v (Retry-After %q); want 409 request_in_progress with Retry-After",
			a, a.header.Get("Retry-After"))
	}
	c.clock.Advance(idem.DefaultLease + time.Second)
	go func() { taken <- post(t, c.srv.Client(), c.srv.URL, key, stallingAt("taker")) }()
	select {
	case <-takerGate.Entered: // the taker holds the key
	case a := <-taken:
		t.Fatalf("a duplicate after the holder's lease lapsed was answered %v; want it to take the key over and execute", a)
	}
	proceed(staleGate)
	stalled := <-stale
	if stalled.status/100 == 2 {
		t.Fatalf("the holder that stalled past its lease was answered %v after its key was taken over; want 503 store_unavailable, never a success", stalled)
	}
	proceed(takerGate)
	taker := <-taken
	backstopped := strings.HasPrefix(HelperAPI(c.s, Respond), "backstop.")
	if taker.status != http.StatusCreated || taker.replayed && !backstopped {
		t.Fatalf("the duplicate that took the key over was answered %v; want it to execute, the stale holder having committed nothing", taker)
	}
	want := 1
	if c.h == Direct {
		want = 2
	}
	if n := c.e.charges(t, key); n != want {
		t.Fatalf("a holder that stalled past its lease and the duplicate that took its key over made %d charges, want %d", n, want)
	}
	if a := post(t, c.srv.Client(), c.srv.URL, key); a.status != taker.status || a.body != taker.body || !a.replayed {
		t.Fatalf("the retry after the takeover was answered %v, not the taker's answer replayed", a)
	}
}

// routeNamed matches a log line's attribute that names the cell's route: the ServeMux
// pattern, or the method and path where the router set none.
var routeNamed = regexp.MustCompile(`route="?(POST )?/v1/charges"?( |$)`)

// proceed lets the handlers waiting at gates go on (once each).
func proceed(gates ...testkit.Gate) {
	for _, g := range gates {
		select {
		case <-g.Proceed:
		default:
			close(g.Proceed)
		}
	}
}

// failsLoudly is the promise of a misuse: no success, no replay, the effect of each
// request as the table says (a late response is refused before its transaction
// commits: no charge), and an error naming the route and the fix.
func (c *httpCell) failsLoudly(seqKey, concKey string, all []answer) {
	t := c.t
	if all[0].status < 500 {
		t.Fatalf("the first request was answered %v; want a 5xx", all[0])
	}
	for _, a := range all {
		if a.status/100 == 2 || a.replayed {
			t.Fatalf("an answer %v is a 2xx or a replay: a misuse must fail loudly on every request", a)
		}
	}
	seq, conc := 0, 0
	if c.h == Direct {
		// ClaimInHandler: nothing claims the key, and every request that reaches the
		// handler writes (a duplicate while another runs here is answered 409 first).
		seq = 2
		for _, a := range all[2:] {
			if !a.inFlight() {
				conc++
			}
		}
	}
	if n, m := c.e.charges(t, seqKey), c.e.charges(t, concKey); n != seq || m != conc {
		t.Fatalf("a request and its retry made %d charges, 16 duplicates %d; want %d and %d", n, m, seq, conc)
	}
	fix := LoudFix(c.h)
	for _, line := range strings.Split(c.logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") && routeNamed.MatchString(line) && strings.Contains(line, fix) {
			return
		}
	}
	t.Fatalf("no error naming the route and the fix (%q) was logged:\n%s", fix, c.logs)
}

// wantExactlyOnce checks the answers of concurrent duplicates of one key: exactly one
// execution answered (a 2xx not replayed); every other answer is its replay (status,
// body, stored headers) or an in-flight 409.
func wantExactlyOnce(t *testing.T, what string, answers []answer) {
	t.Helper()
	var executed []answer
	for _, a := range answers {
		if a.executed() {
			executed = append(executed, a)
		}
	}
	if len(executed) != 1 {
		t.Fatalf("%s: %d answers from an execution, want 1: %v", what, len(executed), answers)
	}
	for _, a := range answers {
		switch {
		case a.status/100 == 2 && a.replayed:
			if why := notReplayOf(a, executed[0]); why != "" {
				t.Fatalf("%s: an answer %v is not the execution's replay: %s", what, a, why)
			}
		case a.executed(), a.inFlight():
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
func warmUp(t *testing.T, srv *httptest.Server) {
	t.Helper()
	key := "warm-" + newID()
	for i := range 25 {
		if a := post(t, srv.Client(), srv.URL, key); a.status != http.StatusCreated || a.replayed != (i > 0) {
			t.Fatalf("warming up, request %d of one key: %v", i+1, a)
		}
	}
}

// serve serves handler on a loopback port until t ends.
func serve(t *testing.T, handler http.Handler) *httptest.Server {
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = duplicates
	return srv
}

// sendDuplicates serves handler on a loopback port and sends it what every cell sends
// (sendTo).
func sendDuplicates(t *testing.T, handler http.Handler) (seqKey, concKey string, first, retry answer, conc []answer) {
	t.Helper()
	return sendTo(t, serve(t, handler))
}

// sendTo sends srv what every cell sends: a request and its sequential retry under
// seqKey, then 16 concurrent duplicates under concKey.
func sendTo(t *testing.T, srv *httptest.Server) (seqKey, concKey string, first, retry answer, conc []answer) {
	t.Helper()
	client := srv.Client()
	return sendDuplicatesTo(t, client, srv.URL)
}

// sendDuplicatesTo is sendTo the server at url, through client.
func sendDuplicatesTo(t *testing.T, client *http.Client, url string, opts ...reqOption) (seqKey, concKey string, first, retry answer, conc []answer) {
	t.Helper()
	seqKey, concKey = "seq-"+newID(), "conc-"+newID()
	first = post(t, client, url, seqKey, opts...)
	retry = post(t, client, url, seqKey, opts...)
	conc = make([]answer, duplicates)
	var wg sync.WaitGroup
	for i := range conc {
		wg.Go(func() { conc[i] = post(t, client, url, concKey, opts...) })
	}
	wg.Wait()
	t.Logf("first %v; retry %v; concurrent %v", first, retry, conc)
	return seqKey, concKey, first, retry, conc
}
