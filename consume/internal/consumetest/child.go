package consumetest

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/store/postgres"
	"github.com/idem-go/idem/store/sqlite"
)

// The settings of the consumers: short, so that a run waits little for the leases of
// the consumers it kills.
const (
	// Scope is the scope of the consumers' messages.
	Scope = "killtest"
	// Lease is the guard's lease: how long a message claimed by a killed consumer
	// waits before another takes it over.
	Lease = 2 * time.Second
	// InProgressDelay and RetryDelay are the Processor's.
	InProgressDelay = 200 * time.Millisecond
	RetryDelay      = 200 * time.Millisecond
	// HangAt is how many messages a consumer commits before it is killed: it hangs in
	// its HangAt-th effect, or after its HangAt-th commit, or goes on until the parent
	// kills it after that commit.
	HangAt = 10
)

// Environment from the parent to a consumer process, and the lines of its protocol on
// stdout.
const (
	envRole    = "IDEM_KILLTEST_ROLE"
	roleChild  = "consumer"
	envHelper  = "IDEM_KILLTEST_HELPER"
	envDB      = "IDEM_KILLTEST_DB"
	envDSN     = "IDEM_KILLTEST_DSN"
	envSchema  = "IDEM_KILLTEST_SCHEMA"
	envHang    = "IDEM_KILLTEST_HANG" // where the consumer hangs: hangEffect or hangCommit
	hangEffect = "effect"             // in its HangAt-th effect, after the write
	hangCommit = "commit"             // after its HangAt-th commit, before the acknowledgement

	lineDone     = "killtest-done"     // ID ACTION REPLAYED DELIVERY, before the acknowledgement
	lineHang     = "killtest-hang"     // ID WHERE, then the consumer hangs until killed
	lineTakeover = "killtest-takeover" // it took over a message of a killed consumer
)

// Children are a broker's consumer loops, one per database (their transaction types
// differ). Each consumes the queue its Broker prepared (from the environment), hands
// every delivery to Child.Handle and then acknowledges it as the result says, and
// returns nil once Child.Stopping is closed and the message in hand is settled.
type Children struct {
	SQLite   func(ctx context.Context, c *Child[*sql.Tx]) error
	Postgres func(ctx context.Context, c *Child[pgx.Tx]) error
}

// Main runs m's tests, or, in a consumer process started by [Run], the consumer loop
// of its database. Call it from TestMain.
func Main(m *testing.M, ch Children) {
	if os.Getenv(envRole) != roleChild {
		os.Exit(m.Run())
	}
	ctx := context.Background()
	var err error
	switch db := os.Getenv(envDB); db {
	case "sqlite":
		err = runSQLite(ctx, ch.SQLite)
	case "postgres":
		err = runPostgres(ctx, ch.Postgres)
	default:
		err = fmt.Errorf("unknown %s=%q", envDB, db)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumetest consumer:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Child is a consumer process's side of a run: the Processor its adapter uses, and the
// effect to run.
type Child[Tx any] struct {
	// Processor is the helper under test; nil when the run goes without it.
	Processor *consume.Processor[Tx]

	inTx   func(ctx context.Context, fn func(ctx context.Context, tx Tx) error) error
	insert func(ctx context.Context, tx Tx, id string) error
	// hang is where the consumer hangs until it is killed ("" for nowhere);
	// effects and commits count the effects it ran and the messages it committed.
	hang             string
	effects, commits atomic.Int64
	stopping         chan struct{}
}

func newChild[Tx any](st idemstore.Store, inTx func(context.Context, func(context.Context, Tx) error) error,
	insert func(context.Context, Tx, string) error) *Child[Tx] {
	c := &Child[Tx]{inTx: inTx, insert: insert, stopping: make(chan struct{}), hang: os.Getenv(envHang)}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes it to stop the consumer
		close(c.stopping)
	}()
	if helper, _ := strconv.ParseBool(os.Getenv(envHelper)); helper {
		logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
		g := idem.NewGuard(idem.GuardConfig{Store: st, Lease: Lease, Logger: logger, Observer: &observe.Observer{
			Claimed: func(ev observe.ClaimEvent) {
				if ev.Outcome == observe.OutcomeTookOver {
					fmt.Println(lineTakeover)
				}
			},
		}})
		c.Processor = consume.New(consume.Config[Tx]{Guard: g, InTx: inTx,
			InProgressDelay: InProgressDelay, RetryDelay: RetryDelay, Logger: logger})
	}
	return c
}

// Stopping is closed when the parent asks the consumer to stop.
func (c *Child[Tx]) Stopping() <-chan struct{} { return c.stopping }

// Effect is the effect of message id: a row in the effects table, written in tx. When
// the parent kills this consumer in an effect, it hangs in its HangAt-th, after the
// write.
func (c *Child[Tx]) Effect(ctx context.Context, tx Tx, id string) error {
	if err := c.insert(ctx, tx, id); err != nil {
		return err
	}
	if c.effects.Add(1) == HangAt && c.hang == hangEffect {
		hang(id, hangEffect)
	}
	return nil
}

// Handle handles a delivery of message id, delivered the delivery-th time: with the
// helper, by process (the adapter's Process); without, by running Effect in a plain
// transaction. It reports the result to the parent and returns it, for the caller to
// settle with the broker. When the parent kills this consumer after a commit, it hangs
// here after its HangAt-th, before the acknowledgement.
func (c *Child[Tx]) Handle(ctx context.Context, id string, delivery int, process func(context.Context) consume.Result) consume.Result {
	var res consume.Result
	if c.Processor != nil {
		res = process(ctx)
	} else {
		res = c.plain(ctx, id)
	}
	fmt.Printf("%s %s %s %t %d\n", lineDone, id, res.Action, res.Replayed, delivery)
	if res.Action == consume.Ack && !res.Replayed && c.commits.Add(1) == HangAt && c.hang == hangCommit {
		hang(id, hangCommit)
	}
	return res
}

// plain is a consumer without idempotency: the effect in a transaction, then the
// acknowledgement.
func (c *Child[Tx]) plain(ctx context.Context, id string) consume.Result {
	err := c.inTx(idem.WithoutKey(ctx), func(ctx context.Context, tx Tx) error { return c.Effect(ctx, tx, id) })
	if err != nil {
		return consume.Result{Action: consume.Nak, Delay: RetryDelay, Err: err}
	}
	return consume.Result{Action: consume.Ack}
}

// hang tells the parent where this consumer is, and waits for the SIGKILL.
func hang(id, where string) {
	fmt.Printf("%s %s %s\n", lineHang, id, where)
	select {}
}

func runSQLite(ctx context.Context, f func(context.Context, *Child[*sql.Tx]) error) error {
	st, err := sqlite.Open(ctx, os.Getenv(envDSN), sqlite.Config{})
	if err != nil {
		return err
	}
	defer st.Close()
	return f(ctx, newChild(st, st.InTx, func(ctx context.Context, tx *sql.Tx, id string) error {
		_, err := tx.ExecContext(ctx, insertEffect, id, os.Getpid())
		return err
	}))
}

func runPostgres(ctx context.Context, f func(context.Context, *Child[pgx.Tx]) error) error {
	st, err := postgres.Open(ctx, os.Getenv(envDSN), postgres.Config{Schema: os.Getenv(envSchema), MaxConns: 4})
	if err != nil {
		return err
	}
	defer st.Close()
	return f(ctx, newChild(st, st.InTx, func(ctx context.Context, tx pgx.Tx, id string) error {
		_, err := tx.Exec(ctx, insertEffectPostgres, id, os.Getpid())
		return err
	}))
}
