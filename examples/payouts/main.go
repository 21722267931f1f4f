// Command payouts is idem's example of the hard case (docs/foreign-effects.md): POST
// /v1/payouts reserves funds in PostgreSQL, asks a bank to transfer them over an HTTP
// API that deduplicates by its own Idempotency-Key, records the bank's transfer id and
// answers 201, exactly once per key across crashes, restarts and lost replies.
//
// The operation is one function, payout, in three parts (SPEC §13):
//
//  1. the step reserve_funds (postgres.Step): the funds leave the account and the payout
//     is recorded pending, in one transaction with the key's recovery point;
//  2. the bank's transfer, whose Idempotency-Key is derived from the request
//     (Handle.DerivedKey("bank_transfer")): a call repeated after a crash or a lost
//     reply finds the bank's first transfer;
//  3. idem.Finish: the payout is marked paid with the transfer's id, and its response
//     commits with the key's record.
//
// The handler runs it for a request; the route's resume function runs it for a record
// whose client gave up (the Completer, in the background): a step that committed returns
// its saved result without running again, so both resume after the reservation.
//
//	go run .        # with a fake bank in this process, on PostgreSQL at 127.0.0.1:5432
//	curl -i localhost:8080/v1/payouts -H 'Authorization: Bearer sk_test_1' \
//	    -H 'Idempotency-Key: 5f0c6d0e-8b1c-4c3e-9a53-2a1f4b7d9e01' -H 'Content-Type: application/json' \
//	    -d '{"account": "acc_demo", "amount": 5000, "currency": "eur", "destination": "DE89370400440532013000", "reference": "invoice-42"}'
//
// main_test.go runs its cases; crash_test.go builds this program and SIGKILLs it under
// retrying clients while a bank loses replies, and counts reservations and transfers.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
	"github.com/idem-go/idem/store/postgres"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	dbURL := flag.String("db", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL URL of the accounts, the payouts and idem's records")
	bankURL := flag.String("bank", "", "URL of the bank's transfer API; empty starts a fake bank in this process")
	drop := flag.Float64("bank-drop", 0.1, "share of the fake bank's replies lost after the transfer was made")
	lease := flag.Duration("lease", idem.DefaultLease, "idem's lease: how long a crashed request holds its key")
	interval := flag.Duration("completer-interval", idem.DefaultCompleterInterval, "pause between the completer's passes")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if *bankURL == "" {
		bank, err := startFakeBank("127.0.0.1:0", *drop)
		if err != nil {
			log.Fatal(err)
		}
		defer bank.close()
		*bankURL = bank.url
		log.Printf("fake bank at %s", bank.url)
	}
	store, err := open(ctx, *dbURL)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if err := seedDemoAccount(ctx, store); err != nil {
		log.Fatal(err)
	}
	a := &app{store: store, bank: newBankClient(*bankURL)}
	handler, mw := a.routes(*lease)
	// The completer finishes, in the background, the payouts whose client gave up after
	// the reservation (a crash, a bank that was down): every process runs one.
	go idem.NewCompleter(mw.Guard(), idem.CompleterConfig{Interval: *interval}).Run(ctx)

	srv := &http.Server{Addr: *addr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.Background()) // lets requests in flight finish
	}()
	log.Printf("listening on %s", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// open connects to the database and creates idem's tables and the application's.
func open(ctx context.Context, url string) (*postgres.Store, error) {
	store, err := postgres.Open(ctx, url, postgres.Config{})
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		store.Close()
		return nil, err
	}
	// The start sequence (SPEC §20): never serve a store a newer release finalized.
	if _, err := idem.CheckStore(ctx, store); err != nil {
		store.Close()
		return nil, err
	}
	_, err = store.Pool().Exec(ctx, `
		CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
		CREATE TABLE IF NOT EXISTS payouts (
			id text PRIMARY KEY, account text NOT NULL REFERENCES accounts, amount bigint NOT NULL,
			currency text NOT NULL, destination text NOT NULL, reference text NOT NULL,
			status text NOT NULL, transfer_id text)`)
	if err != nil {
		store.Close()
		return nil, err
	}
	return store, nil
}

// seedDemoAccount gives `go run .` an account to pay out of.
func seedDemoAccount(ctx context.Context, store *postgres.Store) error {
	_, err := store.Pool().Exec(ctx, `INSERT INTO accounts (id, balance) VALUES ('acc_demo', 1000000) ON CONFLICT DO NOTHING`)
	return err
}

// app is the payouts API: its database (the store's) and the bank.
type app struct {
	store *postgres.Store
	bank  *bankClient
}

// routes returns the API behind idem, and the middleware (whose guard the completer
// runs on). The route's Name is the operation's stable identifier: unfinished records
// keep it to find their resume function, so it must not change across deploys while
// any payout is unfinished (a metric label comes from it too).
func (a *app) routes(lease time.Duration) (http.Handler, *idem.Middleware) {
	mw := idem.New(idem.Config{Store: a.store, Scope: principal, Lease: lease})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payouts", mw.Route(idem.RouteOptions{Name: "payouts.create", Resume: a.resumePayout})(http.HandlerFunc(a.createPayout)))
	return authenticate(mux), mw
}

// payoutRequest is what a client asks for.
type payoutRequest struct {
	Account     string `json:"account"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Destination string `json:"destination"`
	Reference   string `json:"reference"`
}

// reservation is the saved result of the step reserve_funds: all that the rest of the
// operation needs, so that a resume, which has no request, has it too.
type reservation struct {
	PayoutID string        `json:"payout_id"`
	Request  payoutRequest `json:"request"`
}

// payoutJSON is the API's payout.
type payoutJSON struct {
	ID string `json:"id"`
	payoutRequest
	Status     string `json:"status"`
	TransferID string `json:"transfer_id,omitempty"`
}

var (
	errInsufficientFunds = errors.New("insufficient funds")
	errNoRequest         = errors.New("resumed before the funds were reserved: nothing to resume")
)

// createPayout is the handler: it checks the request, runs the operation, and answers
// only what the operation did not (Finish answered the rest).
func (a *app) createPayout(w http.ResponseWriter, r *http.Request) {
	var in payoutRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Account == "" || in.Amount <= 0 ||
		len(in.Currency) != 3 || in.Destination == "" || in.Reference == "" {
		writeError(w, http.StatusBadRequest, "invalid_request", "account, amount, currency, destination and reference are required") // frees the key
		return
	}
	err := a.payout(r.Context(), &in)
	switch {
	case err == nil: // answered by Finish
	case errors.Is(err, idem.ErrLeaseLost), errors.Is(err, idem.ErrAnswered): // answered by the middleware
	case errors.Is(err, errInsufficientFunds):
		// Nothing was reserved: a 422 frees the key, and a retry after a top-up runs.
		writeError(w, http.StatusUnprocessableEntity, "insufficient_funds", "the account cannot cover the amount")
	case errors.Is(err, errBankUnavailable):
		// The funds are reserved (the step committed): the 503 keeps the record with
		// its lease ended, and the client's retry, or the completer, resumes it.
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "bank_unavailable", "the bank did not answer; retry with the same key")
	default:
		slog.ErrorContext(r.Context(), "payouts: a payout failed", "error", err)
		writeError(w, http.StatusInternalServerError, "internal_error", "retry with the same key")
	}
}

// resumePayout is the route's resume function: the operation without its request,
// which the step reserve_funds saved.
func (a *app) resumePayout(ctx context.Context, _ *idem.Handle) error {
	return a.payout(ctx, nil)
}

// payout is the operation, for a request (in) and for its resume (in is nil).
func (a *app) payout(ctx context.Context, in *payoutRequest) error {
	// 1. Reserve the funds and record the payout pending: one transaction, with the
	// key's recovery point. Committed before, it returns its saved result.
	res, err := postgres.Step(ctx, a.store, "reserve_funds", func(ctx context.Context, tx pgx.Tx) (reservation, error) {
		if in == nil {
			return reservation{}, errNoRequest
		}
		tag, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance - $2 WHERE id = $1 AND balance >= $2`, in.Account, in.Amount)
		if err != nil {
			return reservation{}, err
		}
		if tag.RowsAffected() == 0 {
			return reservation{}, errInsufficientFunds
		}
		res := reservation{PayoutID: "po_" + rand.Text(), Request: *in}
		_, err = tx.Exec(ctx, `INSERT INTO payouts (id, account, amount, currency, destination, reference, status)
			VALUES ($1, $2, $3, $4, $5, $6, 'pending')`, res.PayoutID, in.Account, in.Amount, in.Currency, in.Destination, in.Reference)
		return res, err
	})
	if err != nil {
		return err
	}
	// 2. The bank's transfer, keyed by the request: every repeat of this payout
	// (a retry, a resume, after a crash or a lost reply) sends the bank the same key.
	transfer, err := a.bank.transfer(ctx, idem.FromContext(ctx).DerivedKey("bank_transfer"), res)
	var declined *declinedError
	switch {
	case errors.As(err, &declined):
		return a.decline(ctx, res, declined.Reason)
	case err != nil:
		return err
	}
	// 3. The payout is paid: its update and its response commit with the key's record.
	return idem.Finish(ctx, a.store.InTx, func(ctx context.Context, tx pgx.Tx) (*idem.Response, error) {
		if _, err := tx.Exec(ctx, `UPDATE payouts SET status = 'paid', transfer_id = $2 WHERE id = $1`, res.PayoutID, transfer.ID); err != nil {
			return nil, err
		}
		return idem.JSONResponse(http.StatusCreated, payoutJSON{ID: res.PayoutID, payoutRequest: res.Request, Status: "paid", TransferID: transfer.ID})
	})
}

// decline ends a payout the bank refused for good: the funds go back, and the 402 is
// stored, so that a retry gets it again without asking the bank.
func (a *app) decline(ctx context.Context, res reservation, reason string) error {
	return idem.Finish(ctx, a.store.InTx, func(ctx context.Context, tx pgx.Tx) (*idem.Response, error) {
		if _, err := tx.Exec(ctx, `UPDATE payouts SET status = 'failed' WHERE id = $1`, res.PayoutID); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $2 WHERE id = $1`, res.Request.Account, res.Request.Amount); err != nil {
			return nil, err
		}
		return idem.JSONResponse(http.StatusPaymentRequired, map[string]any{
			"error":  map[string]string{"code": "transfer_declined", "message": reason},
			"payout": payoutJSON{ID: res.PayoutID, payoutRequest: res.Request, Status: "failed"},
		})
	})
}

// bankClient calls the bank's transfer API.
type bankClient struct {
	url  string
	http *http.Client
}

// Bounds of a call to the bank. Each attempt must be answered within bankAttemptTimeout
// (a hung connection is abandoned and retried under the same key); the call as a whole,
// retries included, within bankCallTimeout, which keeps a payout from holding its
// client longer than that: past it the handler answers 503 and the retry, or the
// completer, resumes.
const (
	bankAttemptTimeout = 2 * time.Second
	bankCallTimeout    = 10 * time.Second
)

// newBankClient returns the bank's client: idem's retrying Transport keeps the key and
// the body across its attempts and retries what is safe to retry (a lost reply, a 5xx,
// a 429) with backoff; AttemptTimeout bounds each attempt (http.Client.Timeout would
// bound them all together), MaxWait how long it waits for a bank that refuses
// connections.
func newBankClient(url string) *bankClient {
	return &bankClient{url: url, http: client.NewClient(&client.Transport{
		AttemptTimeout: bankAttemptTimeout,
		MaxWait:        5 * time.Second,
		MaxAttempts:    4,
	})}
}

// transferJSON is the bank's transfer.
type transferJSON struct {
	ID        string `json:"id"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference"`
}

// errBankUnavailable wraps a call to the bank that got no final answer.
var errBankUnavailable = errors.New("bank unavailable")

// declinedError is the bank's final refusal of a transfer (a 4xx).
type declinedError struct{ Reason string }

func (e *declinedError) Error() string { return "the bank declined the transfer: " + e.Reason }

// transfer asks the bank to transfer the reserved funds, under key.
func (b *bankClient) transfer(ctx context.Context, key string, res reservation) (*transferJSON, error) {
	ctx, cancel := context.WithTimeout(ctx, bankCallTimeout)
	defer cancel()
	body, err := json.Marshal(map[string]any{"amount": res.Request.Amount, "currency": res.Request.Currency,
		"destination": res.Request.Destination, "reference": res.PayoutID})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/transfers", strings.NewReader(string(body)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(client.HeaderKey, key)
	resp, err := b.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBankUnavailable, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusCreated:
		var t transferJSON
		if err := json.NewDecoder(resp.Body).Decode(&t); err != nil || t.ID == "" {
			return nil, fmt.Errorf("%w: an unreadable transfer: %v", errBankUnavailable, err)
		}
		return &t, nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500 && resp.StatusCode != http.StatusConflict && resp.StatusCode != http.StatusTooManyRequests:
		// A final refusal (a 409 is the key still in progress there, a 429 a limit:
		// neither is a decline).
		var e struct {
			Error string `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return nil, &declinedError{Reason: e.Error}
	}
	return nil, fmt.Errorf("%w: %s", errBankUnavailable, resp.Status)
}

type errorJSON struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	var e errorJSON
	e.Error.Code, e.Error.Message = code, message
	writeJSON(w, status, e)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type principalKey struct{}

// authenticate stands in for your authentication: every bearer token is a principal,
// known by its SHA-256 so that no token is stored.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			writeError(w, http.StatusUnauthorized, "unauthenticated", "Authorization: Bearer <token> required")
			return
		}
		sum := sha256.Sum256([]byte(token))
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, hex.EncodeToString(sum[:]))))
	})
}

// principal is idem's Scope, the calling principal: one principal's key is never
// replayed to another, and its derived keys are its own.
func principal(r *http.Request) (string, error) {
	p, _ := r.Context().Value(principalKey{}).(string)
	if p == "" {
		return "", errors.New("unauthenticated")
	}
	return p, nil
}
