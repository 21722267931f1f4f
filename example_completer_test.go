package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/memory"
)

// A Completer finishes an operation whose caller gave up after one of its steps
// committed (SPEC §13). Here the card processor is down on the first attempt: the
// pending charge is saved, the attempt fails, and the caller goes away. A completer
// pass resumes the operation after its saved step through the resume function
// registered under the operation's name; the caller's retry, much later, finds the
// finished charge.
func ExampleCompleter() {
	ctx := context.Background()
	g := idem.NewGuard(idem.GuardConfig{Store: memory.New(), Logger: slog.New(slog.DiscardHandler)})
	type charge struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	processorUp := false
	// The operation, shared by the caller and the resume function.
	createCharge := func(ctx context.Context) (charge, error) {
		pending, err := idem.Step(ctx, "charge_pending", func(context.Context) (charge, error) {
			return charge{ID: "ch_1", Status: "pending"}, nil // an INSERT, with store/sqlite's Step
		})
		if err != nil {
			return charge{}, err
		}
		if !processorUp {
			return charge{}, errors.New("processor unavailable")
		}
		// The processor call would carry idem.FromContext(ctx).DerivedKey("processor_charge").
		return charge{ID: pending.ID, Status: "succeeded"}, nil
	}
	g.RegisterResume("charges.create", func(ctx context.Context, h *idem.Handle) error {
		c, err := createCharge(ctx)
		if err != nil {
			return err
		}
		return h.SetResult(c) // stored as idem.Do stores its result
	})
	call := idem.Call{Scope: "user-1", Key: "order-42-payment", Name: "charges.create",
		Fingerprint: idem.FingerprintInput("charges.create", []byte(`{"amount":2000}`))}

	_, _, err := idem.Do(ctx, g, call, createCharge)
	fmt.Println("first attempt:", err)

	processorUp = true
	pass := idem.NewCompleter(g, idem.CompleterConfig{}).Pass(ctx)
	fmt.Println("completer resumed:", pass.Resumed)

	c, replayed, err := idem.Do(ctx, g, call, createCharge)
	fmt.Println("retry:", c.ID, c.Status, "replayed:", replayed, err)
	// Output:
	// first attempt: processor unavailable
	// completer resumed: 1
	// retry: ch_1 succeeded replayed: true <nil>
}
