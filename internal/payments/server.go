package payments

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/observe"
	"github.com/idem-go/idem/seal"
	"github.com/idem-go/idem/store/postgres"
)

// Defaults of [Config].
const (
	// DefaultMaxBodyBytes bounds a request body the API reads.
	DefaultMaxBodyBytes = 1 << 20
	// DefaultHealthTimeout bounds the pings of GET /healthz.
	DefaultHealthTimeout = 2 * time.Second
)

// Config configures a [Server]. DB is required; so is Store unless
// DisableIdempotency is set.
type Config struct {
	// Store keeps the idempotency records. Required unless DisableIdempotency.
	Store idemstore.Store

	// DB keeps charges and orders. When it shares the store's database (built with
	// the store's InTx helper), every mutation commits its rows and the idempotency
	// record in one transaction (SPEC §7). Required.
	DB *DB

	// Profile is the shape of the middleware's error bodies (SPEC §9); the API's own
	// errors always have Stripe's shape. Defaults to [idem.ProfileSeed].
	Profile idem.Profile

	// TTL is how long an idempotency record lives; after it a key may start a new
	// operation, and the objects it wrote stop answering for it. Keep it equal to the
	// middleware's TTL when passing Middleware. Defaults to [idem.DefaultTTL].
	TTL time.Duration

	// Lease is how long a claim holds its key before another request may take it
	// over. Defaults to [idem.DefaultLease].
	Lease time.Duration

	// ProcessorLatency is slept by POST /v1/charges after the key is claimed and before
	// the charge's transaction, holding no transaction or connection, as a call to a
	// card processor would. Defaults to 0.
	ProcessorLatency time.Duration

	// ProcessorURL, when set, is the base URL of the card processor (`idem processor`)
	// that POST /v1/charges charges through, with recovery points (SPEC §13): the
	// charge is recorded pending, charged at the processor under a key derived from
	// its idempotency record, then settled; the charge object carries its
	// processor_charge_id. DB must run steps ([DB.RunsSteps]). ProcessorLatency is
	// then unused. Defaults to "": no processor.
	ProcessorURL string

	// ChargeOnLapse is what a charge does that finds its key's holder died (SPEC
	// §5.3): take the key over and charge (idem.LapseTakeOver), or, for a card
	// processor that cannot deduplicate a charge, answer 500 outcome_unknown until an
	// operator resolves the key (idem.LapseUnknown, `idem keys resolve`). It is for
	// charges without a processor: through one (ProcessorURL) a lapsed charge is
	// resumed under its derived key, and New panics on LapseUnknown. Defaults to
	// idem.LapseTakeOver.
	ChargeOnLapse idem.LapsePolicy

	// ProcessorClient sends the calls to the processor. It must retry what may go
	// away on another attempt and bound each attempt: idem payments builds it on the
	// client package's Transport (budget, backoff, Retry-After) over an
	// http.Transport with a ResponseHeaderTimeout. The request's context (the lease)
	// bounds each call. Required with ProcessorURL.
	ProcessorClient *http.Client

	// DisableIdempotency serves the same handlers without the idempotency middleware
	// (to measure what it costs): Idempotency-Key headers are ignored and every
	// mutation runs in a plain transaction. Defaults to false.
	DisableIdempotency bool

	// Logger receives the middleware's logs and the API's request logs (debug level).
	// Defaults to [slog.Default].
	Logger *slog.Logger

	// Now is the clock of the objects' created and updated times. Defaults to
	// [time.Now].
	Now func() time.Time

	// ReplayCacheSize is how many completed responses the middleware keeps in memory
	// so that replays skip the store (idem.Config.ReplayCacheSize). Defaults to 0
	// (off).
	ReplayCacheSize int

	// StoreTimeout bounds each store call the middleware makes before the handler
	// runs (idem.Config.StoreTimeout). Defaults to [idem.DefaultStoreTimeout].
	StoreTimeout time.Duration

	// DBReadTimeout bounds each read of the database outside a keyed request (GET
	// /v1/charges, GET /v1/charges/{id}, GET /v1/orders/{id}): a database that does
	// not answer in time gets 503 db_unavailable, not a hang. It also bounds the
	// deletion of expired order keys. Defaults to [idem.DefaultStoreTimeout].
	DBReadTimeout time.Duration

	// Observer is told what the idempotency middleware does (idem.Config.Observer),
	// such as an idemprom.Metrics' observer. Defaults to nil (none).
	Observer *observe.Observer

	// Seal, when set, seals the idempotency records (idem.Config.Seal, SPEC §19) and
	// keys their scope: the keyring's HMAC of the principal's hex SHA-256. A charge
	// keeps its record's scope and fingerprint (keyed while the store's sealing is in
	// effect), and is found under either form of the principal's scope; the orders keep
	// the plain one. Give it also with Middleware. Defaults to nil: records in clear.
	Seal *seal.Keyring
	// SealingOff lets the API serve, without Seal, a store whose sealing began:
	// sealing is being turned off (idem.Config.SealingOff, SPEC §20). Defaults to
	// false.
	SealingOff bool

	// Middleware, when set, is used instead of building one from the fields above:
	// tests pass an idem.Config of their own (an injected clock, say) through it.
	// Defaults to idem.New with Store, Profile, TTL, Lease, Logger, ReplayCacheSize,
	// StoreTimeout, Observer and Seal.
	Middleware *idem.Middleware
}

// Server is the reference payments API of SPEC §11. Build it with [New] and serve
// [Server.Handler].
type Server struct {
	cfg     Config
	db      *DB
	logger  *slog.Logger
	now     func() time.Time
	ttl     time.Duration
	handler http.Handler
	api     *http.ServeMux
	root    *http.ServeMux
	// beforeCharge, when set by a test, runs where the card processor is called.
	beforeCharge func(r *http.Request)
	// processor calls the card processor; nil without Config.ProcessorURL.
	processor *processorClient
	// orderKeysWritten counts keyed order writes, so that every cleanEvery-th one
	// deletes a batch of expired order keys (orderKeyWritten).
	orderKeysWritten atomic.Int64
	cleanEvery       int64
	// mw is the idempotency middleware; nil with DisableIdempotency.
	mw *idem.Middleware
}

// New returns the payments API on cfg's store and database. It panics with a
// "payments: " message when cfg is unusable (a programmer's mistake). The database must
// be migrated ([DB.Migrate]) and so must the store.
//
//	st, _ := sqlite.Open(ctx, "idem.db", sqlite.Config{})
//	_ = st.Migrate(ctx)
//	db := payments.NewSQLiteStoreDB(st)
//	_, _ = db.Migrate(ctx)
//	srv := payments.New(payments.Config{Store: st, DB: db})
//	http.ListenAndServe(":8080", srv.Handler())
func New(cfg Config) *Server {
	if cfg.DB == nil {
		panic("payments: Config.DB is required")
	}
	if cfg.Store == nil && !cfg.DisableIdempotency {
		panic("payments: Config.Store is required unless DisableIdempotency is set")
	}
	if cfg.ProcessorLatency < 0 {
		panic("payments: Config.ProcessorLatency must not be negative")
	}
	if cfg.ProcessorURL != "" && cfg.ProcessorClient == nil {
		panic("payments: Config.ProcessorClient is required with Config.ProcessorURL")
	}
	if cfg.ProcessorURL != "" && cfg.ChargeOnLapse != idem.LapseTakeOver {
		panic("payments: Config.ChargeOnLapse is for charges without a processor: through one, a lapsed charge resumes (SPEC §13)")
	}
	if cfg.ProcessorURL != "" && !cfg.DisableIdempotency && !cfg.DB.RunsSteps() {
		panic("payments: Config.ProcessorURL needs a DB on the idempotency store's own database, built with NewSQLiteStoreDB or NewPostgresStoreDB (its steps commit with the record's recovery point, SPEC §13)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TTL == 0 {
		cfg.TTL = idem.DefaultTTL
	}
	if cfg.DBReadTimeout < 0 {
		panic("payments: Config.DBReadTimeout must not be negative")
	}
	if cfg.DBReadTimeout == 0 {
		cfg.DBReadTimeout = idem.DefaultStoreTimeout
	}
	s := &Server{cfg: cfg, db: cfg.DB, logger: cfg.Logger, now: cfg.Now, ttl: cfg.TTL, cleanEvery: orderKeysCleanEvery}
	if cfg.DisableIdempotency {
		s.db = cfg.DB.withoutRecords()
	}
	if cfg.ProcessorURL != "" {
		s.processor = newProcessorClient(cfg.ProcessorURL, cfg.ProcessorClient)
	}
	s.routes()
	return s
}

// Handler returns the API: GET /healthz without authentication, and /v1/… behind
// bearer authentication and (unless disabled) the idempotency middleware.
func (s *Server) Handler() http.Handler { return s.handler }

// Guard returns the guard of the API's idempotency middleware, for a Completer
// (idem.NewCompleter) that finishes, in the background, charges whose holder died, or
// answered 503, after recording them pending (SPEC §13); nil with DisableIdempotency.
func (s *Server) Guard() *idem.Guard {
	if s.mw == nil {
		return nil
	}
	return s.mw.Guard()
}

// Pattern returns the route pattern that serves r (such as "POST /v1/charges"), or ""
// when none does; metrics label requests with it.
func (s *Server) Pattern(r *http.Request) string {
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		_, p := s.api.Handler(r)
		return p
	}
	_, p := s.root.Handler(r)
	return p
}

func (s *Server) routes() {
	// Every route is wrapped by the idempotency middleware, inside the mux, so that
	// POST /v1/orders, whose writes all go to the store's database, can claim its key
	// in its own transaction through the store's Respond (one round trip for the whole
	// request on PostgreSQL, RouteOptions.ClaimInHandler). POST /v1/charges calls the
	// card processor between its claim and its writes: the lease path.
	wrap := func(h http.HandlerFunc) http.Handler { return h }
	claiming := wrap
	if !s.cfg.DisableIdempotency {
		mw := s.cfg.Middleware
		if mw == nil {
			mw = idem.New(idem.Config{
				Store: s.cfg.Store,
				Scope: scopeOf,
				// Under a keyring the records' scope is keyed (SPEC §19) once the
				// store's sealing is in effect: the hex SHA-256 of a guessable token
				// could be recomputed. The charges keep their record's scope.
				KeyScope: true,
				Profile:  s.cfg.Profile,
				TTL:      s.cfg.TTL,
				Lease:    s.cfg.Lease,
				Logger:   s.logger,

				ReplayCacheSize: s.cfg.ReplayCacheSize,
				StoreTimeout:    s.cfg.StoreTimeout,
				Observer:        s.cfg.Observer,
				Seal:            s.cfg.Seal,
				SealingOff:      s.cfg.SealingOff,
			})
		}
		s.mw = mw
		wrap = func(h http.HandlerFunc) http.Handler { return mw.Handler(h) }
		claiming = wrap
		if s.db.pgStore != nil || s.db.sqliteStore != nil { // the store's Respond
			inTx := mw.Route(idem.RouteOptions{ClaimInHandler: true})
			claiming = func(h http.HandlerFunc) http.Handler { return inTx(h) }
		}
	}
	charges := wrap
	if s.mw != nil {
		// The charge's operation is named in its record; through a processor its
		// resume function is registered for the completer (SPEC §13).
		opts := idem.RouteOptions{Name: chargeOperation, OnLapse: s.cfg.ChargeOnLapse}
		if s.processor != nil {
			opts.Resume = s.resumeCharge
		}
		route := s.mw.Route(opts)
		charges = func(h http.HandlerFunc) http.Handler { return route(h) }
	}
	api := http.NewServeMux()
	api.Handle("POST /v1/charges", charges(s.createCharge))
	api.Handle("GET /v1/charges", wrap(s.listCharges))
	api.Handle("GET /v1/charges/{id}", wrap(s.getCharge))
	api.Handle("POST /v1/orders", claiming(s.createOrder))
	api.Handle("GET /v1/orders/{id}", wrap(s.getOrder))
	api.Handle("PUT /v1/orders/{id}", wrap(s.putOrder))
	api.Handle("DELETE /v1/orders/{id}", wrap(s.deleteOrder))
	api.Handle("/v1/", wrap(s.notFound))
	s.api = api
	var v1 http.Handler = api

	root := http.NewServeMux()
	root.HandleFunc("GET /healthz", s.healthz)
	root.Handle("/v1/", s.authenticate(v1))
	root.HandleFunc("/", s.notFound)
	s.root = root
	s.handler = s.logRequests(root)
}

// healthz answers 200 when the store and the database answer, 503 otherwise. On a
// PostgreSQL store its 200 says what a failover of the store's database may lose
// (postgres.Store.Replication): {"status":"ok","store":{"replication":…}}.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), DefaultHealthTimeout)
	defer cancel()
	status, body := http.StatusOK, `{"status":"ok"}`
	if s.cfg.Store != nil {
		if err := s.cfg.Store.Ping(ctx); err != nil {
			s.logger.WarnContext(ctx, "healthz: store ping failed", "err", err)
			status, body = http.StatusServiceUnavailable, `{"status":"unavailable","failing":"store"}`
		}
	}
	if status == http.StatusOK {
		if err := s.db.Ping(ctx); err != nil {
			s.logger.WarnContext(ctx, "healthz: db ping failed", "err", err)
			status, body = http.StatusServiceUnavailable, `{"status":"unavailable","failing":"db"}`
		}
	}
	if pg, ok := s.cfg.Store.(*postgres.Store); ok && status == http.StatusOK {
		if detail := replicationDetail(ctx, pg); detail != "" {
			body = `{"status":"ok","store":` + detail + `}`
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body + "\n"))
}

// replicationDetail is the JSON object of /healthz that says what a failover of the
// store's database may lose, or "" when it could not be read (the store answered the
// ping: the health stands).
func replicationDetail(ctx context.Context, pg *postgres.Store) string {
	r, err := pg.Replication(ctx)
	if err != nil {
		return ""
	}
	b, err := json.Marshal(struct {
		Replication         string `json:"replication"`
		Standbys            int    `json:"standbys"`
		SynchronousStandbys int    `json:"synchronous_standbys"`
		SynchronousCommit   string `json:"synchronous_commit"`
		Pooler              bool   `json:"pooler"`
	}{r.Mode, r.Standbys, r.SynchronousStandbys, r.SynchronousCommit, r.Pooler})
	if err != nil {
		return ""
	}
	return string(b)
}

// readCtx is the context of a read outside a keyed request: r's, ending after
// Config.DBReadTimeout.
func (s *Server) readCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.cfg.DBReadTimeout)
}

// Cleanup of order_keys: a keyed order write inserts a row, and every
// orderKeysCleanEvery-th one deletes at most orderKeysCleanBatch rows whose key
// expired, so that the table holds about a TTL's worth of keys.
const (
	orderKeysCleanEvery = 100
	orderKeysCleanBatch = 100
)

// orderKeyWritten counts a keyed order write, and after every cleanEvery-th deletes
// a batch of order keys that expired, within Config.DBReadTimeout. A failure is logged
// at debug level: the next cleanup deletes what this one did not.
func (s *Server) orderKeyWritten(ctx context.Context) {
	if s.orderKeysWritten.Add(1)%s.cleanEvery != 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.DBReadTimeout)
	defer cancel()
	if _, err := s.db.DeleteExpiredOrderKeys(ctx, s.now(), orderKeysCleanBatch); err != nil {
		s.logger.DebugContext(ctx, "payments: deleting expired order keys failed; the next cleanup retries", "err", err)
	}
}

func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	writeAPIError(w, &apiError{status: http.StatusNotFound, code: "resource_missing", message: "Unrecognized request URL (" + r.Method + " " + r.URL.Path + ")."})
}

// logRequests logs every request at debug level: method, route, status, duration.
// Never the key, a header value or a body.
func (s *Server) logRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.logger.Enabled(r.Context(), slog.LevelDebug) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		s.logger.DebugContext(r.Context(), "request",
			"method", r.Method, "route", s.Pattern(r), "status", sw.status,
			"replayed", sw.Header().Get("Idempotent-Replayed") == "true",
			"duration", time.Since(start))
	})
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
