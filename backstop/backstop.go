package backstop

import (
	"context"
	"database/sql"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// Dialect is the SQL of the database that keeps the backstop's table.
type Dialect int

const (
	// Postgres is PostgreSQL, through pgx's database/sql driver
	// (github.com/jackc/pgx/v5/stdlib).
	Postgres Dialect = iota + 1
	// SQLite is SQLite, through modernc.org/sqlite.
	SQLite
)

// String returns "postgres" or "sqlite".
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Defaults of [Config] and of the cleanup.
const (
	// DefaultTable names the backstop's table.
	DefaultTable = "idem_backstop"
	// cleanEvery is how many new rows InTx inserts between two cleanups, and
	// cleanBatch how many expired rows a cleanup deletes at most: as many as were
	// inserted, so that the deletes keep pace with the expiries.
	cleanEvery, cleanBatch = 100, 100
	// cleanTimeout bounds a cleanup.
	cleanTimeout = 5 * time.Second
)

// Config configures a [Backstop].
type Config struct {
	// Dialect is the database's SQL: [Postgres] or [SQLite]. Required.
	Dialect Dialect

	// Table names the table, a plain SQL identifier (letters, digits and '_'); on
	// PostgreSQL it lives in the connection's search_path. Defaults to [DefaultTable].
	Table string

	// Profile is the shape of the key_reused error InTx answers for a request that
	// reuses a key with other parameters; it should be the middleware's. Defaults to
	// idem.ProfileSeed.
	Profile idem.Profile

	// Logger receives the failures of the background cleanup (debug: the next one
	// retries). Keys are never logged. Defaults to slog.Default.
	Logger *slog.Logger

	// Clock, when set, replaces the host's clock, which decides the rows' expiry
	// (tests only). Defaults to nil: time.Now.
	Clock func() time.Time
}

// Backstop keeps the outcome of every key in the application's database (see the
// package documentation). It is safe for concurrent use.
type Backstop struct {
	db      *sql.DB
	dialect Dialect
	profile idem.Profile
	logger  *slog.Logger
	now     func() time.Time
	table   string
	q       queries
	// inserted counts new rows, so that every cleanEvery-th one cleans.
	inserted atomic.Uint64
}

// queries is the backstop's SQL for one dialect and table.
type queries struct {
	lock, createTable, createIndex, claim, get, complete, delete, deleteExpired string
}

//go:embed queries
var queryFS embed.FS

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// New returns a backstop whose table lives in db. It does not touch the database;
// call [Backstop.Migrate] to create the table.
func New(db *sql.DB, cfg Config) (*Backstop, error) {
	if db == nil {
		return nil, errors.New("backstop: New: db is nil")
	}
	if cfg.Dialect != Postgres && cfg.Dialect != SQLite {
		return nil, fmt.Errorf("backstop: Config.Dialect must be Postgres or SQLite, got %v", cfg.Dialect)
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if !identifier.MatchString(cfg.Table) {
		return nil, fmt.Errorf("backstop: Config.Table %q is not a plain SQL identifier (letters, digits and '_')", cfg.Table)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	q, err := loadQueries(cfg.Dialect, cfg.Table)
	if err != nil {
		return nil, err
	}
	return &Backstop{db: db, dialect: cfg.Dialect, profile: cfg.Profile, logger: cfg.Logger, now: cfg.Clock, table: cfg.Table, q: q}, nil
}

func loadQueries(d Dialect, table string) (queries, error) {
	var err error
	read := func(name string) string {
		b, rerr := queryFS.ReadFile("queries/" + d.String() + "/" + name + ".sql")
		if rerr != nil {
			err = rerr
			return ""
		}
		return strings.NewReplacer("{{table}}", `"`+table+`"`, "{{index}}", `"`+table+`_expires_at"`).Replace(string(b))
	}
	q := queries{
		lock: read("lock"), createTable: read("create_table"), createIndex: read("create_index"),
		claim: read("claim"), get: read("get"), complete: read("complete"), delete: read("delete"),
		deleteExpired: read("delete_expired"),
	}
	return q, err
}

// Migrate creates the table and its index when they do not exist. It is safe to call
// on every start, from several processes at once.
func (b *Backstop) Migrate(ctx context.Context) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("backstop: migrate: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	for _, q := range []string{b.q.lock, b.q.createTable, b.q.createIndex} {
		var args []any
		if q == b.q.lock {
			args = []any{b.table}
		}
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("backstop: migrate: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("backstop: migrate: %w", err)
	}
	return nil
}

// InTx runs fn, the operation's writes, in one transaction of the backstop's database
// that also keeps the key's outcome, and answers r on w when the key's operation
// committed before. fn writes the operation's response to w, inside the transaction,
// as with the SQL stores' §7 helpers.
//
// When r's context carries an [idem.Handle] (the request came through the idem
// middleware with a key), InTx first inserts the key's row, then runs fn, then keeps the
// response fn wrote in that row (or deletes the row when the response releases the key,
// SPEC §6), and commits. When the row is already there, live, InTx runs nothing and
// answers the request itself: the response the row keeps (the same status, headers and
// body, with Idempotent-Replayed: true), 409 key_reused when the request differs from
// the one that made it, or 409 response_not_stored when that response was streamed. The
// middleware then stores that answer as the key's record, as it stores every response.
//
// InTx returns nil when the request is answered (by fn, or by InTx itself). It returns
// fn's error when fn fails (the transaction rolls back; the handler answers), and the
// database's error when the transaction cannot begin, insert the row or commit; a failed
// COMMIT is also reported to the handle, so that the middleware answers 503
// store_unavailable rather than a response whose writes did not commit. A panic in fn
// rolls back and is re-raised. A request whose context carries no Handle gets
// [idem.ErrNoHandle], unless it is marked by [idem.WithoutKey] (the middleware marks the
// requests it lets through without a key): a plain transaction.
func (b *Backstop) InTx(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, tx *sql.Tx) error) error {
	ctx := r.Context()
	h, err := idem.TxHandle(ctx)
	if err != nil {
		b.logger.ErrorContext(ctx, "backstop: refused a request without the request's idem.Handle", slog.Any("error", err))
		return err
	}
	if h != nil {
		// On a ClaimInHandler route of a SQL store, the key is claimed first, under a
		// lease, as the stores' own lease helpers do; when the claim does not acquire it
		// the middleware answers, and nothing runs.
		if err := h.AcquireForTx(ctx); err != nil {
			if errors.Is(err, idem.ErrAnswered) {
				return nil
			}
			return err
		}
	}
	var opts *sql.TxOptions
	if b.dialect == Postgres {
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := b.db.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("backstop: %w", err)
	}
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback()
			panic(p)
		}
	}()
	if h != nil {
		inserted, err := b.claim(ctx, tx, h)
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		if !inserted {
			row, err := b.get(ctx, tx, h)
			_ = tx.Rollback()
			if err != nil {
				return err
			}
			b.answer(w, r, h, row)
			return nil
		}
	}
	if err := fn(ctx, tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if h == nil {
		return commit(tx)
	}
	if err := b.keep(ctx, tx, h); err != nil {
		_ = tx.Rollback()
		h.CompletionFailed(err)
		return err
	}
	if err := commit(tx); err != nil {
		h.CompletionFailed(err)
		return err
	}
	b.maybeClean()
	return nil
}

// Respond is InTx for a handler that returns its response instead of writing it, as
// the SQL stores' Respond: fn runs the operation's writes on tx and returns the
// response; Respond keeps it in the key's row, commits, and the request is answered with
// it, or with what the key's row calls for (the kept response, key_reused). It returns
// an error only when fn failed: nothing committed and nothing was sent, and the handler
// answers. When the database fails, the request is answered 503 store_unavailable
// (which frees the key) and Respond returns nil. A write after Respond answered is
// refused. A request marked by [idem.WithoutKey] gets a plain transaction, its response
// written after COMMIT (a failed COMMIT is then returned).
func (b *Backstop) Respond(w http.ResponseWriter, r *http.Request, fn func(ctx context.Context, tx *sql.Tx) (*idem.Response, error)) error {
	h, err := idem.TxHandle(r.Context())
	if err != nil {
		b.logger.ErrorContext(r.Context(), "backstop: refused a request without the request's idem.Handle", slog.Any("error", err))
		return err
	}
	var (
		resp         *idem.Response
		fnErr, wrote bool
	)
	err = b.InTx(w, r, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		if resp, err = fn(ctx, tx); err != nil {
			fnErr = true
			return err
		}
		if resp == nil {
			fnErr = true
			return errors.New("backstop: Respond's function returned a nil response")
		}
		if h != nil {
			// Into the middleware's capture, inside the transaction: the row keeps it.
			writeResponse(w, resp)
			wrote = true
		}
		return nil
	})
	switch {
	case err == nil && h == nil:
		writeResponse(w, resp) // after COMMIT
		return nil
	case err == nil, fnErr, h == nil:
		return err
	}
	// The database failed. Once the response was written, InTx told the handle, and the
	// middleware answers 503 in its place; before, nothing was written.
	b.logger.WarnContext(r.Context(), "backstop: the transaction failed; answering 503", slog.Any("error", err))
	if !wrote {
		idem.WriteError(w, r, b.profile, idem.CodeStoreUnavailable, "")
	}
	return nil
}

// writeResponse writes resp to w: its headers, status and body.
func writeResponse(w http.ResponseWriter, resp *idem.Response) {
	for name, values := range resp.Header {
		w.Header()[name] = values
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

func commit(tx *sql.Tx) error {
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("backstop: commit: %w", err)
	}
	return nil
}

// claim inserts the key's row, or takes over an expired one, and reports whether it
// did; false means a live row is there.
func (b *Backstop) claim(ctx context.Context, tx *sql.Tx, h *idem.Handle) (bool, error) {
	now := b.now()
	res, err := tx.ExecContext(ctx, b.q.claim, []byte(h.Scope()), []byte(h.Key()), formatFingerprint(h.Fingerprint()),
		now.UnixMilli(), now.Add(h.TTL()).UnixMilli())
	if err != nil {
		return false, fmt.Errorf("backstop: inserting the key's row: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("backstop: inserting the key's row: %w", err)
	}
	return n > 0, nil
}

// row is what the table keeps of a key.
type row struct {
	fingerprint string
	status      sql.NullInt64
	header      []byte
	body        []byte
	notStored   bool
}

func (b *Backstop) get(ctx context.Context, tx *sql.Tx, h *idem.Handle) (*row, error) {
	var rw row
	err := tx.QueryRowContext(ctx, b.q.get, []byte(h.Scope()), []byte(h.Key())).
		Scan(&rw.fingerprint, &rw.status, &rw.header, &rw.body, &rw.notStored)
	if err != nil {
		return nil, fmt.Errorf("backstop: reading the key's row: %w", err)
	}
	return &rw, nil
}

// keep stores the response fn wrote in the key's row, or deletes the row when the
// response releases the key (SPEC §6).
func (b *Backstop) keep(ctx context.Context, tx *sql.Tx, h *idem.Handle) error {
	p, err := h.PrepareCompletion()
	if err != nil {
		return err
	}
	if p == nil {
		if _, err := tx.ExecContext(ctx, b.q.delete, []byte(h.Scope()), []byte(h.Key())); err != nil {
			return fmt.Errorf("backstop: deleting the released key's row: %w", err)
		}
		return nil
	}
	resp := p.Response
	header, err := json.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("backstop: encoding the response's headers: %w", err)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	_, err = tx.ExecContext(ctx, b.q.complete, []byte(h.Scope()), []byte(h.Key()), resp.Status, header, body, resp.NotStored)
	if err != nil {
		return fmt.Errorf("backstop: keeping the response: %w", err)
	}
	return nil
}

// answer answers a request whose key's row is live: the kept response, or an error.
func (b *Backstop) answer(w http.ResponseWriter, r *http.Request, h *idem.Handle, rw *row) {
	fp, ok := parseFingerprint(rw.fingerprint)
	switch {
	case !ok || !h.FingerprintMatches(fp):
		idem.WriteError(w, r, b.profile, idem.CodeKeyReused, "")
	case !rw.status.Valid:
		// Not reachable: the row and its response commit together.
		idem.WriteError(w, r, b.profile, idem.CodeRequestInProgress, "")
	case rw.notStored:
		idem.WriteError(w, r, b.profile, idem.CodeResponseNotStored, "")
	default:
		var header http.Header
		if err := json.Unmarshal(rw.header, &header); err != nil {
			b.logger.WarnContext(r.Context(), "backstop: a kept response's headers do not decode; answering without them", slog.Any("error", err))
		}
		// Under a keyring (idem.Config.Seal) the row keeps the response sealed, as the
		// record does (SPEC §19).
		resp, err := h.OpenStored(r.Context(), &idem.Response{Status: int(rw.status.Int64), Header: header, Body: rw.body})
		switch {
		case errors.Is(err, idem.ErrRecordUnreadable):
			b.logger.ErrorContext(r.Context(), "backstop: a kept response cannot be opened; answering record_unreadable", slog.Any("error", err))
			idem.WriteError(w, r, b.profile, idem.CodeRecordUnreadable, "")
			return
		case err != nil:
			b.logger.WarnContext(r.Context(), "backstop: opening a kept response failed; answering 503", slog.Any("error", err))
			idem.WriteError(w, r, b.profile, idem.CodeStoreUnavailable, "")
			return
		}
		for name, values := range resp.Header {
			w.Header()[name] = values
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(resp.Status)
		_, _ = w.Write(resp.Body)
	}
}

// maybeClean deletes a batch of expired rows after every cleanEvery-th new row.
func (b *Backstop) maybeClean() {
	if b.inserted.Add(1)%cleanEvery != 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanTimeout)
	defer cancel()
	if _, err := b.DeleteExpired(ctx, cleanBatch); err != nil {
		b.logger.DebugContext(ctx, "backstop: deleting expired rows failed; the next cleanup retries", slog.Any("error", err))
	}
}

// DeleteExpired deletes at most limit rows whose key expired, oldest first, and returns
// how many it deleted. InTx already deletes a batch after every hundredth new row; call
// DeleteExpired from a job of your own to catch up after a burst.
func (b *Backstop) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("backstop: DeleteExpired: limit must be positive, got %d", limit)
	}
	res, err := b.db.ExecContext(ctx, b.q.deleteExpired, b.now().UnixMilli(), limit)
	if err != nil {
		return 0, fmt.Errorf("backstop: deleting expired rows: %w", err)
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// formatFingerprint is "v<version>:<hex sum>".
func formatFingerprint(fp idem.Fingerprint) string {
	return fmt.Sprintf("v%d:%x", fp.Version, fp.Sum)
}

func parseFingerprint(s string) (idem.Fingerprint, bool) {
	var fp idem.Fingerprint
	v, sum, ok := strings.Cut(s, ":")
	if !ok {
		return fp, false
	}
	if _, err := fmt.Sscanf(v, "v%d", &fp.Version); err != nil {
		return fp, false
	}
	b, err := hex.DecodeString(sum)
	if err != nil || len(b) != len(fp.Sum) {
		return fp, false
	}
	copy(fp.Sum[:], b)
	return fp, true
}
