package processor

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-go/idem"
)

// Scope is the one principal of the processor: it has no authentication, and every
// caller is the same merchant, whose keys share one space (SPEC §3).
const Scope = "merchant"

// Defaults of [Config].
const (
	// DefaultListLimit is how many charges a list returns without ?limit.
	DefaultListLimit = 100
	// MaxListLimit is the largest ?limit.
	MaxListLimit = 1000
	// maxBodyBytes bounds a charge's body: {"amount", "currency"} is tiny.
	maxBodyBytes = 4 << 10
	// maxAmount is the largest amount, as the payments API's.
	maxAmount = 99999999
)

// Config configures a [Server]. DB is required.
type Config struct {
	// DB keeps the charges and, being the idempotency store's database, their
	// idempotency records. Required.
	DB *DB

	// Latency is the time spent on each charge, after its key is claimed and before
	// its transaction, holding no transaction or connection, as a bank's network
	// would take it. Defaults to 0.
	Latency time.Duration

	// FailRate is the share of charge requests answered 503 processor_unavailable
	// before anything is done (not even the key's claim), between 0 and 1. Defaults
	// to 0.
	FailRate float64

	// LostReplyRate is the share of charges whose reply is lost: the charge and the
	// completion of its idempotency record commit, then the connection is dropped
	// without an answer, so that the caller cannot know the charge happened (its
	// retry with the same key is answered the stored 201). Between 0 and 1. Defaults
	// to 0.
	LostReplyRate float64

	// TTL, Lease and StoreTimeout configure the idempotency middleware
	// (idem.Config). Default to idem's defaults.
	TTL, Lease, StoreTimeout time.Duration

	// Logger receives the middleware's and the processor's logs. Defaults to
	// [slog.Default].
	Logger *slog.Logger

	// Now is the clock of the charges' created times. Defaults to [time.Now].
	Now func() time.Time

	// Rand returns a number in [0, 1) for the fail and lost-reply rates. Defaults to
	// math/rand/v2's Float64.
	Rand func() float64
}

// Server is the fake card processor. Build it with [New] and serve [Server.Handler].
type Server struct {
	cfg     Config
	handler http.Handler
}

// New returns the processor on cfg's database. It panics with a "processor: " message
// when cfg is unusable (a programmer's mistake). The database must be migrated
// ([DB.Migrate]), and so must the store.
func New(cfg Config) *Server {
	switch {
	case cfg.DB == nil:
		panic("processor: Config.DB is required")
	case cfg.Latency < 0:
		panic("processor: Config.Latency must not be negative")
	case !(cfg.FailRate >= 0 && cfg.FailRate <= 1):
		panic(fmt.Sprintf("processor: Config.FailRate must be between 0 and 1, got %v", cfg.FailRate))
	case !(cfg.LostReplyRate >= 0 && cfg.LostReplyRate <= 1):
		panic(fmt.Sprintf("processor: Config.LostReplyRate must be between 0 and 1, got %v", cfg.LostReplyRate))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = mrand.Float64
	}
	s := &Server{cfg: cfg}
	mw := idem.New(idem.Config{
		Store:        cfg.DB.Store(),
		Scope:        func(*http.Request) (string, error) { return Scope, nil },
		TTL:          cfg.TTL,
		Lease:        cfg.Lease,
		StoreTimeout: cfg.StoreTimeout,
		Logger:       cfg.Logger,
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/processor/charges", s.failing(mw.Handler(http.HandlerFunc(s.createCharge))))
	mux.HandleFunc("GET /v1/processor/charges", s.listCharges)
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "resource_missing", "Unrecognized request URL ("+r.Method+" "+r.URL.Path+").")
	})
	s.handler = mux
	return s
}

// Handler returns the processor's API.
func (s *Server) Handler() http.Handler { return s.handler }

// charge is a charge the processor made.
type charge struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	IdempotencyKey string `json:"idempotency_key"`
	Created        int64  `json:"created"`
}

// failing answers the share FailRate of requests 503 before next does anything.
func (s *Server) failing(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.FailRate > 0 && s.cfg.Rand() < s.cfg.FailRate {
			writeError(w, http.StatusServiceUnavailable, "processor_unavailable", "The processor is unavailable; retry the request.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// createCharge is POST /v1/processor/charges {"amount", "currency"} → 201.
func (s *Server) createCharge(w http.ResponseWriter, r *http.Request) {
	amount, currency, err := parseCharge(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, "parameter_invalid", err.Error())
		return
	}
	if !s.spend(r.Context()) {
		writeError(w, http.StatusServiceUnavailable, "processor_interrupted", "The charge was interrupted; retry the request.")
		return
	}
	h := idem.FromContext(r.Context())
	c := &charge{ID: newID("pch_"), Object: "processor_charge", Amount: amount, Currency: currency,
		IdempotencyKey: h.Key(), Created: s.cfg.Now().Unix()}
	body, _ := json.Marshal(c)
	wrote := false
	err = s.cfg.DB.insert(r.Context(), c, func() {
		writeJSON(w, http.StatusCreated, body)
		wrote = true
	})
	switch {
	case err != nil && wrote:
		// The commit (or the fenced completion) failed after the reply went into the
		// capture: the middleware answers 503 store_unavailable instead.
		s.cfg.Logger.WarnContext(r.Context(), "processor: the charge's transaction failed", "err", err)
	case err != nil:
		s.cfg.Logger.WarnContext(r.Context(), "processor: the charge's transaction failed", "err", err)
		writeError(w, http.StatusServiceUnavailable, "db_unavailable", "The database is unavailable; retry the request.")
	case s.cfg.LostReplyRate > 0 && s.cfg.Rand() < s.cfg.LostReplyRate:
		// The charge and its record committed; the caller never hears of it. net/http
		// closes the connection without a response, and the middleware, finding the
		// record completed, keeps it.
		panic(http.ErrAbortHandler)
	}
}

// spend waits Latency, or until ctx ends (false).
func (s *Server) spend(ctx context.Context) bool {
	if s.cfg.Latency <= 0 {
		return true
	}
	t := time.NewTimer(s.cfg.Latency)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// parseCharge reads {"amount": positive integer, "currency": three letters}; any other
// member, or a body that is not that object, is refused.
func parseCharge(body io.Reader) (amount int64, currency string, err error) {
	var in struct {
		Amount   json.Number `json:"amount"`
		Currency string      `json:"currency"`
	}
	dec := json.NewDecoder(io.LimitReader(body, maxBodyBytes))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return 0, "", fmt.Errorf("the body must be a JSON object {\"amount\", \"currency\"}: %v", err)
	}
	amount, convErr := strconv.ParseInt(string(in.Amount), 10, 64)
	if convErr != nil || amount < 1 || amount > maxAmount {
		return 0, "", fmt.Errorf("amount must be an integer between 1 and %d", maxAmount)
	}
	if len(in.Currency) != 3 || !letters(in.Currency) {
		return 0, "", errors.New("currency must be a three-letter ISO currency code")
	}
	return amount, in.Currency, nil
}

func letters(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

type listJSON struct {
	Object  string   `json:"object"`
	Data    []charge `json:"data"`
	HasMore bool     `json:"has_more"`
	URL     string   `json:"url"`
}

// listCharges is GET /v1/processor/charges?limit=N&starting_after=ID: every charge,
// newest first.
func (s *Server) listCharges(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := DefaultListLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxListLimit {
			writeError(w, http.StatusBadRequest, "parameter_invalid", fmt.Sprintf("limit must be an integer between 1 and %d", MaxListLimit))
			return
		}
		limit = n
	}
	data, err := s.cfg.DB.list(r.Context(), q.Get("starting_after"), limit+1)
	switch {
	case errors.Is(err, errNoCharge):
		writeError(w, http.StatusBadRequest, "resource_missing", "No such charge: '"+q.Get("starting_after")+"'")
		return
	case err != nil:
		s.cfg.Logger.WarnContext(r.Context(), "processor: listing charges", "err", err)
		writeError(w, http.StatusServiceUnavailable, "db_unavailable", "The database is unavailable; retry the request.")
		return
	}
	out := listJSON{Object: "list", Data: data, URL: "/v1/processor/charges"}
	if out.Data == nil {
		out.Data = []charge{}
	}
	for i := range out.Data {
		out.Data[i].Object = "processor_charge"
	}
	if len(out.Data) > limit {
		out.Data, out.HasMore = out.Data[:limit], true
	}
	b, _ := json.Marshal(out)
	writeJSON(w, http.StatusOK, b)
}

// healthz answers 200 when the database answers, 503 otherwise.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.cfg.DB.Store().Ping(ctx); err != nil {
		s.cfg.Logger.WarnContext(ctx, "processor healthz: ping failed", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, []byte(`{"status":"unavailable"}`))
		return
	}
	writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
}

// writeError writes an error in Stripe's shape.
func writeError(w http.ResponseWriter, status int, code, message string) {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "api_error"
	}
	b, _ := json.Marshal(map[string]map[string]string{"error": {"type": typ, "code": code, "message": message}})
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// newID returns prefix followed by 26 random base-32 characters (130 bits).
func newID(prefix string) string { return prefix + rand.Text() }
