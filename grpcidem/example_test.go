package grpcidem_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"net"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/grpcidem/internal/testpb"
	"github.com/idem-go/idem/store/memory"
)

// chargeService creates charges; each execution makes a new one.
type chargeService struct {
	testpb.UnimplementedPaymentsServer
	n atomic.Int64
}

func (s *chargeService) CreateCharge(ctx context.Context, req *testpb.ChargeRequest) (*testpb.Charge, error) {
	return &testpb.Charge{Id: fmt.Sprintf("ch_%d", s.n.Add(1)), Amount: req.Amount, Currency: req.Currency, Status: "succeeded"}, nil
}

// principal is the scope of a call: the hex SHA-256 of its bearer token, as the
// payments API scopes its keys. A real server takes it from what its authentication
// interceptor put in the context.
func principal(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if token, ok := strings.CutPrefix(v, "Bearer "); ok && token != "" {
			sum := sha256.Sum256([]byte(token))
			return hex.EncodeToString(sum[:]), nil
		}
	}
	return "", errors.New("unauthenticated")
}

// A server that executes each keyed call once, and a client that retries it with
// the same key: the retry gets the first response replayed.
func Example() {
	guard := idem.NewGuard(idem.GuardConfig{Store: memory.New()}) // store/sqlite or store/postgres in production
	cfg := grpcidem.ServerConfig{Guard: guard, Scope: principal}
	srv := grpc.NewServer(
		// ... the authentication interceptors first, then:
		grpc.ChainUnaryInterceptor(grpcidem.UnaryServerInterceptor(cfg)),
		// Refuses streaming calls that ask for a key: a stream cannot run at most once.
		grpc.ChainStreamInterceptor(grpcidem.StreamServerInterceptor(cfg)),
	)
	testpb.RegisterPaymentsServer(srv, &chargeService{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Adds a key to calls without one and retries them safely.
		grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor(grpcidem.ClientConfig{})))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	payments := testpb.NewPaymentsClient(conn)

	// The application sends the call, then sends it again with the same key (as it
	// would after a lost reply).
	ctx := metadata.AppendToOutgoingContext(context.Background(),
		"authorization", "Bearer sk_test_123", grpcidem.MetadataKey, "5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01")
	for range 2 {
		var header metadata.MD
		charge, err := payments.CreateCharge(ctx, &testpb.ChargeRequest{Amount: 2000, Currency: "usd"}, grpc.Header(&header))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(charge.Id, charge.Amount, "replayed:", header.Get(grpcidem.ReplayedKey))
	}
	// Output:
	// ch_1 2000 replayed: []
	// ch_1 2000 replayed: [true]
}
