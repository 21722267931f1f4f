package grpcidem

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
)

// ClientConfig configures [UnaryClientInterceptor]. The zero value is ready to use.
type ClientConfig struct {
	// Keyed says which calls get a key (when they lack one) and are retried, by full
	// method name. Calls it leaves out are passed through untouched. Defaults to
	// every unary call.
	Keyed func(fullMethod string) bool

	// NewKey makes the key of a call that has none. Returning "" sends the call
	// without a key, and it is not retried. Defaults to [client.NewKey] (a UUID v4
	// from crypto/rand).
	NewKey func() string

	// Retryable decides whether an attempt that failed with err is retried. Defaults
	// to [Retryable].
	Retryable func(ctx context.Context, err error) bool

	// Backoff is the wait before a retry when the server's status carries no
	// RetryInfo; it is called with a nil response. Defaults to [client.DefaultBackoff]
	// (exponential from 100ms to 5s, full jitter).
	Backoff client.Backoff

	// Budget limits the retries of every call sharing it; share one with an HTTP
	// [client.Transport] to limit both together. Defaults to one budget per
	// interceptor, made by client.NewBudget([client.DefaultBudgetRatio],
	// [client.DefaultBudgetFloor], [client.DefaultBudgetBurst]).
	Budget *client.Budget

	// MaxAttempts is the most attempts of one call, the first included. Defaults to
	// [client.DefaultMaxAttempts].
	MaxAttempts int

	// MaxRetryAfter caps the delay a server's RetryInfo asks for. Defaults to
	// [client.DefaultMaxRetryAfter].
	MaxRetryAfter time.Duration

	// Logger receives a debug line per retry and a warning when the budget refuses
	// one. It never logs a key or a message. Defaults to [slog.Default].
	Logger *slog.Logger
}

// UnaryClientInterceptor returns the client half of SPEC §12 for gRPC: it adds a fresh
// key under [MetadataKey] to each unary call that lacks one, keeps the call's key (its
// own or the caller's) on every attempt, and retries what [Retryable] allows, waiting
// the RetryInfo delay the server sends (capped by MaxRetryAfter) or else the backoff,
// within MaxAttempts, the Budget and the call's context. Because every attempt carries
// the same key, a retry of a call that did execute is a replay, never a second
// execution. When it gives up it returns the last attempt's error as it came (a
// status error, so status.Code and [ErrorCode] read it); [Attempts] reports how many
// attempts a call took. It panics with a "grpcidem: " message when cfg is invalid.
func UnaryClientInterceptor(cfg ClientConfig) grpc.UnaryClientInterceptor {
	switch {
	case cfg.MaxAttempts < 0:
		panic(fmt.Sprintf("grpcidem: ClientConfig.MaxAttempts must not be negative, got %d", cfg.MaxAttempts))
	case cfg.MaxRetryAfter < 0:
		panic(fmt.Sprintf("grpcidem: ClientConfig.MaxRetryAfter must not be negative, got %v", cfg.MaxRetryAfter))
	}
	if cfg.NewKey == nil {
		cfg.NewKey = client.NewKey
	}
	if cfg.Retryable == nil {
		cfg.Retryable = Retryable
	}
	if cfg.Budget == nil {
		cfg.Budget = client.NewBudget(client.DefaultBudgetRatio, client.DefaultBudgetFloor, client.DefaultBudgetBurst)
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = client.DefaultMaxAttempts
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &retrier{ClientConfig: cfg, pacing: client.Pacing{Backoff: cfg.Backoff, MaxRetryAfter: cfg.MaxRetryAfter}}
	return c.intercept
}

type retrier struct {
	ClientConfig
	pacing client.Pacing
}

func (c *retrier) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	count := attemptsOf(opts)
	if c.Keyed != nil && !c.Keyed(method) {
		return invoke(ctx, count, 1, method, req, reply, cc, invoker, opts)
	}
	if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(MetadataKey)) == 0 {
		key := c.NewKey()
		if key == "" {
			return invoke(ctx, count, 1, method, req, reply, cc, invoker, opts)
		}
		ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, key)
	}
	c.Budget.Deposit()
	for n := 1; ; n++ {
		err := invoke(ctx, count, n, method, req, reply, cc, invoker, opts)
		if err == nil || !c.Retryable(ctx, err) || n >= c.MaxAttempts {
			return err
		}
		hint, hinted := RetryDelay(err)
		wait, werr := c.pacing.Delay(ctx, n-1, nil, hint, hinted)
		if werr != nil {
			c.Logger.DebugContext(ctx, "grpcidem: not retrying", "method", method, "attempts", n, "why", werr)
			return err
		}
		if !c.Budget.Withdraw() {
			c.Logger.WarnContext(ctx, "grpcidem: retry budget exhausted", "method", method, "attempts", n, "tokens", c.Budget.Tokens())
			return err
		}
		c.Logger.DebugContext(ctx, "grpcidem: retrying", "method", method, "attempt", n+1, "wait", wait, "code", status.Code(err))
		if serr := client.Sleep(ctx, wait); serr != nil {
			return status.FromContextError(serr).Err()
		}
	}
}

// invoke makes attempt n and records it in count.
func invoke(ctx context.Context, count *attemptsOption, n int, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts []grpc.CallOption) error {
	if count != nil {
		*count.n = n
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// Retryable is the default retry policy of [UnaryClientInterceptor], SPEC §12 in
// gRPC's codes: it retries UNAVAILABLE (a connection error, or store_unavailable),
// ABORTED (request_in_progress), RESOURCE_EXHAUSTED (as HTTP 429), and UNKNOWN,
// INTERNAL and DEADLINE_EXCEEDED (as 5xx) — except idem's final answers, key_reused,
// response_not_stored and outcome_unknown — and nothing else: INVALID_ARGUMENT,
// FAILED_PRECONDITION, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED,
// OUT_OF_RANGE, UNIMPLEMENTED, DATA_LOSS and CANCELED are final. Nothing is retried
// once ctx has ended.
func Retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch ErrorCode(err) {
	case idem.CodeKeyReused, idem.CodeResponseNotStored, idem.CodeOutcomeUnknown:
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.ResourceExhausted, codes.Unknown, codes.Internal, codes.DeadlineExceeded:
		return true
	}
	return false
}

// Attempts returns a call option that sets *n to the number of attempts the call
// took through [UnaryClientInterceptor] (1 when the first attempt was answered), as
// [client.Attempts] reports it for HTTP. Without the interceptor *n stays unchanged.
func Attempts(n *int) grpc.CallOption { return &attemptsOption{n: n} }

type attemptsOption struct {
	grpc.EmptyCallOption
	n *int
}

func attemptsOf(opts []grpc.CallOption) *attemptsOption {
	for _, o := range opts {
		if a, ok := o.(*attemptsOption); ok && a.n != nil {
			return a
		}
	}
	return nil
}
