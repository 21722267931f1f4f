package client_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
)

// A POST gets a key, survives a 503 and reports how many attempts it took.
func ExampleNewClient() {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			idem.WriteError(w, r, idem.ProfileSeed, idem.CodeStoreUnavailable, "")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"object": "charge", "idempotency_key": %q}`, r.Header.Get(client.HeaderKey))
	}))
	defer srv.Close()

	c := client.NewClient(&client.Transport{MaxAttempts: 3})
	resp, err := c.Post(srv.URL+"/v1/charges", "application/json",
		strings.NewReader(`{"amount": 2000, "currency": "usd"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	key := resp.Request.Header.Get(client.HeaderKey) // the key the Transport sent
	fmt.Printf("%s after %d attempt(s); UUID key: %v\n", resp.Status, client.Attempts(resp), len(key) == 36)
	// Output: 201 Created after 2 attempt(s); UUID key: true
}
