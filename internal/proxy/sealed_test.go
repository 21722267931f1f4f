package proxy_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/proxy"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/seal/cloudkeys"
	"github.com/idem-go/idem/store/storetest"
)

// sealedSetup is setup with a keyring over the bundle's store (the store is opened
// first, then the keyring on it, then the proxy: as `idem proxy --encryption-key`).
func sealedSetup(t *testing.T, configure ...func(*proxy.Config)) *bundle {
	t.Helper()
	return setup(t, append([]func(*proxy.Config){func(c *proxy.Config) {
		key, err := cloudkeys.Open(testenv.Context(t), storetest.SealKeyURL)
		if err != nil {
			t.Fatal(err)
		}
		if c.Idem.Seal, err = idem.OpenKeyring(testenv.Context(t), c.Idem.Store, key); err != nil {
			t.Fatal(err)
		}
	}}, configure...)...)
}

func TestASealedProxyKeysItsScopesAndStoresNoSecret(t *testing.T) {
	t.Parallel()
	b := sealedSetup(t)
	body := `{"card_number": "` + storetest.Secrets[0] + `", "token": "` + storetest.Secrets[1] + `"}`
	first := b.send("POST", "/v1/echo", key1, "tok_a", body)
	if first.status != http.StatusCreated || !strings.Contains(first.body, storetest.Secrets[0]) {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	again := b.send("POST", "/v1/echo", key1, "tok_a", body)
	if again.status != first.status || again.body != first.body || !again.replayed() || b.up.count("/v1/echo") != 1 {
		t.Fatalf("retry: %d %q replayed=%v after %d forwards; want the first answer replayed", again.status, again.body, again.replayed(), b.up.count("/v1/echo"))
	}
	if _, err := b.record("tok_a", key1); err == nil {
		t.Error("a record under the plain SHA-256 of the credential: the scope can be recomputed without the key")
	}
	raw := rawDB(t, b)
	if s := storetest.HoldsSecret(raw, append(storetest.Secrets, sha256Hex("Bearer tok_a"), "tok_a")...); s != "" {
		t.Errorf("the store holds %q", s)
	}
}

// rawDB is every row of the proxy's records, each column as text and as bytes.
func rawDB(t *testing.T, b *bundle) []byte {
	t.Helper()
	rows, err := b.store.DB().Query(`SELECT scope, key, fingerprint, response_headers, response_body FROM idem_records`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var raw []byte
	for rows.Next() {
		var scope, key string
		var fp, hdr, body []byte
		if err := rows.Scan(&scope, &key, &fp, &hdr, &body); err != nil {
			t.Fatal(err)
		}
		raw = append(append(append(append(append(raw, scope...), key...), fp...), hdr...), body...)
	}
	return raw
}

func mustURL(t *testing.T, raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestANoStoreBodyRouteKeepsTheOutcomeOnlyWhateverRouteItMatches(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *proxy.Config) {
		c.RequireKey = []string{"POST /v1/"}
		c.NoStoreBody = []string{"POST /v1/echo"}
	})
	first := b.send("POST", "/v1/echo", key1, "tok_a", `{}`)
	if first.status != http.StatusCreated || first.body == "" {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	rec, err := b.store.RecordGet(testenv.Context(t), &idemstore.GetParams{Scope: sha256Hex("Bearer tok_a"), Key: key1})
	if err != nil || !rec.Response.NotStored || len(rec.Response.Body) != 0 {
		t.Fatalf("stored %+v, %v; want the outcome only", rec, err)
	}
	if again := b.send("POST", "/v1/echo", key1, "tok_a", `{}`); again.status != http.StatusConflict || again.code() != idem.CodeResponseNotStored {
		t.Errorf("retry: %d %s; want 409 response_not_stored", again.status, again.body)
	}
	if n := b.up.count("/v1/echo"); n != 1 {
		t.Errorf("forwarded %d times", n)
	}
	if got := b.send("POST", "/v1/chunked", key1+"x", "tok_a", `{}`); got.status != http.StatusCreated {
		t.Fatal(got.status)
	}
	if again := b.send("POST", "/v1/chunked", key1+"x", "tok_a", `{}`); !again.replayed() {
		t.Errorf("a route outside NoStoreBody: %d %s; want its replay", again.status, again.body)
	}
	if err := (proxy.Config{Upstream: mustURL(t, b.up.srv.URL), NoStoreBody: []string{"POST /v1/{"}}).Validate(); err == nil || !strings.Contains(err.Error(), "Config.NoStoreBody") {
		t.Errorf("a bad NoStoreBody pattern: %v", err)
	}
}
