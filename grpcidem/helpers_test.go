package grpcidem_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/grpcidem/internal/testpb"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/store/memory"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// userKey is the metadata key the test servers take the principal from; a real server
// would take it from its authentication interceptor's context.
const userKey = "x-user"

// scopeOf is the ServerConfig.Scope of the test servers.
func scopeOf(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(userKey); len(v) == 1 && v[0] != "" {
		return v[0], nil
	}
	return "", errors.New("no principal")
}

// payments is the test service. Every call of CreateCharge and AuthorizeCharge counts
// as an execution and runs the test's behaviour, if any.
type payments struct {
	testpb.UnimplementedPaymentsServer
	executions atomic.Int64
	// behave, when set, runs in each execution (n counts from 1) and may answer
	// instead of the default charge.
	behave func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error)
}

func (p *payments) CreateCharge(ctx context.Context, req *testpb.ChargeRequest) (*testpb.Charge, error) {
	n := p.executions.Add(1)
	if p.behave != nil {
		if resp, err := p.behave(ctx, req, n); resp != nil || err != nil {
			return resp, err
		}
	}
	return charge(ctx, req, fmt.Sprintf("ch_%d", n)), nil
}

func (p *payments) AuthorizeCharge(ctx context.Context, req *testpb.ChargeRequest) (*testpb.Charge, error) {
	return p.CreateCharge(ctx, req)
}

// charge is the charge a request makes, with the key of the call's claim.
func charge(ctx context.Context, req *testpb.ChargeRequest, id string) *testpb.Charge {
	key := ""
	if h := grpcidem.FromContext(ctx); h != nil {
		key = h.Key()
	}
	return &testpb.Charge{Id: id, Amount: req.Amount, Currency: req.Currency, CustomerId: req.CustomerId,
		Status: "succeeded", IdempotencyKey: key, ServedBy: int64(os.Getpid())}
}

// bundle is a real gRPC server with the interceptor on loopback, and a client of it.
type bundle struct {
	svc    *payments
	store  idemstore.Store
	guard  *idem.Guard
	client testpb.PaymentsClient
	addr   string
}

// options of setup.
type options struct {
	store  idemstore.Store
	guard  func(*idem.GuardConfig)
	server func(*grpcidem.ServerConfig)
	// client, when set, is the client interceptor's configuration.
	client *grpcidem.ClientConfig
	behave func(ctx context.Context, req *testpb.ChargeRequest, n int64) (*testpb.Charge, error)
	// observe, when set, is told of the error of every call the server answers.
	observe func(err error)
}

func setup(t *testing.T, o options) *bundle {
	t.Helper()
	if o.store == nil {
		o.store = memory.New()
	}
	gcfg := idem.GuardConfig{Store: o.store}
	if o.guard != nil {
		o.guard(&gcfg)
	}
	b := &bundle{svc: &payments{behave: o.behave}, store: o.store, guard: idem.NewGuard(gcfg)}
	scfg := grpcidem.ServerConfig{Guard: b.guard, Scope: scopeOf}
	if o.server != nil {
		o.server(&scfg)
	}
	interceptors := []grpc.UnaryServerInterceptor{grpcidem.UnaryServerInterceptor(scfg)}
	if o.observe != nil {
		observe := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			resp, err := next(ctx, req)
			o.observe(err)
			return resp, err
		}
		interceptors = append([]grpc.UnaryServerInterceptor{observe}, interceptors...)
	}
	b.addr = serve(t, b.svc, grpc.ChainUnaryInterceptor(interceptors...))
	var dial []grpc.DialOption
	if o.client != nil {
		dial = append(dial, grpc.WithUnaryInterceptor(grpcidem.UnaryClientInterceptor(*o.client)))
	}
	b.client = testpb.NewPaymentsClient(dialT(t, b.addr, dial...))
	return b
}

// serve starts a gRPC server of svc on a loopback port and stops it when the test
// ends; it returns the address.
func serve(t *testing.T, svc testpb.PaymentsServer, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	testpb.RegisterPaymentsServer(srv, svc)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(lis) })
	t.Cleanup(func() { srv.Stop(); wg.Wait() })
	return lis.Addr().String()
}

// dialT connects to addr and closes the connection when the test ends.
func dialT(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// as returns ctx for a call by user with key ("" sends none).
func as(ctx context.Context, user, key string) context.Context {
	kv := []string{userKey, user}
	if key != "" {
		kv = append(kv, grpcidem.MetadataKey, key)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

// call is CreateCharge as user with key, returning the response header metadata too.
func (b *bundle) call(t *testing.T, user, key string, req *testpb.ChargeRequest) (*testpb.Charge, metadata.MD, error) {
	t.Helper()
	var header metadata.MD
	resp, err := b.client.CreateCharge(as(t.Context(), user, key), req, grpc.Header(&header))
	return resp, header, err
}

func chargeRequest() *testpb.ChargeRequest {
	return &testpb.ChargeRequest{Amount: 2000, Currency: "usd", CustomerId: "cust_abc123"}
}

const key1 = "5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01"

func memoryStore() idemstore.Store { return memory.New() }

// metadataAppend adds one metadata value to ctx's outgoing metadata.
func metadataAppend(ctx context.Context, k, v string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, k, v)
}

// incoming returns ctx with incoming metadata, as a server sees it.
func incoming(ctx context.Context, kv ...string) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
}

// chargesTable is the application's table of the tests that commit writes with the
// record (SPEC §7), in the store's own database.
const chargesTable = `CREATE TABLE IF NOT EXISTS grpc_charges (
	id TEXT PRIMARY KEY, amount BIGINT NOT NULL, currency TEXT NOT NULL, pid BIGINT NOT NULL)`

// openSQLite opens, migrates and closes at the end of the test the SQLite store at
// path, with the charges table.
func openSQLite(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path, sqlite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec(chargesTable); err != nil {
		t.Fatal(err)
	}
	return s
}

// createChargeSQLite inserts a charge and stores the response in one transaction.
func createChargeSQLite(ctx context.Context, s *sqlite.Store, req *testpb.ChargeRequest) (*testpb.Charge, error) {
	return grpcidem.InTx(ctx, s.InTx, func(ctx context.Context, tx *sql.Tx) (*testpb.Charge, error) {
		c := charge(ctx, req, "ch_"+rand.Text())
		_, err := tx.ExecContext(ctx, `INSERT INTO grpc_charges (id, amount, currency, pid) VALUES (?, ?, ?, ?)`,
			c.Id, c.Amount, c.Currency, c.ServedBy)
		return c, err
	})
}

// createChargePostgres is createChargeSQLite on PostgreSQL.
func createChargePostgres(ctx context.Context, s *postgres.Store, req *testpb.ChargeRequest) (*testpb.Charge, error) {
	return grpcidem.InTx(ctx, s.InTx, func(ctx context.Context, tx pgx.Tx) (*testpb.Charge, error) {
		c := charge(ctx, req, "ch_"+rand.Text())
		_, err := tx.Exec(ctx, `INSERT INTO grpc_charges (id, amount, currency, pid) VALUES ($1, $2, $3, $4)`,
			c.Id, c.Amount, c.Currency, c.ServedBy)
		return c, err
	})
}

// countCharges counts the charges in the SQLite store's database.
func countCharges(t testing.TB, s *sqlite.Store) int {
	t.Helper()
	var n int
	if err := s.DB().QueryRow(`SELECT count(*) FROM grpc_charges`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
