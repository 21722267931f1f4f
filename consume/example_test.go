package consume_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/sqlite"
)

// A consumer that records an invoice per message. The broker delivers the message a
// second time (the first acknowledgement was lost): the repeat is acknowledged, and
// the invoice is written once. consume/jsconsume and consume/amqpconsume do the same
// with a JetStream or RabbitMQ delivery, and acknowledge it as the Result says.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "consume-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	if err := st.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE invoices (order_id TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	p := consume.New(consume.Config[*sql.Tx]{
		Guard: idem.NewGuard(idem.GuardConfig{Store: st}),
		InTx:  st.InTx, // the invoice and the message's record commit together (SPEC §7)
	})
	delivery := consume.Message{Scope: "orders.invoicing", ID: "order-1042-created", Payload: []byte(`{"order":1042}`)}
	for range 2 {
		res := p.Process(ctx, delivery, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO invoices (order_id) VALUES ('1042')`)
			return err
		})
		fmt.Println(res.Action, "replayed:", res.Replayed)
	}
	var n int
	if err := st.DB().QueryRowContext(ctx, `SELECT count(*) FROM invoices`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoices:", n)
	// Output:
	// ack replayed: false
	// ack replayed: true
	// invoices: 1
}
