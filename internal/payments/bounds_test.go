package payments

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultproxy"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/postgres"
)

// proxiedPostgresBundle is postgresBundle with the store and the database behind a
// fault proxy.
func proxiedPostgresBundle(t *testing.T, opts ...option) (*bundle, *faultproxy.Proxy) {
	t.Helper()
	ctx := testenv.Context(t)
	dbURL, schema := pgtest.Schema(t)
	u, err := url.Parse(pgtest.SearchPathURL(t, dbURL, schema))
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.New(t, u.Host)
	u.Host = p.Addr()
	st, err := postgres.Open(ctx, u.String(), postgres.Config{MaxConns: 4, DisableCleaner: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return newBundle(t, st, NewPostgresStoreDB(st), opts...), p
}

// The GETs, which run outside a keyed request's lease, answer 503 db_unavailable with
// Retry-After within DBReadTimeout when the database stops answering (a partition, a
// frozen server: connections open, no replies), instead of hanging until TCP gives
// up; once it answers again they serve.
func TestGetsOfAStalledDatabaseAnswer503WithinTheReadTimeout(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	b, proxy := proxiedPostgresBundle(t, func(c *Config) { c.DBReadTimeout = timeout })
	t.Cleanup(proxy.Resume) // a GET that hangs holds a pooled connection, which closing the store waits for
	created := b.postCharge("tok_a", newKey(), `{"amount": 100, "currency": "usd"}`)
	wantStatus(t, created, http.StatusCreated)
	id := decode(t, created)["id"].(string)
	gets := []string{"/v1/charges", "/v1/charges/" + id, "/v1/charges?starting_after=" + id, "/v1/orders/ord_1"}

	proxy.Stall()
	for _, path := range gets {
		done := make(chan *httptest.ResponseRecorder, 1)
		start := time.Now()
		go func() { done <- b.do(req{method: "GET", path: path, token: "tok_a"}) }()
		select {
		case w := <-done:
			elapsed := time.Since(start)
			wantStatus(t, w, http.StatusServiceUnavailable)
			if code := apiErr(t, w)["code"]; code != "db_unavailable" || w.Header().Get("Retry-After") == "" {
				t.Errorf("GET %s during the stall: code %v, Retry-After %q; want db_unavailable with Retry-After", path, code, w.Header().Get("Retry-After"))
			}
			t.Logf("GET %s during the stall: 503 after %v", path, elapsed.Round(time.Millisecond))
		case <-time.After(timeout + 10*time.Second): // far past the bound, on a loaded machine too
			t.Fatalf("GET %s during the stall: no answer %v after it began; want 503 within DBReadTimeout (%v)", path, timeout+10*time.Second, timeout)
		}
	}
	proxy.Resume()
	for _, path := range gets[:3] {
		wantStatus(t, b.do(req{method: "GET", path: path, token: "tok_a"}), http.StatusOK)
	}
}
