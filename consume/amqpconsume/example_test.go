package amqpconsume_test

import (
	"context"
	"database/sql"
	"log"
	"os/signal"
	"syscall"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/consume/amqpconsume"
	"github.com/idem-go/idem/store/sqlite"
)

// A billing service that writes one invoice per message of the queue orders.billing, at
// most once each, however often RabbitMQ delivers it: the invoice and the message's
// record commit together, and the delivery is acknowledged after that. The publisher
// sets the message's id: amqp.Publishing{MessageId: eventID, Body: data}.
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

	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	if err := ch.Qos(16, 0, false); err != nil {
		log.Fatal(err)
	}
	deliveries, err := ch.Consume("orders.billing", "billing", false, false, false, false, nil)
	if err != nil {
		log.Fatal(err)
	}

	p := consume.New(consume.Config[*sql.Tx]{Guard: idem.NewGuard(idem.GuardConfig{Store: st}), InTx: st.InTx})
	h := amqpconsume.New(p, amqpconsume.Config{Scope: "orders.billing"}, func(ctx context.Context, tx *sql.Tx, d amqp.Delivery) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO invoices (event) VALUES (?)`, d.Body)
		return err
	})
	// Until SIGTERM; what was delivered and not handled is requeued when the
	// connection closes.
	if err := h.Run(ctx, deliveries); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}
