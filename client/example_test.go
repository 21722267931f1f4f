package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
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

// A request of one's own, with its bearer token and context, through the retrying
// client. When the server keeps failing, the error says how many attempts were made
// and which setting ended them.
func ExampleRetryError() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0")
		idem.WriteError(w, r, idem.ProfileSeed, idem.CodeStoreUnavailable, "")
	}))
	defer srv.Close()
	url, ctx := srv.URL, context.Background()

	c := client.NewClient(&client.Transport{MaxAttempts: 3})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/charges", strings.NewReader(`{"amount": 2000, "currency": "usd"}`))
	if err != nil {
		log.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer sk_test_1")
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req) // adds an Idempotency-Key and keeps it across the attempts
	// err: Post "…/v1/charges": POST …/v1/charges giving up after 3 attempt(s) in 2ms:
	//      Transport.MaxAttempts (3) reached; last attempt: 503 Service Unavailable (store_unavailable)
	var retryErr *client.RetryError
	if errors.As(err, &retryErr) {
		var last *client.StatusError
		errors.As(err, &last)
		fmt.Println("limit:", retryErr.Limit)
		fmt.Println("attempts:", retryErr.Attempts)
		fmt.Println("last answer:", last)
		return
	}
	defer resp.Body.Close()
	// Output:
	// limit: Transport.MaxAttempts
	// attempts: 3
	// last answer: 503 Service Unavailable (store_unavailable)
}
