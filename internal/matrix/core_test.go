package matrix

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testkit"
	"github.com/idem-go/idem/seal"
)

// TestCoreCombinations runs every cell of the core table: Do, DoTx, the queue
// consumer and gRPC on each store.
func TestCoreCombinations(t *testing.T) {
	t.Parallel()
	for _, a := range CoreAdapters {
		for _, s := range CoreStores {
			want := ExpectCore(a, s)
			if want == None {
				continue
			}
			t.Run(fmt.Sprintf("%s on %s is %s", a, s, want), func(t *testing.T) {
				t.Parallel()
				runCoreCell(t, a, s, want, false)
			})
			if want == ExactlyOnce {
				// Sealed records (SPEC §19): the whole promise again under a keyring.
				t.Run(fmt.Sprintf("%s on %s is %s, sealed", a, s, want), func(t *testing.T) {
					t.Parallel()
					runCoreCell(t, a, s, want, true)
				})
			}
		}
	}
}

// result is what one repeat of an operation got: the operation's result (the id of
// the execution that produced it), whether it was replayed, or an error.
type result struct {
	value    string
	replayed bool
	err      error
}

// variant is what a call differs in from the usual one: another principal (scope),
// another input (payload), an operation that fails having done nothing (fail), or one
// that stalls under its claim at the cell's gate named stall.
type variant struct {
	scope, payload, stall string
	fail                  bool
}

const corePayload = `{"amount":2000}`

func (v variant) scopeOr(def string) string {
	if v.scope != "" {
		return v.scope
	}
	return def
}

func (v variant) input() string {
	if v.payload != "" {
		return v.payload
	}
	return corePayload
}

// errFailed is the error of an operation that failed having done nothing: it releases
// the key (SPEC §6), and a repeat executes afresh.
var errFailed = errors.New("the processor is down; nothing was charged")

// coreCell is one core cell as it runs.
type coreCell struct {
	t       *testing.T
	adapter string
	e       *env
	clock   *testkit.Clock
	logs    *lockedBuffer
	// executions counts the effects that ran to their end (for the adapters without a
	// transaction, whose effect is not a row).
	executions atomic.Int64
	gates      testkit.Gates // hold the calls that ask to stall
	run        func(key string, v variant) result
}

// effect is the operation's effect: the charges table's insert in tx where the adapter
// has one, a count otherwise.
func (c *coreCell) effect(ctx context.Context, key string, tx any, v variant) (string, error) {
	if v.stall != "" && tx == nil {
		c.gates.Pass(v.stall)
	}
	if v.fail {
		return "", errFailed
	}
	id := newID()
	var err error
	switch tx := tx.(type) {
	case *sql.Tx:
		_, err = tx.ExecContext(ctx, c.e.insert, key, id)
	case pgx.Tx:
		_, err = tx.Exec(ctx, c.e.insert, key, id)
	}
	if err == nil {
		c.executions.Add(1)
	}
	return id, err
}

// stallKey marks the context of a call that stalls with the gate it names
// (variant.stall).
type stallKey struct{}

// callCtx is the context of a call of v.
func callCtx(t *testing.T, v variant) context.Context {
	if v.stall != "" {
		return context.WithValue(t.Context(), stallKey{}, v.stall)
	}
	return t.Context()
}

// stallGate is the gate the call of ctx stalls at ("" when it does not).
func stallGate(ctx context.Context) string {
	if gate, ok := ctx.Value(stallKey{}).(string); ok {
		return gate
	}
	return variantOf(ctx).stall
}

// sqlInTx and pgxInTx are the store's InTx, stalling first under the key's claim when
// the call asks to: before its transaction begins, which on SQLite would hold the
// write lock that the takeover needs.
func (c *coreCell) sqlInTx(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	c.gates.Pass(stallGate(ctx))
	return c.e.sqlInTx(ctx, fn)
}

func (c *coreCell) pgxInTx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	c.gates.Pass(stallGate(ctx))
	return c.e.pgxInTx(ctx, fn)
}

// transactional reports whether the adapter's effect is a row committed in the
// store's transaction: the cell counts rows, not calls of the function.
func transactional(adapter string) bool {
	return adapter == DoTx || adapter == Consumer || adapter == GRPCTx
}

func runCoreCell(t *testing.T, adapter string, s Store, want Outcome, sealed bool) {
	c := &coreCell{t: t, adapter: adapter, e: openEnv(t, s), clock: testkit.NewClock(time.Now()), logs: &lockedBuffer{}}
	logger := slog.New(slog.NewTextHandler(c.logs, nil))
	gc := idem.GuardConfig{Store: c.e.store, Logger: logger, Clock: c.clock.Now}
	if sealed {
		gc.Seal = keyring(t, c.e.store)
	}
	g := idem.NewGuard(gc)
	switch adapter {
	case Do:
		c.run = func(key string, v variant) result {
			val, replayed, err := idem.Do(callCtx(t, v), g, call(key, v), func(ctx context.Context) (string, error) { return c.effect(ctx, key, nil, v) })
			return result{val, replayed, err}
		}
	case DoTx:
		c.run = func(key string, v variant) result {
			var (
				val      string
				replayed bool
				err      error
			)
			if s == Postgres {
				val, replayed, err = idem.DoTx(callCtx(t, v), g, call(key, v), c.pgxInTx, func(ctx context.Context, tx pgx.Tx) (string, error) {
					return c.effect(ctx, key, tx, v)
				})
			} else {
				val, replayed, err = idem.DoTx(callCtx(t, v), g, call(key, v), c.sqlInTx, func(ctx context.Context, tx *sql.Tx) (string, error) {
					return c.effect(ctx, key, tx, v)
				})
			}
			return result{val, replayed, err}
		}
	case Consumer:
		c.run = consumerRun(t, g, c, s)
	case GRPCUnary, GRPCTx, GRPCStream:
		c.run = grpcRun(t, g, c, s, logger)
	default:
		t.Fatalf("no adapter %q", adapter)
	}

	seqKey := "seq-" + newID()
	first, retry := c.run(seqKey, variant{}), c.run(seqKey, variant{})
	conc := make([]result, duplicates)
	concKey := "conc-" + newID()
	var wg sync.WaitGroup
	for i := range conc {
		wg.Go(func() { conc[i] = c.run(concKey, variant{}) })
	}
	wg.Wait()
	t.Logf("first %+v; retry %+v; concurrent %+v", first, retry, conc)

	switch want {
	case ExactlyOnce:
		c.holdsExactlyOnce(seqKey, concKey, first, retry, conc)
		if sealed && (adapter == Do || adapter == DoTx) {
			rec, err := c.e.store.RecordGet(t.Context(), &idemstore.GetParams{Scope: "tenant-1", Key: seqKey, Now: c.clock.Now()})
			if err != nil || rec.Response == nil || !seal.Sealed(rec.Response.Body) || strings.Contains(string(rec.Response.Body), first.value) ||
				!rec.Fingerprint.Keyed() || rec.Fingerprint.Sum == call(seqKey, variant{}).Fingerprint.Sum {
				t.Fatalf("the store holds %+v, %v; want the result sealed under a keyed fingerprint", rec, err)
			}
		}
	case Loud:
		c.failsLoudly(append([]result{first, retry}, conc...))
	}
}

// holdsExactlyOnce is the promise of a core cell that holds, all of it.
func (c *coreCell) holdsExactlyOnce(seqKey, concKey string, first, retry result, conc []result) {
	t := c.t
	if first.err != nil || first.replayed {
		t.Fatalf("the first call got %+v; want its result, not marked as a replay", first)
	}
	if retry.err != nil || !retry.replayed || retry.value != first.value {
		t.Fatalf("the retry got %+v; want the first result (%q) replayed", retry, first.value)
	}
	var executed []result
	for _, r := range conc {
		switch {
		case r.err == nil && !r.replayed:
			executed = append(executed, r)
		case r.err == nil:
		case errors.Is(r.err, idem.ErrKeyInProgress):
		default:
			t.Fatalf("a duplicate got %+v: neither the result nor in progress", r)
		}
	}
	if len(executed) != 1 {
		t.Fatalf("%d executions answered among %d duplicates, want 1", len(executed), duplicates)
	}
	for _, r := range conc {
		if r.err == nil && r.value != executed[0].value {
			t.Fatalf("a duplicate got %q, the execution %q", r.value, executed[0].value)
		}
	}
	// Another input under a used key is refused, and the record is untouched.
	if r := c.run(seqKey, variant{payload: `{"amount":9999}`}); !errors.Is(r.err, idem.ErrKeyReused) {
		t.Fatalf("another input under a used key got %+v; want key_reused, never the first result", r)
	}
	if r := c.run(seqKey, variant{}); r.err != nil || !r.replayed || r.value != first.value {
		t.Fatalf("after another input under the key, its retry got %+v; want the first result replayed", r)
	}
	// Another principal's key is its own.
	if r := c.run(seqKey, variant{scope: "tenant-2"}); r.err != nil || r.replayed || r.value == first.value {
		t.Fatalf("another principal calling with the same key got %+v; want its own execution, never the first principal's result", r)
	}
	// A failure that did nothing frees the key: the retry executes afresh.
	relKey := "release-" + newID()
	if r := c.run(relKey, variant{fail: true}); r.err == nil || r.replayed {
		t.Fatalf("a call whose operation failed got %+v; want its error", r)
	}
	if r := c.run(relKey, variant{}); r.err != nil || r.replayed {
		t.Fatalf("the retry of a failed call got %+v; want a fresh execution: the failure releases the key", r)
	}
	lapseKey := c.staleHolderCommitsNothing()

	if transactional(c.adapter) {
		// Committed rows, not calls of the function.
		for key, want := range map[string]int{seqKey: 2, concKey: 1, relKey: 1, lapseKey: 1} {
			if n := c.e.charges(t, key); n != want {
				t.Fatalf("a key made %d committed charges, want %d (its repeats, another principal's execution, a takeover)", n, want)
			}
		}
	} else if n := c.executions.Load(); n != 6 {
		// Two for seqKey (two principals), one for concKey, one for relKey, two for
		// lapseKey (the stale holder's effect ran: it has no transaction to undo).
		t.Fatalf("%d executions, want 6", n)
	}
	if strings.Contains(c.logs.String(), "level=ERROR") {
		t.Fatalf("an error was logged by a combination that holds:\n%s", c.logs)
	}
}

// staleHolderCommitsNothing: a holder that stalls past its lease while a repeat takes
// the key over (the injected clock moves past the lease) commits nothing and gets no
// result, even while the taker still holds the key; the taker's execution is the
// key's. It returns the key.
func (c *coreCell) staleHolderCommitsNothing() string {
	t := c.t
	key := "lapse-" + newID()
	staleGate, takerGate := c.gates.Add("stale"), c.gates.Add("taker")
	defer proceed(staleGate, takerGate) // a failure below must not leave a call waiting
	stale, taken := make(chan result, 1), make(chan result, 1)
	go func() { stale <- c.run(key, variant{stall: "stale"}) }()
	select {
	case <-staleGate.Entered:
	case r := <-stale:
		t.Fatalf("a call of a new key got %+v before its operation ran", r)
	}
	if r := c.run(key, variant{}); !errors.Is(r.err, idem.ErrKeyInProgress) {
		t.Fatalf("a repeat while the holder runs got %+v; want it refused in progress", r)
	}
	c.clock.Advance(idem.DefaultLease + time.Second)
	go func() { taken <- c.run(key, variant{stall: "taker"}) }()
	select {
	case <-takerGate.Entered: // the taker holds the key
	case r := <-taken:
		t.Fatalf("a repeat after the holder's lease lapsed got %+v; want it to take the key over and execute", r)
	}
	proceed(staleGate)
	if r := <-stale; r.err == nil {
		t.Fatalf("the holder that stalled past its lease got %+v after its key was taken over; want an error, never a result", r)
	}
	proceed(takerGate)
	taker := <-taken
	if taker.err != nil || taker.replayed {
		t.Fatalf("the repeat that took the key over got %+v; want it to execute, the stale holder having committed nothing", taker)
	}
	if r := c.run(key, variant{}); r.err != nil || !r.replayed || r.value != taker.value {
		t.Fatalf("the retry after the takeover got %+v, not the taker's result replayed", r)
	}
	return key
}

// failsLoudly: a keyed streaming call is refused, every time, with
// FAILED_PRECONDITION stream_not_supported, runs nothing, and an error naming the
// method is logged.
func (c *coreCell) failsLoudly(all []result) {
	t := c.t
	for _, r := range all {
		if status.Code(r.err) != codes.FailedPrecondition || grpcidem.ErrorCode(r.err) != grpcidem.CodeStreamNotSupported || r.replayed {
			t.Fatalf("a call got %+v; want every call refused FAILED_PRECONDITION %s", r, grpcidem.CodeStreamNotSupported)
		}
	}
	if n := c.executions.Load(); n != 0 {
		t.Fatalf("%d executions, want none", n)
	}
	for _, line := range strings.Split(c.logs.String(), "\n") {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, grpcStream) {
			return
		}
	}
	t.Fatalf("no error naming the method %s was logged:\n%s", grpcStream, c.logs)
}

// call is the Call of key, as v says.
func call(key string, v variant) idem.Call {
	return idem.Call{Scope: v.scopeOr("tenant-1"), Key: key, Fingerprint: idem.FingerprintInput("charges.create", []byte(v.input())), Name: "charges.create"}
}

// consumerRun processes a message of id key with the store's InTx: the effect and the
// record commit together, and the Processor acks after the commit.
func consumerRun(t *testing.T, g *idem.Guard, c *coreCell, s Store) func(string, variant) result {
	var (
		mu  sync.Mutex
		ids = map[string]string{} // the id the execution of a (scope, key) made
	)
	note := func(k, id string) { // the first execution's: a stale holder's rolls back
		mu.Lock()
		defer mu.Unlock()
		if _, ok := ids[k]; !ok {
			ids[k] = id
		}
	}
	idOf := func(k string) string {
		mu.Lock()
		defer mu.Unlock()
		return ids[k]
	}
	res := func(k string, r consume.Result) result {
		switch r.Action {
		case consume.Ack:
			return result{value: idOf(k), replayed: r.Replayed}
		case consume.Nak:
			if errors.Is(r.Err, idem.ErrKeyInProgress) {
				return result{err: r.Err}
			}
		}
		return result{err: fmt.Errorf("%v: %w", r.Action, r.Err)}
	}
	msg := func(key string, v variant) consume.Message {
		return consume.Message{Scope: v.scopeOr("charges-queue"), ID: key, Payload: []byte(v.input())}
	}
	if s == Postgres {
		p := consume.New(consume.Config[pgx.Tx]{Guard: g, InTx: c.pgxInTx})
		return func(key string, v variant) result {
			k := v.scopeOr("charges-queue") + "\x00" + key
			return res(k, p.Process(callCtx(t, v), msg(key, v), func(ctx context.Context, tx pgx.Tx) error {
				id, err := c.effect(ctx, key, tx, v)
				if err == nil {
					note(k, id)
				}
				return err
			}))
		}
	}
	p := consume.New(consume.Config[*sql.Tx]{Guard: g, InTx: c.sqlInTx})
	return func(key string, v variant) result {
		k := v.scopeOr("charges-queue") + "\x00" + key
		return res(k, p.Process(callCtx(t, v), msg(key, v), func(ctx context.Context, tx *sql.Tx) error {
			id, err := c.effect(ctx, key, tx, v)
			if err == nil {
				note(k, id)
			}
			return err
		}))
	}
}

const (
	grpcService = "idem.matrix.Charges"
	grpcUnary   = "/" + grpcService + "/Create"
	grpcStream  = "/" + grpcService + "/Watch"
)

// The metadata of a gRPC call that carries its variant.
const (
	mdTenant = "x-tenant"
	mdFail   = "x-fail"
	mdStall  = "x-stall"
)

// variantOf is the variant a gRPC call carries in its metadata (its payload is the
// request's).
func variantOf(ctx context.Context) variant {
	md, _ := metadata.FromIncomingContext(ctx)
	return variant{scope: strings.Join(md.Get(mdTenant), ""), fail: len(md.Get(mdFail)) > 0, stall: strings.Join(md.Get(mdStall), "")}
}

// grpcRun serves a Charges service (a unary Create and a server-streaming Watch, by
// hand: wrapperspb messages) behind grpcidem's interceptors, and calls it with key.
func grpcRun(t *testing.T, g *idem.Guard, c *coreCell, s Store, logger *slog.Logger) func(string, variant) result {
	adapter := c.adapter
	cfg := grpcidem.ServerConfig{Guard: g, Logger: logger, Scope: func(ctx context.Context) (string, error) {
		return variantOf(ctx).scopeOr("tenant-1"), nil
	}}
	create := func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		key := ""
		if h := grpcidem.FromContext(ctx); h != nil {
			key = h.Key()
		}
		v := variantOf(ctx)
		effect := func(ctx context.Context, tx any) (*wrapperspb.StringValue, error) {
			id, err := c.effect(ctx, key, tx, v)
			if errors.Is(err, errFailed) {
				return nil, status.Error(codes.Unavailable, err.Error())
			}
			return wrapperspb.String(id), err
		}
		if adapter != GRPCTx {
			return effect(ctx, nil)
		}
		if s == Postgres {
			return grpcidem.InTx(ctx, c.pgxInTx, func(ctx context.Context, tx pgx.Tx) (*wrapperspb.StringValue, error) { return effect(ctx, tx) })
		}
		return grpcidem.InTx(ctx, c.sqlInTx, func(ctx context.Context, tx *sql.Tx) (*wrapperspb.StringValue, error) { return effect(ctx, tx) })
	}
	desc := grpc.ServiceDesc{
		ServiceName: grpcService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			req := &wrapperspb.StringValue{}
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) { return create(ctx, req.(*wrapperspb.StringValue)) }
			return ic(ctx, req, &grpc.UnaryServerInfo{FullMethod: grpcUnary}, h)
		}}},
		Streams: []grpc.StreamDesc{{StreamName: "Watch", ServerStreams: true, Handler: func(_ any, stream grpc.ServerStream) error {
			req := &wrapperspb.StringValue{}
			if err := stream.RecvMsg(req); err != nil {
				return err
			}
			id, err := c.effect(stream.Context(), "", nil, variant{})
			if err != nil {
				return err
			}
			return stream.SendMsg(wrapperspb.String(id))
		}}},
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(cfg)),
		grpc.ChainStreamInterceptor(grpcidem.StreamServerInterceptor(cfg)),
	)
	srv.RegisterService(&desc, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	return func(key string, v variant) result {
		kv := []string{grpcidem.MetadataKey, key}
		if v.scope != "" {
			kv = append(kv, mdTenant, v.scope)
		}
		if v.fail {
			kv = append(kv, mdFail, "1")
		}
		if v.stall != "" {
			kv = append(kv, mdStall, v.stall)
		}
		ctx := metadata.AppendToOutgoingContext(t.Context(), kv...)
		if adapter == GRPCStream {
			stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, grpcStream)
			if err == nil {
				err = stream.SendMsg(wrapperspb.String("x"))
			}
			if err == nil {
				err = stream.CloseSend()
			}
			out := &wrapperspb.StringValue{}
			if err == nil {
				err = stream.RecvMsg(out)
			}
			return result{value: out.GetValue(), err: err}
		}
		var header metadata.MD
		out := &wrapperspb.StringValue{}
		err := conn.Invoke(ctx, grpcUnary, wrapperspb.String(v.input()), out, grpc.Header(&header))
		switch {
		case status.Code(err) == codes.Aborted && grpcidem.ErrorCode(err) == idem.CodeRequestInProgress:
			err = fmt.Errorf("%w: %v", idem.ErrKeyInProgress, err)
		case grpcidem.ErrorCode(err) == idem.CodeKeyReused:
			err = fmt.Errorf("%w: %v", idem.ErrKeyReused, err)
		}
		replayed := len(header.Get(grpcidem.ReplayedKey)) > 0
		return result{value: out.GetValue(), replayed: replayed, err: err}
	}
}
