package grpcidem_test

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/grpcidem/internal/testpb"
)

// watchMethod is the server-streaming method of the test's Watcher service.
const watchMethod = "/idem.test.Watcher/Watch"

// watchDesc describes Watcher by hand: one server-streaming method taking a
// ChargeRequest and sending Charges, whose executions the test counts.
func watchDesc(executions *atomic.Int64) grpc.ServiceDesc {
	return grpc.ServiceDesc{
		ServiceName: "idem.test.Watcher",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName:    "Watch",
			ServerStreams: true,
			Handler: func(_ any, stream grpc.ServerStream) error {
				executions.Add(1)
				req := &testpb.ChargeRequest{}
				if err := stream.RecvMsg(req); err != nil {
					return err
				}
				return stream.SendMsg(&testpb.Charge{Id: "ch_1", Amount: req.Amount})
			},
		}},
	}
}

// watch calls Watch as user with key ("" sends none) and reads the stream to its end.
func watch(t *testing.T, conn *grpc.ClientConn, key string) error {
	t.Helper()
	desc := &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}
	stream, err := conn.NewStream(as(t.Context(), "alice", key), desc, watchMethod)
	if err != nil {
		return err
	}
	if err := stream.SendMsg(chargeRequest()); err != nil {
		return err
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	for {
		if err := stream.RecvMsg(&testpb.Charge{}); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// A streaming method has no one response to store and replay, so idem cannot run it at
// most once per key; the stream interceptor makes that loud instead of silent (issue
// 19 item 7: Watch configured KeyRequired ran twice with one key). A keyed call, or a
// call of a method that requires a key, is refused with FAILED_PRECONDITION
// (stream_not_supported) before the handler runs, and an error naming the method is
// logged; a call without a key of a method that does not require one passes.
func TestStreamingCallsThatAskForAKeyAreRefusedLoudly(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	var executions atomic.Int64
	guard := idem.NewGuard(idem.GuardConfig{Store: memoryStore()})
	cfg := grpcidem.ServerConfig{Guard: guard, Scope: scopeOf, Logger: logger}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := grpc.NewServer(grpc.StreamInterceptor(grpcidem.StreamServerInterceptor(cfg)))
	desc := watchDesc(&executions)
	open.RegisterService(&desc, struct{}{})
	go func() { _ = open.Serve(lis) }()
	t.Cleanup(open.Stop)
	conn := dialT(t, lis.Addr().String())

	if err := watch(t, conn, ""); err != nil {
		t.Fatalf("a call without a key: %v, want it to pass", err)
	}
	err = watch(t, conn, key1)
	if status.Code(err) != codes.FailedPrecondition || grpcidem.ErrorCode(err) != "stream_not_supported" {
		t.Fatalf("a keyed call: %v (code %q), want FAILED_PRECONDITION stream_not_supported", err, grpcidem.ErrorCode(err))
	}
	if n := executions.Load(); n != 1 {
		t.Fatalf("%d executions, want 1: the keyed call must not run", n)
	}
	mu.Lock()
	logged := logs.String()
	mu.Unlock()
	if !strings.Contains(logged, "level=ERROR") || !strings.Contains(logged, watchMethod) {
		t.Fatalf("no error naming the method was logged:\n%s", logged)
	}

	// A method configured to require a key refuses every call, keyed or not.
	cfg.Methods = map[string]grpcidem.MethodOptions{watchMethod: {Requirement: idem.KeyRequired}}
	lis2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	required := grpc.NewServer(grpc.StreamInterceptor(grpcidem.StreamServerInterceptor(cfg)))
	required.RegisterService(&desc, struct{}{})
	go func() { _ = required.Serve(lis2) }()
	t.Cleanup(required.Stop)
	conn2 := dialT(t, lis2.Addr().String())
	for _, k := range []string{"", key1} {
		if err := watch(t, conn2, k); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("key %q on a method that requires one: %v, want FAILED_PRECONDITION", k, err)
		}
	}
	if n := executions.Load(); n != 1 {
		t.Fatalf("%d executions, want 1", n)
	}
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
