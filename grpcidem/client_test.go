package grpcidem_test

import (
	"context"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/grpcidem/internal/testpb"
)

// noWait is a backoff that retries at once.
func noWait(int, *http.Response) time.Duration { return 0 }

// keys records the key each execution saw.
type keys struct {
	mu   sync.Mutex
	seen []string
}

func (k *keys) add(ctx context.Context) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if h := grpcidem.FromContext(ctx); h != nil {
		k.seen = append(k.seen, h.Key())
	} else {
		k.seen = append(k.seen, "")
	}
}

func (k *keys) all() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.seen...)
}

// flaky is a behaviour that records each execution's key and fails the first
// failures executions with code, which releases the key.
func flaky(seen *keys, failures int64, code codes.Code) func(context.Context, *testpb.ChargeRequest, int64) (*testpb.Charge, error) {
	return func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
		seen.add(ctx)
		if n <= failures {
			return nil, status.Error(code, "try again")
		}
		return nil, nil
	}
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestClientAddsAKeyAndKeepsItAcrossAttempts(t *testing.T) {
	t.Parallel()
	var seen keys
	b := setup(t, options{client: &grpcidem.ClientConfig{Backoff: noWait}, behave: flaky(&seen, 2, codes.Unavailable)})
	var attempts int
	resp, err := b.client.CreateCharge(as(t.Context(), "alice", ""), chargeRequest(), grpcidem.Attempts(&attempts))
	if err != nil {
		t.Fatal(err)
	}
	got := seen.all()
	if attempts != 3 || len(got) != 3 || !uuidV4.MatchString(got[0]) || got[1] != got[0] || got[2] != got[0] || resp.IdempotencyKey != got[0] {
		t.Fatalf("%d attempts saw keys %q (response's %q); want 3 attempts with one UUID v4 key", attempts, got, resp.IdempotencyKey)
	}
	// A second logical call gets a key of its own.
	if _, err := b.client.CreateCharge(as(t.Context(), "alice", ""), chargeRequest()); err != nil {
		t.Fatal(err)
	}
	if got := seen.all(); got[3] == got[0] {
		t.Errorf("two calls shared the key %q", got[0])
	}
}

func TestClientKeepsTheCallersKey(t *testing.T) {
	t.Parallel()
	var seen keys
	b := setup(t, options{client: &grpcidem.ClientConfig{Backoff: noWait}, behave: flaky(&seen, 1, codes.Internal)})
	if _, err := b.client.CreateCharge(as(t.Context(), "alice", key1), chargeRequest()); err != nil {
		t.Fatal(err)
	}
	if got := seen.all(); len(got) != 2 || got[0] != key1 || got[1] != key1 {
		t.Fatalf("keys %q, want the caller's %q on both attempts", got, key1)
	}
}

// A duplicate sent while the first call runs meets ABORTED with RetryInfo, waits, and
// gets the first call's response replayed: one execution.
func TestClientRetriesACallInProgressUntilItsReplay(t *testing.T) {
	t.Parallel()
	entered, proceed := make(chan struct{}), make(chan struct{})
	aborted := make(chan struct{}, 100)
	b := setup(t, options{
		// Patient: the duplicate retries every 5 ms until the first call completes,
		// however slow the machine.
		client: &grpcidem.ClientConfig{Backoff: noWait, MaxAttempts: 1 << 20, Budget: client.NewBudget(1, 1e6, 1<<20)},
		guard:  func(c *idem.GuardConfig) { c.RetryAfter = 5 * time.Millisecond },
		observe: func(err error) {
			if status.Code(err) == codes.Aborted {
				aborted <- struct{}{}
			}
		},
		behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
			if n == 1 {
				close(entered)
				<-proceed
			}
			return nil, nil
		},
	})
	type answer struct {
		resp     *testpb.Charge
		header   metadata.MD
		attempts int
		err      error
	}
	first, second := make(chan answer, 1), make(chan answer, 1)
	run := func(into chan answer) {
		var a answer
		a.resp, a.err = b.client.CreateCharge(as(t.Context(), "alice", key1), chargeRequest(), grpc.Header(&a.header), grpcidem.Attempts(&a.attempts))
		into <- a
	}
	go run(first)
	<-entered
	go run(second)
	<-aborted // the duplicate was told to wait at least once
	close(proceed)
	a, d := <-first, <-second
	if a.err != nil || d.err != nil {
		t.Fatalf("first %v, duplicate %v", a.err, d.err)
	}
	if !proto.Equal(a.resp, d.resp) || len(d.header.Get(grpcidem.ReplayedKey)) != 1 || d.attempts < 2 {
		t.Errorf("duplicate got %v (header %v) after %d attempts; want the first's %v replayed after a retry", d.resp, d.header, d.attempts, a.resp)
	}
	if n := b.svc.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

func TestClientNeverRetriesAFinalAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, options{client: &grpcidem.ClientConfig{Backoff: noWait}})
	if _, err := b.client.CreateCharge(as(t.Context(), "alice", key1), chargeRequest()); err != nil {
		t.Fatal(err)
	}
	other := chargeRequest()
	other.Amount++
	var attempts int
	_, err := b.client.CreateCharge(as(t.Context(), "alice", key1), other, grpcidem.Attempts(&attempts))
	wantStatus(t, err, codes.FailedPrecondition, idem.CodeKeyReused)
	if attempts != 1 {
		t.Errorf("%d attempts, want 1", attempts)
	}
}

// A RetryInfo delay that would end after the call's deadline is not waited for: the
// call ends at once with the server's answer, not with DEADLINE_EXCEEDED later.
func TestClientGivesUpAtOnceWhenTheServersDelayOutlastsTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t, options{
		client: &grpcidem.ClientConfig{},
		behave: func(context.Context, *testpb.ChargeRequest, int64) (*testpb.Charge, error) {
			st, _ := status.New(codes.Unavailable, "come back in a minute").
				WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Minute)})
			return nil, st.Err()
		},
	})
	ctx, cancel := context.WithTimeout(as(t.Context(), "alice", ""), 20*time.Second)
	defer cancel()
	var attempts int
	_, err := b.client.CreateCharge(ctx, chargeRequest(), grpcidem.Attempts(&attempts))
	if status.Code(err) != codes.Unavailable || attempts != 1 {
		t.Fatalf("%v after %d attempts, want the server's UNAVAILABLE after 1", err, attempts)
	}
}

func TestClientRetriesWithinMaxAttemptsAndTheBudget(t *testing.T) {
	t.Parallel()
	alwaysDown := func(context.Context, *testpb.ChargeRequest, int64) (*testpb.Charge, error) {
		return nil, status.Error(codes.Unavailable, "down")
	}
	t.Run("MaxAttempts", func(t *testing.T) {
		b := setup(t, options{client: &grpcidem.ClientConfig{Backoff: noWait, MaxAttempts: 3}, behave: alwaysDown})
		var attempts int
		_, err := b.client.CreateCharge(as(t.Context(), "alice", ""), chargeRequest(), grpcidem.Attempts(&attempts))
		if status.Code(err) != codes.Unavailable || attempts != 3 || b.svc.executions.Load() != 3 {
			t.Fatalf("%v after %d attempts (%d executions), want UNAVAILABLE after 3", err, attempts, b.svc.executions.Load())
		}
	})
	t.Run("Budget", func(t *testing.T) {
		budget := client.NewBudget(0, 0, 1) // one retry, never refilled
		b := setup(t, options{client: &grpcidem.ClientConfig{Backoff: noWait, MaxAttempts: 10, Budget: budget}, behave: alwaysDown})
		for want := range []int{2, 1} {
			var attempts int
			_, err := b.client.CreateCharge(as(t.Context(), "alice", ""), chargeRequest(), grpcidem.Attempts(&attempts))
			if status.Code(err) != codes.Unavailable || attempts != 2-want {
				t.Fatalf("call %d: %v after %d attempts, want UNAVAILABLE after %d", want+1, err, attempts, 2-want)
			}
		}
	})
}

func TestClientLeavesCallsItIsNotAskedToKeyUntouched(t *testing.T) {
	t.Parallel()
	var seen keys
	b := setup(t, options{
		client: &grpcidem.ClientConfig{Backoff: noWait, Keyed: func(method string) bool {
			return method == testpb.Payments_CreateCharge_FullMethodName
		}},
		behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
			seen.add(ctx)
			return nil, status.Error(codes.Unavailable, "down")
		},
	})
	var attempts int
	_, err := b.client.AuthorizeCharge(as(t.Context(), "alice", ""), chargeRequest(), grpcidem.Attempts(&attempts))
	if status.Code(err) != codes.Unavailable || attempts != 1 {
		t.Fatalf("%v after %d attempts, want one attempt", err, attempts)
	}
	if got := seen.all(); len(got) != 1 || got[0] != "" {
		t.Errorf("keys seen %q, want one call without a key", got)
	}
}

func TestRetryablePolicy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for c, want := range map[codes.Code]bool{
		codes.Unavailable: true, codes.Aborted: true, codes.ResourceExhausted: true, codes.Internal: true,
		codes.Unknown: true, codes.DeadlineExceeded: true,
		codes.InvalidArgument: false, codes.FailedPrecondition: false, codes.NotFound: false, codes.AlreadyExists: false,
		codes.PermissionDenied: false, codes.Unauthenticated: false, codes.OutOfRange: false,
		codes.Unimplemented: false, codes.DataLoss: false, codes.Canceled: false,
	} {
		if got := grpcidem.Retryable(ctx, status.Error(c, "x")); got != want {
			t.Errorf("Retryable(%v) = %v, want %v", c, got, want)
		}
	}
	for _, code := range []string{idem.CodeKeyReused, idem.CodeResponseNotStored, idem.CodeOutcomeUnknown} {
		st, _ := status.New(codes.Unknown, "x").WithDetails(&errdetails.ErrorInfo{Domain: grpcidem.ErrorDomain, Metadata: map[string]string{"code": code}})
		if grpcidem.Retryable(ctx, st.Err()) {
			t.Errorf("%s retryable; it is final whatever its status", code)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if grpcidem.Retryable(done, status.Error(codes.Unavailable, "x")) {
		t.Error("retryable after the context ended")
	}
}
