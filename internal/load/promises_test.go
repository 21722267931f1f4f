package load_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/load"
)

// TestVerifierFailsOnEveryBrokenPromise is the list of promises the exactly-once
// verifier checks. Each case is a fake payments API that breaks one of them, and the
// verifier must fail on it, naming the violation. The real payments API keeps them
// all (TestLoadOfThePaymentsAPIIsExactlyOnce).
func TestVerifierFailsOnEveryBrokenPromise(t *testing.T) {
	t.Parallel()
	create := func(f *fake, key string, n int) (int, string) { return f.create(key) }
	var answered sync.Map // key → the charge its first answer named
	cases := []struct {
		promise   string
		cfg       load.Config
		behave    func(f *fake, key string, n int) (int, string)
		configure func(f *fake)
		want      string // in a discrepancy
	}{
		{
			promise: "a key has at most one charge: a duplicate does not charge again",
			cfg:     load.Config{ConcurrentDuplicates: 2, Requests: 40},
			// Every send charges, and every answer carries the key's first charge: the
			// answers agree, the list does not.
			behave: func(f *fake, key string, n int) (int, string) {
				f.create(key)
				return http.StatusCreated, f.first(key)
			},
			want: " has 2 charges (ch_",
		},
		{
			promise: "a key has at most one charge, even when it never got a final answer",
			cfg:     load.Config{Requests: 4, RetryDeadline: 300 * time.Millisecond},
			behave: func(f *fake, key string, n int) (int, string) {
				f.create(key)
				return -http.StatusServiceUnavailable, "store_unavailable"
			},
			want: " charges (ch_",
		},
		{
			promise: "a replay answers what the first answer did, not 409 response_not_stored",
			cfg:     load.Config{Endpoint: load.EndpointReplay, Requests: 20},
			behave: func(f *fake, key string, n int) (int, string) {
				if n == 1 {
					return f.create(key)
				}
				return -http.StatusConflict, "response_not_stored"
			},
			want: "first answered 201 (ch_1), later 409 response_not_stored (20 times)",
		},
		{
			promise: "an identical retry is replayed, not refused as key_reused",
			// One worker: each duplicate is sent after its key's first answer came.
			cfg: load.Config{Concurrency: 1, DuplicateRatio: 0.5, Requests: 40},
			behave: func(f *fake, key string, n int) (int, string) {
				if n == 1 {
					return f.create(key)
				}
				return -http.StatusConflict, "key_reused"
			},
			want: ", later 409 key_reused (",
		},
		{
			promise: "a replay carries the first answer's charge",
			cfg:     load.Config{ConcurrentDuplicates: 2, Requests: 20},
			behave:  create, // every send charges anew and answers its own charge
			want:    ", later 201 (ch_",
		},
		{
			promise: "every charge answered 201 is in the list",
			cfg:     load.Config{Requests: 10},
			behave:  create,
			configure: func(f *fake) {
				f.hide = func(c charge) bool { return c.ID == "ch_1" }
			},
			want: " but has no charge",
		},
		{
			promise: "no charge appears after the listing",
			cfg:     load.Config{Requests: 10},
			behave:  create,
			configure: func(f *fake) {
				// A late execution of the first key commits just after the first listing.
				f.afterList = func(f *fake, n int) {
					if n == 1 {
						f.create(*f.charges[0].IdempotencyKey)
					}
				}
			},
			want: "appeared after the first listing",
		},
		{
			promise: "a key answered with an error has no charge",
			cfg:     load.Config{Requests: 10},
			behave: func(f *fake, key string, n int) (int, string) {
				f.create(key)
				return -http.StatusBadRequest, "parameter_invalid"
			},
			want: "was answered 400 parameter_invalid but has 1 charge",
		},
		{
			promise: "every charge belongs to a key of the run",
			cfg:     load.Config{Requests: 10},
			behave: func(f *fake, key string, n int) (int, string) {
				if len(f.charges) == 3 {
					f.create("") // a charge without a key
				}
				return f.create(key)
			},
			want: "1 charge without an idempotency key",
		},
		{
			promise: "behind a proxy, every charge is one that an answer named",
			// An API without keys of its own behind a proxy that let a duplicate
			// through: it charged again, and that answer reached no client.
			cfg: load.Config{ConcurrentDuplicates: 2, Requests: 40, UnkeyedAPI: true},
			behave: func(f *fake, key string, n int) (int, string) {
				_, id := f.create("")
				first, _ := answered.LoadOrStore(key, id)
				return http.StatusCreated, first.(string)
			},
			want: "without an idempotency key (ch_",
		},
	}
	for _, tc := range cases {
		t.Run(tc.promise, func(t *testing.T) {
			t.Parallel()
			var configure []func(*fake)
			if tc.configure != nil {
				configure = append(configure, tc.configure)
			}
			cfg := tc.cfg
			cfg.URL = fakeAPI(t, tc.behave, configure...).URL
			if cfg.Concurrency == 0 {
				cfg.Concurrency = 4
			}
			res, v := runAndVerify(t, cfg)
			out := report(res)
			if v.Result != load.ExactlyOnceFail || !strings.Contains(out, "exactly-once: FAIL: ") {
				t.Fatalf("verification %q, want fail; report:\n%s", v.Result, out)
			}
			t.Log(v.Line())
			if !strings.Contains(strings.Join(v.Discrepancies, "\n"), tc.want) {
				t.Fatalf("no discrepancy says %q:\n%s", tc.want, strings.Join(v.Discrepancies, "\n"))
			}
		})
	}
}
