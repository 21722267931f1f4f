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
				runCoreCell(t, a, s, want)
			})
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

func runCoreCell(t *testing.T, adapter string, s Store, want Outcome) {
	e := openEnv(t, s)
	logs := &lockedBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	g := idem.NewGuard(idem.GuardConfig{Store: e.store, Logger: logger})
	var executions atomic.Int64
	// effect is the operation's effect: the charges table's insert in tx where the
	// adapter has one, a count otherwise.
	effect := func(ctx context.Context, key string, tx any) (string, error) {
		executions.Add(1)
		id := newID()
		var err error
		switch tx := tx.(type) {
		case *sql.Tx:
			_, err = tx.ExecContext(ctx, e.insert, key, id)
		case pgx.Tx:
			_, err = tx.Exec(ctx, e.insert, key, id)
		}
		return id, err
	}
	var run func(key string) result
	switch adapter {
	case Do:
		run = func(key string) result {
			v, replayed, err := idem.Do(t.Context(), g, call(key), func(ctx context.Context) (string, error) { return effect(ctx, key, nil) })
			return result{v, replayed, err}
		}
	case DoTx:
		run = func(key string) result {
			var (
				v        string
				replayed bool
				err      error
			)
			if s == Postgres {
				v, replayed, err = idem.DoTx(t.Context(), g, call(key), e.pgxInTx, func(ctx context.Context, tx pgx.Tx) (string, error) {
					return effect(ctx, key, tx)
				})
			} else {
				v, replayed, err = idem.DoTx(t.Context(), g, call(key), e.sqlInTx, func(ctx context.Context, tx *sql.Tx) (string, error) {
					return effect(ctx, key, tx)
				})
			}
			return result{v, replayed, err}
		}
	case Consumer:
		run = consumerRun(t, g, e, s, effect)
	case GRPCUnary, GRPCTx, GRPCStream:
		run = grpcRun(t, g, e, s, adapter, logger, effect)
	default:
		t.Fatalf("no adapter %q", adapter)
	}

	seqKey := "seq-" + newID()
	first, retry := run(seqKey), run(seqKey)
	conc := make([]result, duplicates)
	concKey := "conc-" + newID()
	var wg sync.WaitGroup
	for i := range conc {
		wg.Go(func() { conc[i] = run(concKey) })
	}
	wg.Wait()
	t.Logf("first %+v; retry %+v; concurrent %+v", first, retry, conc)

	switch want {
	case ExactlyOnce:
		if first.err != nil || first.replayed || retry.err != nil || !retry.replayed || retry.value != first.value {
			t.Fatalf("first %+v, retry %+v; want the first result replayed", first, retry)
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
		if n := executions.Load(); n != 2 {
			t.Fatalf("%d executions for two keys, want 2", n)
		}
		if strings.Contains(logs.String(), "level=ERROR") {
			t.Fatalf("an error was logged by a combination that holds:\n%s", logs)
		}
	case Loud:
		for _, r := range append([]result{first, retry}, conc...) {
			if r.err == nil || r.replayed {
				t.Fatalf("a call got %+v: a combination that cannot hold must refuse every call", r)
			}
		}
		if n := executions.Load(); n != 0 {
			t.Fatalf("%d executions, want none", n)
		}
		if !strings.Contains(logs.String(), "level=ERROR") {
			t.Fatalf("no error was logged:\n%s", logs)
		}
	}
}

// call is the Call of key.
func call(key string) idem.Call {
	return idem.Call{Scope: "tenant-1", Key: key, Fingerprint: idem.FingerprintInput("charges.create", []byte(`{"amount":2000}`)), Name: "charges.create"}
}

// consumerRun processes a message of id key with the store's InTx: the effect and the
// record commit together, and the Processor acks after the commit.
func consumerRun(t *testing.T, g *idem.Guard, e *env, s Store, effect func(context.Context, string, any) (string, error)) func(string) result {
	var (
		mu  sync.Mutex
		ids = map[string]string{} // the id the execution of a key made
	)
	note := func(key, id string) {
		mu.Lock()
		defer mu.Unlock()
		ids[key] = id
	}
	idOf := func(key string) string {
		mu.Lock()
		defer mu.Unlock()
		return ids[key]
	}
	res := func(key string, r consume.Result) result {
		switch r.Action {
		case consume.Ack:
			return result{value: idOf(key), replayed: r.Replayed}
		case consume.Nak:
			if errors.Is(r.Err, idem.ErrKeyInProgress) {
				return result{err: r.Err}
			}
		}
		return result{err: fmt.Errorf("%v: %w", r.Action, r.Err)}
	}
	msg := func(key string) consume.Message {
		return consume.Message{Scope: "charges-queue", ID: key, Payload: []byte(`{"amount":2000}`)}
	}
	if s == Postgres {
		p := consume.New(consume.Config[pgx.Tx]{Guard: g, InTx: e.pgxInTx})
		return func(key string) result {
			return res(key, p.Process(t.Context(), msg(key), func(ctx context.Context, tx pgx.Tx) error {
				id, err := effect(ctx, key, tx)
				note(key, id)
				return err
			}))
		}
	}
	p := consume.New(consume.Config[*sql.Tx]{Guard: g, InTx: e.sqlInTx})
	return func(key string) result {
		return res(key, p.Process(t.Context(), msg(key), func(ctx context.Context, tx *sql.Tx) error {
			id, err := effect(ctx, key, tx)
			note(key, id)
			return err
		}))
	}
}

const (
	grpcService = "idem.matrix.Charges"
	grpcUnary   = "/" + grpcService + "/Create"
	grpcStream  = "/" + grpcService + "/Watch"
)

// grpcRun serves a Charges service (a unary Create and a server-streaming Watch, by
// hand: wrapperspb messages) behind grpcidem's interceptors, and calls it with key.
func grpcRun(t *testing.T, g *idem.Guard, e *env, s Store, adapter string, logger *slog.Logger, effect func(context.Context, string, any) (string, error)) func(string) result {
	cfg := grpcidem.ServerConfig{Guard: g, Logger: logger, Scope: func(context.Context) (string, error) { return "tenant-1", nil }}
	create := func(ctx context.Context, req *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		key := ""
		if h := grpcidem.FromContext(ctx); h != nil {
			key = h.Key()
		}
		if adapter != GRPCTx {
			id, err := effect(ctx, key, nil)
			return wrapperspb.String(id), err
		}
		if s == Postgres {
			return grpcidem.InTx(ctx, e.pgxInTx, func(ctx context.Context, tx pgx.Tx) (*wrapperspb.StringValue, error) {
				id, err := effect(ctx, key, tx)
				return wrapperspb.String(id), err
			})
		}
		return grpcidem.InTx(ctx, e.sqlInTx, func(ctx context.Context, tx *sql.Tx) (*wrapperspb.StringValue, error) {
			id, err := effect(ctx, key, tx)
			return wrapperspb.String(id), err
		})
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
			id, err := effect(stream.Context(), "", nil)
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

	return func(key string) result {
		ctx := metadata.AppendToOutgoingContext(t.Context(), grpcidem.MetadataKey, key)
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
		err := conn.Invoke(ctx, grpcUnary, wrapperspb.String(`{"amount":2000}`), out, grpc.Header(&header))
		if status.Code(err) == codes.Aborted && grpcidem.ErrorCode(err) == idem.CodeRequestInProgress {
			err = fmt.Errorf("%w: %v", idem.ErrKeyInProgress, err)
		}
		replayed := len(header.Get(grpcidem.ReplayedKey)) > 0
		return result{value: out.GetValue(), replayed: replayed, err: err}
	}
}
