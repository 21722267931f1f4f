package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/sqlite"
)

// A charge in Brandur Leach's order (SPEC §13): a first step records the charge as
// pending before the card processor is called; the processor call carries a key
// derived from the request, so that the processor deduplicates a repeat; a final
// transaction, idem.Finish, saves the processor's answer and completes the charge, the
// record and the response together. The operation is one function, which the handler
// runs for a request and the resume function for a record whose client gave up: both
// deliver the response by returning it from Finish's function.
//
// Here the processor fails the first time: the handler answers 503, which keeps the
// record (its step committed) with its lease ended; the client gives up, and the
// completer resumes the operation after the step instead of recording a second
// charge. The client's late retry gets the charge, replayed.
func ExampleStep() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE charges (id INTEGER PRIMARY KEY, status TEXT NOT NULL, processor_id TEXT)`); err != nil {
		log.Fatal(err)
	}

	// The card processor: it fails once, then charges, deduplicating by key.
	processed := map[string]string{}
	calls := 0
	chargeCard := func(key string) (string, error) {
		if calls++; calls == 1 {
			return "", errors.New("processor unavailable")
		}
		if _, ok := processed[key]; !ok {
			processed[key] = fmt.Sprintf("pch_%d", len(processed)+1)
		}
		return processed[key], nil
	}

	type pending struct{ ID int64 }
	type charge struct {
		ID          string `json:"id"`
		Status      string `json:"status"`
		ProcessorID string `json:"processor_charge_id"`
	}
	// createCharge is the operation, for a request and for its resume alike: a step
	// that committed returns its saved result without running again.
	createCharge := func(ctx context.Context) error {
		p, err := sqlite.Step(ctx, store, "charge_pending", func(ctx context.Context, tx *sql.Tx) (pending, error) {
			res, err := tx.ExecContext(ctx, `INSERT INTO charges (status) VALUES ('pending')`)
			if err != nil {
				return pending{}, err
			}
			id, err := res.LastInsertId()
			return pending{ID: id}, err
		})
		if err != nil {
			return err
		}
		pch, err := chargeCard(idem.FromContext(ctx).DerivedKey("processor_charge"))
		if err != nil {
			return err
		}
		return idem.Finish(ctx, store.InTx, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			if _, err := tx.ExecContext(ctx, `UPDATE charges SET status = 'succeeded', processor_id = ? WHERE id = ?`, pch, p.ID); err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, charge{ID: fmt.Sprintf("ch_%d", p.ID), Status: "succeeded", ProcessorID: pch})
		})
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := createCharge(r.Context()); err != nil { // nothing was answered: the handler does
			http.Error(w, "the processor is unavailable; retry", http.StatusServiceUnavailable)
		}
	})
	resume := func(ctx context.Context, _ *idem.Handle) error { return createCharge(ctx) }

	mw := idem.New(idem.Config{Store: store, Scope: func(*http.Request) (string, error) { return "user-1", nil }})
	h := mw.Route(idem.RouteOptions{Name: "charges.create", Resume: resume})(handler)
	post := func() {
		req := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":2000}`))
		req.Header.Set("Idempotency-Key", "9f3c6f52-1b9a-4a53-8d0e-2f1f3f2d9a11")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, strings.TrimSpace(rec.Body.String()), "replayed:", rec.Header().Get("Idempotent-Replayed") == "true")
	}
	post()
	pass := idem.NewCompleter(mw.Guard(), idem.CompleterConfig{}).Pass(ctx) // in production: Run, in the background
	fmt.Println("completer: resumed", pass.Resumed)
	post()
	var charges int
	if err := store.DB().QueryRowContext(ctx, `SELECT count(*) FROM charges`).Scan(&charges); err != nil {
		log.Fatal(err)
	}
	fmt.Println("charges:", charges, "processor charges:", len(processed))
	// Output:
	// 503 the processor is unavailable; retry replayed: false
	// completer: resumed 1
	// 201 {"id":"ch_1","status":"succeeded","processor_charge_id":"pch_1"} replayed: true
	// charges: 1 processor charges: 1
}
