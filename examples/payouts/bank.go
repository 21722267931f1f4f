package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// fakeBank is a bank's transfer API as this example talks to it: POST /v1/transfers
// with an Idempotency-Key makes a transfer once per key and answers every repeat of the
// key with that transfer (another body under the key gets 422, as a real API's
// idempotency error); it declines a destination that begins with "XX" (422, final);
// and it loses a share of its replies after the transfer was made (the connection
// closes unanswered), as a network does. It keeps its transfers in memory: run it
// beside the payouts server, not in a process you kill.
type fakeBank struct {
	drop    float64       // the share of replies lost
	latency time.Duration // how long a transfer takes, at most (uniformly random)

	mu        sync.Mutex
	byKey     map[string]*bankEntry
	transfers []transferJSON

	// Counters, for the crash test: requests received, repeats of a key answered from
	// memory, replies lost, and requests being served now.
	requests, repeats, dropped, inFlight atomic.Int64

	srv *http.Server
	url string
}

// bankEntry is what the bank remembers of a key: the request's body and its answer.
type bankEntry struct {
	body   []byte
	status int
	reply  []byte
}

func newFakeBank(drop float64, latency time.Duration) *fakeBank {
	return &fakeBank{drop: drop, latency: latency, byKey: map[string]*bankEntry{}}
}

// startFakeBank serves a new fake bank on addr.
func startFakeBank(addr string, drop float64) (*fakeBank, error) {
	b := newFakeBank(drop, 50*time.Millisecond)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 10 * time.Second}
	b.url = "http://" + ln.Addr().String()
	go func() { _ = b.srv.Serve(ln) }()
	return b, nil
}

func (b *fakeBank) close() { _ = b.srv.Close() }

func (b *fakeBank) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.requests.Add(1)
	b.inFlight.Add(1)
	defer b.inFlight.Add(-1)
	if r.Method != http.MethodPost || r.URL.Path != "/v1/transfers" {
		http.NotFound(w, r)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(r.Body)
	if err != nil || key == "" {
		bankReply(w, http.StatusBadRequest, `{"error":"an Idempotency-Key and a body are required"}`)
		return
	}
	if b.latency > 0 {
		time.Sleep(mrand.N(b.latency)) // the transfer's work
	}
	status, reply := b.execute(key, body)
	if mrand.Float64() < b.drop {
		// The transfer is made, its reply lost: the connection closes unanswered.
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			b.dropped.Add(1)
			_ = conn.Close()
			return
		}
	}
	bankReply(w, status, string(reply))
}

// execute makes the transfer of key, once, and returns its answer.
func (b *fakeBank) execute(key string, body []byte) (int, []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.byKey[key]; ok {
		b.repeats.Add(1)
		if !bytes.Equal(e.body, body) {
			return http.StatusUnprocessableEntity, []byte(`{"error":"the Idempotency-Key was used with another request"}`)
		}
		return e.status, e.reply
	}
	var in struct {
		Amount      int64  `json:"amount"`
		Currency    string `json:"currency"`
		Destination string `json:"destination"`
		Reference   string `json:"reference"`
	}
	e := &bankEntry{body: body, status: http.StatusUnprocessableEntity}
	switch err := json.Unmarshal(body, &in); {
	case err != nil || in.Amount <= 0:
		e.reply = []byte(`{"error":"a transfer needs an amount"}`)
	case strings.HasPrefix(in.Destination, "XX"):
		e.reply = []byte(`{"error":"the destination account does not exist"}`)
	default:
		t := transferJSON{ID: "tr_" + rand.Text(), Amount: in.Amount, Currency: in.Currency, Reference: in.Reference}
		b.transfers = append(b.transfers, t)
		e.status, e.reply = http.StatusCreated, must(json.Marshal(t))
	}
	b.byKey[key] = e
	return e.status, e.reply
}

// madeTransfers returns the transfers the bank made, one per key.
func (b *fakeBank) madeTransfers() []transferJSON {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]transferJSON(nil), b.transfers...)
}

func bankReply(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(errors.Join(errors.New("fake bank"), err))
	}
	return b
}
