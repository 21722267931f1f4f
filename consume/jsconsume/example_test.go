package jsconsume_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/consume/jsconsume"
	"github.com/idem-go/idem/store/sqlite"
)

// A billing service that writes one invoice per order event of the stream ORDERS, at
// most once each, however often JetStream delivers it: the invoice and the message's
// record commit together, and the message is acknowledged after that. The publisher
// sets the event's id: js.Publish(ctx, "orders.created", data,
// jetstream.WithMsgID(eventID)).
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	st, err := sqlite.Open(ctx, "billing.db", sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// AckWait a little longer than the guard's lease (30 s): a message redelivered
	// after its consumer died finds the claim lapsed. Naks count as deliveries, so
	// MaxDeliver is unbounded here.
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 40 * time.Second, MaxDeliver: -1,
	})
	if err != nil {
		log.Fatal(err)
	}

	p := consume.New(consume.Config[*sql.Tx]{Guard: idem.NewGuard(idem.GuardConfig{Store: st}), InTx: st.InTx})
	h := jsconsume.New(p, jsconsume.Config{Scope: "ORDERS/billing"}, func(ctx context.Context, tx *sql.Tx, msg jetstream.Msg) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (event) VALUES (?)`, msg.Data())
		return err
	})
	cc, err := cons.Consume(h.MessageHandler(ctx))
	if err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	cc.Drain() // finish the messages in hand; the rest are redelivered to another consumer
	<-cc.Closed()
}
