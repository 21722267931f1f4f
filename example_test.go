package idem_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

// Wrap a handler so that a retried POST with the same Idempotency-Key executes once
// and gets the same response. Use store/sqlite, store/postgres or store/redis in
// production; the in-memory store is for tests and examples.
func Example() {
	charges := 0
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ch_%d","amount":2000}`, charges)
	})
	mw := idem.New(idem.Config{
		Store: memory.New(),
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	})
	h := mw.Handler(charge)

	for range 2 {
		r := httptest.NewRequest("POST", "/v1/charges", strings.NewReader(`{"amount":2000}`))
		r.Header.Set("Authorization", "Bearer sk_test_1")
		r.Header.Set("Idempotency-Key", "4f1c6a7e-2b7d-4a53-9b0e-0c1f3f2d9a11")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body, "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"id":"ch_1","amount":2000} replayed: false
	// 201 {"id":"ch_1","amount":2000} replayed: true
	// charges: 1
}

// A per-route option: PATCH with absolute values is idempotent by nature (SPEC §2),
// so this route accepts requests without a key.
func ExampleMiddleware_Route() {
	mw := idem.New(idem.Config{
		Store: memory.New(),
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	})
	setEmail := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	h := mw.Route(idem.RouteOptions{Requirement: idem.KeyOptional})(setEmail)

	r := httptest.NewRequest("PATCH", "/v1/customers/cus_1", strings.NewReader(`{"email":"a@example.com"}`))
	r.Header.Set("Authorization", "Bearer sk_test_1")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	fmt.Println(w.Code)
	// Output: 200
}

// Applications answer their own errors in the shape of the configured profile.
func ExampleWriteProblem() {
	w := httptest.NewRecorder()
	idem.WriteProblem(w, nil, idem.ProfileSeed, &idem.Problem{
		Status: http.StatusBadRequest, Code: "amount_invalid", Type: "invalid_request_error",
		Detail: "Amount must be a positive integer.",
	})
	fmt.Print(w.Code, " ", w.Body)
	// Output: 400 {"error":{"type":"invalid_request_error","code":"amount_invalid","message":"Amount must be a positive integer."}}
}

// A job runs at most once per (scope, key), however often it is delivered: a repeat
// gets the stored result without running the function again (SPEC §16).
func ExampleDo() {
	type Receipt struct{ ID string }
	sent := 0
	sendInvoice := func(ctx context.Context, invoice string) (Receipt, error) {
		sent++
		return Receipt{ID: fmt.Sprintf("rcpt_%d", sent)}, nil
	}
	ctx := context.Background()
	g := idem.NewGuard(idem.GuardConfig{Store: memory.New()}) // or mw.Guard(); a durable store in production
	// The job, then its redelivery:
	for range 2 {
		call := idem.Call{Scope: "tenant-1", Key: "job-8c1f2e4a", Fingerprint: idem.FingerprintInput("invoice.send", []byte("inv_42"))}
		receipt, replayed, err := idem.Do(ctx, g, call, func(ctx context.Context) (Receipt, error) {
			return sendInvoice(ctx, "inv_42")
		})
		fmt.Println(receipt.ID, replayed, err)
	}
	fmt.Println("sent:", sent)
	// Output:
	// rcpt_1 false <nil>
	// rcpt_1 true <nil>
	// sent: 1
}
