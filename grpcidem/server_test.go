package grpcidem_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/grpcidem/internal/testpb"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/postgres"
)

// wantStatus fails t unless err is a status with code c and, when code is not "",
// idem's error code.
func wantStatus(t *testing.T, err error, c codes.Code, code string) {
	t.Helper()
	if status.Code(err) != c || grpcidem.ErrorCode(err) != code {
		t.Fatalf("error %v (idem code %q), want %v with idem code %q", err, grpcidem.ErrorCode(err), c, code)
	}
}

func TestRetryGetsTheSameMessageReplayedWithoutExecuting(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	first, header, err := b.call(t, "alice", key1, chargeRequest())
	if err != nil {
		t.Fatal(err)
	}
	if len(header.Get(grpcidem.ReplayedKey)) != 0 {
		t.Errorf("the first call is marked replayed: %v", header)
	}
	if first.IdempotencyKey != key1 {
		t.Errorf("the handler saw key %q, want %q", first.IdempotencyKey, key1)
	}
	again, header, err := b.call(t, "alice", key1, chargeRequest())
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, again) {
		t.Errorf("replay %v, want the first response %v", again, first)
	}
	if got := header.Get(grpcidem.ReplayedKey); len(got) != 1 || got[0] != "true" {
		t.Errorf("replay header %s = %q, want true", grpcidem.ReplayedKey, got)
	}
	if n := b.svc.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

func TestOnePrincipalNeverGetsAnothersReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	a, _, err := b.call(t, "alice", key1, chargeRequest())
	if err != nil {
		t.Fatal(err)
	}
	m, header, err := b.call(t, "mallory", key1, chargeRequest())
	if err != nil {
		t.Fatal(err)
	}
	if a.Id == m.Id || len(header.Get(grpcidem.ReplayedKey)) != 0 || b.svc.executions.Load() != 2 {
		t.Errorf("mallory got %v (header %v) after alice's %v; want an execution of her own", m, header, a)
	}
}

func TestAnotherMessageUnderTheSameKeyIsFailedPrecondition(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	if _, _, err := b.call(t, "alice", key1, chargeRequest()); err != nil {
		t.Fatal(err)
	}
	other := chargeRequest()
	other.Amount = 3000
	_, _, err := b.call(t, "alice", key1, other)
	wantStatus(t, err, codes.FailedPrecondition, idem.CodeKeyReused)
	if grpcidem.Retryable(t.Context(), err) {
		t.Error("key_reused is retryable; it is final")
	}
	if n := b.svc.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

func TestTheSameMessageToAnotherMethodIsKeyReused(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	if _, _, err := b.call(t, "alice", key1, chargeRequest()); err != nil {
		t.Fatal(err)
	}
	_, err := b.client.AuthorizeCharge(as(t.Context(), "alice", key1), chargeRequest())
	wantStatus(t, err, codes.FailedPrecondition, idem.CodeKeyReused)
}

// Maps are encoded in a random order unless the encoding is deterministic: a retry
// that rebuilds the same map must match.
func TestARetryWithTheSameMapMatchesWhateverItsOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	build := func() *testpb.ChargeRequest {
		req := chargeRequest()
		req.Metadata = map[string]string{}
		for i := range 32 {
			req.Metadata[fmt.Sprintf("k%02d", i)] = fmt.Sprint(i)
		}
		return req
	}
	for i := range 5 {
		if _, _, err := b.call(t, "alice", key1, build()); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	if n := b.svc.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

func TestADuplicateOfACallInFlightIsAbortedWithRetryInfo(t *testing.T) {
	t.Parallel()
	entered, proceed := make(chan struct{}), make(chan struct{})
	b := setup(t, options{
		guard: func(c *idem.GuardConfig) { c.RetryAfter = 1500 * time.Millisecond },
		behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
			if n == 1 {
				close(entered)
				<-proceed
			}
			return nil, nil
		},
	})
	done := make(chan error, 1)
	go func() { _, _, err := b.call(t, "alice", key1, chargeRequest()); done <- err }()
	<-entered
	_, _, err := b.call(t, "alice", key1, chargeRequest())
	wantStatus(t, err, codes.Aborted, idem.CodeRequestInProgress)
	if d, ok := grpcidem.RetryDelay(err); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryInfo delay %v (%v), want the guard's RetryAfter 1.5s", d, ok)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, header, err := b.call(t, "alice", key1, chargeRequest()); err != nil || len(header.Get(grpcidem.ReplayedKey)) != 1 {
		t.Fatalf("after the first call completed: %v, header %v; want a replay", err, header)
	}
}

// A principal past a bound of its own (SPEC §19) is RESOURCE_EXHAUSTED quota_exceeded
// with the bound's RetryInfo, never UNAVAILABLE: the store is fine.
func TestAPrincipalPastItsBoundIsResourceExhausted(t *testing.T) {
	t.Parallel()
	entered, proceed := make(chan struct{}), make(chan struct{})
	b := setup(t, options{
		guard: func(c *idem.GuardConfig) { c.MaxInFlightPerScope, c.RetryAfter = 1, 1500*time.Millisecond },
		behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
			if n == 1 {
				close(entered)
				<-proceed
			}
			return nil, nil
		},
	})
	done := make(chan error, 1)
	go func() { _, _, err := b.call(t, "alice", key1, chargeRequest()); done <- err }()
	<-entered
	_, _, err := b.call(t, "alice", "key-grpc-test-0002", chargeRequest())
	wantStatus(t, err, codes.ResourceExhausted, idem.CodeQuotaExceeded)
	if d, ok := grpcidem.RetryDelay(err); !ok || d != 1500*time.Millisecond {
		t.Errorf("RetryInfo delay %v (%v), want the bound's 1.5s", d, ok)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestKeyRequirementPerMethod(t *testing.T) {
	t.Parallel()
	b := setup(t, options{server: func(c *grpcidem.ServerConfig) {
		c.Methods = map[string]grpcidem.MethodOptions{
			testpb.Payments_CreateCharge_FullMethodName:    {Requirement: idem.KeyRequired},
			testpb.Payments_AuthorizeCharge_FullMethodName: {Requirement: idem.KeyOff},
		}
	}})
	_, _, err := b.call(t, "alice", "", chargeRequest())
	wantStatus(t, err, codes.InvalidArgument, idem.CodeKeyRequired)
	for range 2 { // keys off: executes every time, key or not
		if _, err := b.client.AuthorizeCharge(as(t.Context(), "alice", key1), chargeRequest()); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.svc.executions.Load(); n != 2 {
		t.Errorf("%d executions, want 2 (one per call to the method with keys off)", n)
	}
}

func TestAKeyIsOptionalByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for range 2 {
		resp, header, err := b.call(t, "alice", "", chargeRequest())
		if err != nil || resp.IdempotencyKey != "" || len(header.Get(grpcidem.ReplayedKey)) != 0 {
			t.Fatalf("a call without a key: %v, %v, header %v; want it to pass through", resp, err, header)
		}
	}
	if n := b.svc.executions.Load(); n != 2 {
		t.Errorf("%d executions, want 2", n)
	}
}

func TestMalformedKeysAreInvalidArgument(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	for _, tc := range []struct {
		name string
		keys []string
		why  string
	}{
		{"short", []string{"1234"}, "at least 8"},
		{"two values", []string{key1, key1}, "two idempotency-key values"},
		{"a list", []string{`"` + key1 + `", "other-key"`}, "a list is not allowed"},
		{"empty", []string{""}, "empty value"},
		{"a space", []string{"abcd efgh"}, "space at position 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := as(t.Context(), "alice", "")
			for _, k := range tc.keys {
				ctx = metadataAppend(ctx, grpcidem.MetadataKey, k)
			}
			_, err := b.client.CreateCharge(ctx, chargeRequest())
			wantStatus(t, err, codes.InvalidArgument, idem.CodeKeyInvalid)
			if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.why) || strings.Contains(msg, key1) {
				t.Errorf("message %q, want it to say %q and never to contain the key", msg, tc.why)
			}
		})
	}
	if _, err := b.client.CreateCharge(metadataAppend(as(t.Context(), "alice", ""), grpcidem.MetadataKey, `"`+key1+`"`), chargeRequest()); err != nil {
		t.Errorf("the key as an RFC 8941 string: %v, want it accepted", err)
	}
	if n := b.svc.executions.Load(); n != 1 {
		t.Errorf("%d executions, want only the valid call's", n)
	}
}

func TestAKeyedCallWithoutPrincipalIsUnauthenticated(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	_, _, err := b.call(t, "", key1, chargeRequest())
	wantStatus(t, err, codes.Unauthenticated, idem.CodeScopeRequired)
	if n := b.svc.executions.Load(); n != 0 {
		t.Errorf("%d executions, want 0", n)
	}
}

func TestAnErrorThatMeansNothingHappenedReleasesTheKey(t *testing.T) {
	t.Parallel()
	for _, failure := range []error{
		status.Error(codes.Unavailable, "processor down"),
		status.Error(codes.InvalidArgument, "bad currency"),
		errors.New("a plain error"),
	} {
		t.Run(status.Code(failure).String(), func(t *testing.T) {
			b := setup(t, options{behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
				if n == 1 {
					return nil, failure
				}
				return nil, nil
			}})
			if _, _, err := b.call(t, "alice", key1, chargeRequest()); status.Code(err) != status.Code(failure) {
				t.Fatalf("first call: %v, want the handler's %v", err, failure)
			}
			if _, header, err := b.call(t, "alice", key1, chargeRequest()); err != nil || len(header.Get(grpcidem.ReplayedKey)) != 0 {
				t.Fatalf("retry: %v, header %v; want a fresh execution", err, header)
			}
			if n := b.svc.executions.Load(); n != 2 {
				t.Errorf("%d executions, want 2", n)
			}
		})
	}
}

func TestFailedPreconditionIsStoredAndReplayedWithItsDetails(t *testing.T) {
	t.Parallel()
	declined := func() error {
		st, err := status.New(codes.FailedPrecondition, "card declined").
			WithDetails(&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.test"})
		if err != nil {
			panic(err)
		}
		return st.Err()
	}
	b := setup(t, options{behave: func(context.Context, *testpb.ChargeRequest, int64) (*testpb.Charge, error) {
		return nil, declined()
	}})
	_, _, first := b.call(t, "alice", key1, chargeRequest())
	_, header, again := b.call(t, "alice", key1, chargeRequest())
	if !proto.Equal(status.Convert(first).Proto(), status.Convert(declined()).Proto()) {
		t.Fatalf("first call: %v, want the handler's error", first)
	}
	if !proto.Equal(status.Convert(again).Proto(), status.Convert(first).Proto()) {
		t.Errorf("replay %v, want the stored status with its details %v", status.Convert(again).Proto(), status.Convert(first).Proto())
	}
	if len(header.Get(grpcidem.ReplayedKey)) != 1 || b.svc.executions.Load() != 1 {
		t.Errorf("header %v, %d executions; want a replay of one execution", header, b.svc.executions.Load())
	}
}

func TestTheHandlerOverridesTheStorePolicyForItsCall(t *testing.T) {
	t.Parallel()
	b := setup(t, options{behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
		switch req.Behaviour {
		case "store-not-found":
			grpcidem.FromContext(ctx).SetStore(true)
			return nil, status.Error(codes.NotFound, "no such customer")
		case "release-success":
			grpcidem.FromContext(ctx).SetStore(false)
		}
		return nil, nil
	}})
	req := chargeRequest()
	req.Behaviour = "store-not-found"
	for range 2 {
		if _, _, err := b.call(t, "alice", key1, req); status.Code(err) != codes.NotFound {
			t.Fatalf("%v, want NotFound", err)
		}
	}
	req.Behaviour = "release-success"
	for range 2 {
		if _, _, err := b.call(t, "alice", "another-key-123", req); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.svc.executions.Load(); n != 3 {
		t.Errorf("%d executions, want 3 (the stored NotFound once, the released success twice)", n)
	}
}

func TestAResponseOverTheLimitIsSentButNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t, options{
		server: func(c *grpcidem.ServerConfig) { c.MaxResponseBytes = 1 << 10 },
		behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
			c := charge(ctx, req, "ch_big")
			c.Padding = make([]byte, 2<<10)
			return c, nil
		},
	})
	if resp, _, err := b.call(t, "alice", key1, chargeRequest()); err != nil || len(resp.Padding) != 2<<10 {
		t.Fatalf("first call: %v, want the whole response", err)
	}
	_, _, err := b.call(t, "alice", key1, chargeRequest())
	wantStatus(t, err, codes.FailedPrecondition, idem.CodeResponseNotStored)
	if n := b.svc.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1: a completed call never executes again", n)
	}
}

func TestAStoreThatCannotBeReachedIsUnavailableWithRetryInfo(t *testing.T) {
	t.Parallel()
	// A real PostgreSQL store whose server is not there: nothing listens on port 1.
	s, err := postgres.Open(t.Context(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", postgres.Config{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	b := setup(t, options{store: s, server: func(c *grpcidem.ServerConfig) { c.RetryAfter = 3 * time.Second }})
	_, _, err = b.call(t, "alice", key1, chargeRequest())
	wantStatus(t, err, codes.Unavailable, idem.CodeStoreUnavailable)
	if d, ok := grpcidem.RetryDelay(err); !ok || d != 3*time.Second {
		t.Errorf("RetryInfo delay %v (%v), want ServerConfig.RetryAfter 3s", d, ok)
	}
	if n := b.svc.executions.Load(); n != 0 {
		t.Errorf("%d executions, want 0: a call fails closed", n)
	}
}

// A handler that panics releases the key, and the panic goes on (gRPC servers do not
// recover it: the interceptor is called directly here).
func TestAPanicReleasesTheKeyAndIsRaisedAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	intercept := grpcidem.UnaryServerInterceptor(grpcidem.ServerConfig{Guard: b.guard, Scope: scopeOf})
	info := &grpc.UnaryServerInfo{FullMethod: testpb.Payments_CreateCharge_FullMethodName}
	ctx := incoming(t.Context(), userKey, "alice", grpcidem.MetadataKey, key1)
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the handler's panic", p)
			}
		}()
		_, _ = intercept(ctx, chargeRequest(), info, func(context.Context, any) (any, error) { panic("boom") })
	}()
	resp, err := intercept(ctx, chargeRequest(), info, func(ctx context.Context, req any) (any, error) {
		return charge(ctx, req.(*testpb.ChargeRequest), "ch_after_panic"), nil
	})
	if err != nil || resp.(*testpb.Charge).Id != "ch_after_panic" {
		t.Fatalf("the retry after a panic: %v, %v; want a fresh execution", resp, err)
	}
}

func TestWritesInTheTransactionCommitWithTheRecord(t *testing.T) {
	t.Parallel()
	s := openSQLite(t, filepath.Join(t.TempDir(), "idem.db"))
	b := setup(t, options{store: s, behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
		return createChargeSQLite(ctx, s, req)
	}})
	first, _, err := b.call(t, "alice", key1, chargeRequest())
	if err != nil {
		t.Fatal(err)
	}
	again, header, err := b.call(t, "alice", key1, chargeRequest())
	if err != nil || !proto.Equal(first, again) || len(header.Get(grpcidem.ReplayedKey)) != 1 {
		t.Fatalf("retry: %v, %v (header %v); want the replay of %v", again, err, header, first)
	}
	if n := countCharges(t, s); n != 1 {
		t.Errorf("%d charges in the database, want 1", n)
	}
	// The record was completed in the charge's transaction: it holds the charge.
	rec, err := s.RecordGet(t.Context(), &idemstore.GetParams{Scope: "alice", Key: key1})
	if err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("record %+v, %v", rec, err)
	}
	// Without a key the same handler runs a plain transaction.
	if _, _, err := b.call(t, "alice", "", chargeRequest()); err != nil {
		t.Fatal(err)
	}
	if n := countCharges(t, s); n != 2 {
		t.Errorf("%d charges after a call without a key, want 2", n)
	}
}

func TestAStoreHelperCalledDirectlyRunsAPlainTransaction(t *testing.T) {
	t.Parallel()
	s := openSQLite(t, filepath.Join(t.TempDir(), "idem.db"))
	b := setup(t, options{store: s, behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
		if idem.FromContext(ctx) != nil {
			return nil, status.Error(codes.Internal, "the handler's context exposes the claim to the store's helper")
		}
		return nil, nil
	}})
	for range 2 {
		if _, _, err := b.call(t, "alice", key1, chargeRequest()); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.svc.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}

func TestInvalidServerConfigPanicsNamingTheField(t *testing.T) {
	t.Parallel()
	g := idem.NewGuard(idem.GuardConfig{Store: memoryStore()})
	for _, tc := range []struct {
		cfg  grpcidem.ServerConfig
		want string
	}{
		{grpcidem.ServerConfig{Scope: scopeOf}, "ServerConfig.Guard is required"},
		{grpcidem.ServerConfig{Guard: g}, "ServerConfig.Scope is required"},
		{grpcidem.ServerConfig{Guard: g, Scope: scopeOf, Methods: map[string]grpcidem.MethodOptions{"CreateCharge": {}}}, "not a full method name"},
		{grpcidem.ServerConfig{Guard: g, Scope: scopeOf, Methods: map[string]grpcidem.MethodOptions{"/a.B/C": {OnLapse: 7}}}, "ServerConfig.Methods[/a.B/C].OnLapse is not a known policy"},
		{grpcidem.ServerConfig{Guard: g, Scope: scopeOf, Requirement: 9}, "ServerConfig.Requirement is not a known requirement"},
		{grpcidem.ServerConfig{Guard: g, Scope: scopeOf, MaxResponseBytes: -1}, "ServerConfig.MaxResponseBytes"},
	} {
		func() {
			defer func() {
				if p := fmt.Sprint(recover()); !strings.HasPrefix(p, "grpcidem: ") || !strings.Contains(p, tc.want) {
					t.Errorf("panic %q, want one saying %q", p, tc.want)
				}
			}()
			grpcidem.UnaryServerInterceptor(tc.cfg)
		}()
	}
}

// A handler whose key is taken from it (here an operator deletes its record) loses its
// lease: its context ends with cause ErrLeaseLost, and whatever it answers, the client
// gets UNAVAILABLE, so that its retry meets the key's real outcome.
func TestAHandlerThatLostItsLeaseAnswersUnavailable(t *testing.T) {
	t.Parallel()
	s := memory.New()
	entered := make(chan struct{})
	b := setup(t, options{
		store: s,
		guard: func(c *idem.GuardConfig) { c.Lease, c.Heartbeat = time.Minute, 10*time.Millisecond },
		behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
			close(entered)
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), idem.ErrLeaseLost) {
				return nil, status.Errorf(codes.Internal, "context ended with %v, want ErrLeaseLost", context.Cause(ctx))
			}
			return nil, status.FromContextError(ctx.Err()).Err()
		},
	})
	done := make(chan error, 1)
	go func() { _, _, err := b.call(t, "alice", key1, chargeRequest()); done <- err }()
	<-entered
	if err := s.RecordDelete(t.Context(), &admin.RecordDeleteParams{Scope: "alice", Key: key1, Force: true}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, <-done, codes.Unavailable, idem.CodeStoreUnavailable)
}

// Under the policy "unknown" (SPEC §13), a call that finds its key's holder dead gets
// UNKNOWN outcome_unknown, stored, instead of executing again; the client does not
// retry it, and the dead holder's late completion is refused.
func TestALapsedLeaseUnderPolicyUnknownIsUnknownUntilResolved(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock(time.Now())
	entered, proceed := make(chan struct{}), make(chan struct{})
	b := setup(t, options{
		guard: func(c *idem.GuardConfig) { c.Clock = clock.Now },
		server: func(c *grpcidem.ServerConfig) {
			c.Methods = map[string]grpcidem.MethodOptions{
				testpb.Payments_CreateCharge_FullMethodName: {OnLapse: idem.LapseUnknown},
			}
		},
		behave: func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error) {
			if n == 1 {
				close(entered)
				<-proceed // the holder stalls past its lease, as a dead one would
			}
			return nil, nil
		},
	})
	first := make(chan error, 1)
	go func() { _, _, err := b.call(t, "alice", key1, chargeRequest()); first <- err }()
	<-entered
	clock.Advance(idem.DefaultLease + time.Second)
	for range 2 {
		_, _, err := b.call(t, "alice", key1, chargeRequest())
		wantStatus(t, err, codes.Unknown, idem.CodeOutcomeUnknown)
		if grpcidem.Retryable(t.Context(), err) {
			t.Fatal("outcome_unknown is retryable; it is final until an operator resolves the key")
		}
	}
	close(proceed)
	wantStatus(t, <-first, codes.Unavailable, idem.CodeStoreUnavailable)
	if n := b.svc.executions.Load(); n != 1 {
		t.Errorf("%d executions, want 1", n)
	}
}
