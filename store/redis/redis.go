package redis

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem/idemstore"
	goredis "github.com/redis/go-redis/v9"
)

// Defaults of [Config].
const (
	// DefaultKeyPrefix is the default Config.KeyPrefix.
	DefaultKeyPrefix = "idem:"
	// DefaultTTLMargin is the default Config.TTLMargin.
	DefaultTTLMargin = time.Minute
	// DefaultWaitTimeout is the default Config.WaitTimeout.
	DefaultWaitTimeout = 100 * time.Millisecond
)

// Config configures a [Store]. The zero value is ready to use.
type Config struct {
	// KeyPrefix starts the name of every Redis key the store writes, so that several
	// applications (or tests) can share one Redis. It must not contain '{' or '}',
	// which would change the cluster hash tag. Defaults to [DefaultKeyPrefix].
	KeyPrefix string

	// Logger receives the durability warnings of [Open]. Defaults to slog.Default().
	Logger *slog.Logger

	// TTLMargin is how long a record's Redis key outlives its expires_at. The stored
	// expires_at decides whether a record counts as absent, using Redis's clock; the key
	// TTL only reclaims memory, and the margin keeps a slightly early eviction from
	// deciding anything. Defaults to [DefaultTTLMargin].
	TTLMargin time.Duration

	// WaitReplicas is how many replicas must acknowledge a claim (Redis WAIT, sent in
	// the claim's pipeline) before it is granted and its handler runs. Redis replicates
	// asynchronously, so without it a failover can lose a claim the master granted,
	// and a retry then executes again beside, or after, the first execution. A claim
	// that fewer replicas acknowledge within WaitTimeout is given back (a fresh record
	// is deleted; a record taken over keeps its history, its lease ended) and fails with
	// [ErrNotReplicated]: nothing runs, and the middleware answers 503 with
	// Retry-After. A renewal that is not acknowledged fails the same way, so the holder
	// does not count on the longer lease. A completion waits too, so that the response
	// is on a replica before the client gets it; one that is not acknowledged still
	// stands (the operation ran) and is logged at Warn. The store URL's
	// wait_replicas parameter sets it. docs/redis.md#sentinel measures the cost.
	// Defaults to 0: nothing waits.
	WaitReplicas int

	// WaitTimeout bounds each WAIT when WaitReplicas is set. It must be shorter than
	// the client's read timeout, which bounds WAIT's reply. The store URL's
	// wait_timeout parameter sets it. Defaults to [DefaultWaitTimeout] when
	// WaitReplicas is set.
	WaitTimeout time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(c.KeyPrefix, "{}") {
		return c, fmt.Errorf("redis store: Config.KeyPrefix %q must not contain '{' or '}'", c.KeyPrefix)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TTLMargin < 0 {
		return c, fmt.Errorf("redis store: Config.TTLMargin must not be negative, got %v", c.TTLMargin)
	}
	if c.TTLMargin == 0 {
		c.TTLMargin = DefaultTTLMargin
	}
	switch {
	case c.WaitReplicas < 0:
		return c, fmt.Errorf("redis store: Config.WaitReplicas must not be negative, got %d", c.WaitReplicas)
	case c.WaitTimeout < 0:
		return c, fmt.Errorf("redis store: Config.WaitTimeout must not be negative, got %v", c.WaitTimeout)
	case c.WaitTimeout > 0 && c.WaitReplicas == 0:
		return c, fmt.Errorf("redis store: Config.WaitTimeout (wait_timeout) is %v but WaitReplicas (wait_replicas) is 0, so nothing waits; set both", c.WaitTimeout)
	case c.WaitReplicas > 0 && c.WaitTimeout == 0:
		c.WaitTimeout = DefaultWaitTimeout
	}
	return c, nil
}

// withURL returns c with the settings of the store URL u, which must not contradict
// what c sets itself.
func (c Config) withURL(u urlConfig) (Config, error) {
	if u.hasWaitReplicas {
		if c.WaitReplicas != 0 && c.WaitReplicas != u.waitReplicas {
			return c, fmt.Errorf("redis store: Config.WaitReplicas is %d but the URL says %s=%d", c.WaitReplicas, ParamWaitReplicas, u.waitReplicas)
		}
		c.WaitReplicas = u.waitReplicas
	}
	if u.hasWaitTimeout {
		if c.WaitTimeout != 0 && c.WaitTimeout != u.waitTimeout {
			return c, fmt.Errorf("redis store: Config.WaitTimeout is %v but the URL says %s=%v", c.WaitTimeout, ParamWaitTimeout, u.waitTimeout)
		}
		c.WaitTimeout = u.waitTimeout
	}
	return c, nil
}

// checkWaitTimeout refuses a WaitTimeout that the client's read timeout would cut
// short: WAIT's reply would then be a timeout, and every claim would fail.
func (c Config) checkWaitTimeout(client goredis.UniversalClient) error {
	if c.WaitReplicas == 0 {
		return nil
	}
	var read time.Duration
	switch cl := client.(type) {
	case *goredis.Client:
		read = cl.Options().ReadTimeout
	case *goredis.ClusterClient:
		read = cl.Options().ReadTimeout
	}
	if read > 0 && c.WaitTimeout >= read {
		return fmt.Errorf("redis store: Config.WaitTimeout (wait_timeout) %v must be shorter than the client's read timeout (read_timeout) %v, which bounds WAIT's reply", c.WaitTimeout, read)
	}
	return nil
}

// Store is an [idemstore.Store] in Redis: a single server or a Redis Cluster. It is safe for
// concurrent use, and any number of processes on any hosts may share one Redis.
type Store struct {
	client goredis.UniversalClient
	cfg    Config
	owned  bool   // Close closes the client (Open made it)
	node   string // names a server its client cannot name (a Sentinel URL's master)
}

var _ idemstore.Store = (*Store)(nil)

// Open connects to the Redis named by rawURL (see [NewClient] for the URL forms),
// checks that it answers and runs Redis 7.0 or later (which the store's flagged Lua
// scripts need), and logs the warnings of [Store.CheckDurability] once, at Warn level,
// through cfg.Logger. Close the store when done.
func Open(ctx context.Context, rawURL string, cfg Config) (*Store, error) {
	client, fromURL, err := newClient(rawURL)
	if err != nil {
		return nil, err
	}
	if cfg, err = cfg.withURL(fromURL); err != nil {
		client.Close()
		return nil, err
	}
	s, err := NewFromClient(client, cfg)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.owned, s.node = true, fromURL.node
	if err := s.ping(ctx); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis store: %s does not answer: %w", redactURL(rawURL), err)
	}
	if err := s.checkVersion(ctx); err != nil {
		client.Close()
		return nil, err
	}
	for _, w := range s.CheckDurability(ctx) {
		s.cfg.Logger.WarnContext(ctx, "redis store: "+w)
	}
	return s, nil
}

// NewFromClient returns a store that uses client, a *goredis.Client or a
// *goredis.ClusterClient, on Redis 7.0 or later. It neither pings Redis nor checks its
// version or durability ([Store.CheckDurability]), and Close leaves the client open:
// the caller owns it.
func NewFromClient(client goredis.UniversalClient, cfg Config) (*Store, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := cfg.checkWaitTimeout(client); err != nil {
		return nil, err
	}
	return &Store{client: client, cfg: cfg}, nil
}

// Client returns the go-redis client the store uses.
func (s *Store) Client() goredis.UniversalClient { return s.client }

// Close closes the client when [Open] made it.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	return s.client.Close()
}

// Capabilities reports that Redis has no SPEC §7 transaction helper, expires records
// by key TTL rather than in batches, may be shared by many processes, and keeps no
// recovery points (SPEC §13).
func (s *Store) Capabilities() idemstore.Capabilities {
	return idemstore.Capabilities{Transactions: false, BatchedCleanup: false, MultiProcess: true}
}

// Ping reports whether Redis answers. In a cluster every master must answer, since a
// master that does not serves none of its slots.
func (s *Store) Ping(ctx context.Context) error {
	return s.interpretError(s.ping(ctx))
}

func (s *Store) ping(ctx context.Context) error {
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			if err := c.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("master %s: %w", c.Options().Addr, err)
			}
			return nil
		})
	}
	return s.client.Ping(ctx).Err()
}

// RecordKey returns the Redis key of the record (scope, key):
//
//	<KeyPrefix>{<hex SHA-256 of len(scope) ‖ scope ‖ key>}
//
// where len(scope) is the byte length of scope as 8 bytes, big-endian. The length
// prefix makes the encoding one-to-one (no two (scope, key) pairs share an input), the
// hash keeps the raw key and principal out of Redis and spreads records evenly over
// cluster slots, and the braces make the whole digest the hash tag, so that no prefix
// or suffix ever moves a record to another slot.
func (s *Store) RecordKey(scope, key string) string {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(scope)))
	h.Write(n[:])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	return s.cfg.KeyPrefix + "{" + hex.EncodeToString(h.Sum(nil)) + "}"
}

// RecordClaim claims (Scope, Key) in one Lua script that makes
// [idemstore.ClaimParams.Decide]'s decision with Redis's clock (or params.Now).
//
// With Config.WaitReplicas set, a claim that acquires the key (afresh, again, or by a
// takeover) is granted only once that many replicas acknowledged it; otherwise it is
// given back and fails with [ErrNotReplicated].
func (s *Store) RecordClaim(ctx context.Context, p *idemstore.ClaimParams) (*idemstore.ClaimResult, error) {
	key := s.RecordKey(p.Scope, p.Key)
	res, acks, err := s.run(ctx, claimScript, key,
		nowArg(p.Now),
		strconv.Itoa(p.Fingerprint.Version),
		hex.EncodeToString(p.Fingerprint.Sum[:]),
		p.Token,
		p.RecordID,
		p.Lease.Microseconds(),
		p.TTL.Microseconds(),
		s.cfg.TTLMargin.Milliseconds(),
		scopeDigest(p.Scope),
		boolArg(p.OnLapse == idemstore.LapseUnknown),
	)
	reply, err := sliceReply(res, err)
	if goredis.IsOOMError(err) {
		return s.claimAtMaxmemory(ctx, p, err)
	}
	if err != nil {
		return nil, s.interpretError(err)
	}
	outcome, now, fields, err := decodeReply(reply)
	if err != nil {
		return nil, err
	}
	if acks < int64(s.cfg.WaitReplicas) && (outcome == "acquired" || outcome == "acquired_again" || outcome == "took_over") {
		err := s.notReplicated("the claim", acks)
		if gbErr := s.giveBack(ctx, key, outcome, p); gbErr != nil {
			err = fmt.Errorf("%w; %v", err, gbErr)
		}
		return nil, err
	}
	out := &idemstore.ClaimResult{Now: now}
	switch outcome {
	case "acquired":
		out.Outcome = idemstore.ClaimAcquired
		leaseEnd := now.Add(p.Lease)
		out.Record = &idemstore.Record{
			Scope: p.Scope, Key: p.Key, ID: p.RecordID, Fingerprint: p.Fingerprint,
			State: idemstore.StateInFlight, Token: p.Token, LeaseEnd: leaseEnd,
			CreatedAt: now, ExpiresAt: idemstore.InFlightExpiresAt(now, p.TTL, leaseEnd),
		}
		return out, nil
	case "acquired_again":
		out.Outcome = idemstore.ClaimAcquired
	case "took_over":
		out.Outcome, out.TookOver = idemstore.ClaimAcquired, true
	case "completed":
		out.Outcome = idemstore.ClaimCompleted
	case "marked_unknown":
		out.Outcome, out.MarkedUnknown = idemstore.ClaimCompleted, true
	case "in_flight":
		out.Outcome = idemstore.ClaimInFlight
	case "mismatch":
		out.Outcome = idemstore.ClaimMismatch
	default:
		return nil, fmt.Errorf("redis store: claim script answered %q", outcome)
	}
	if out.Record, err = decodeRecord(p.Scope, p.Key, fields); err != nil {
		return nil, err
	}
	return out, nil
}

// claimAtMaxmemory answers a claim that Redis refused to start because its used memory
// is above maxmemory (under noeviction, or a volatile-* policy with no key left to
// evict). What needs no write is still answered, through the get script, which Redis
// runs whatever its memory: a replay, in flight, a mismatch, or the caller's own
// record (a claim that go-redis re-sent after it had acquired the key). A claim that
// would write (a new key, a takeover) fails with Redis's OOM error, which the
// middleware answers with 503; nothing runs, and claims succeed again once memory
// frees. The read and the decision are not atomic, which is safe since nothing is
// written: the answer was true when Redis read the record.
func (s *Store) claimAtMaxmemory(ctx context.Context, p *idemstore.ClaimParams, oom error) (*idemstore.ClaimResult, error) {
	rec, now, err := s.get(ctx, p.Scope, p.Key, p.Now)
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		rec = nil
	case err != nil:
		return nil, err
	}
	out := &idemstore.ClaimResult{Record: rec, Now: now}
	if rec != nil && rec.State == idemstore.StateInFlight && rec.Token == p.Token {
		out.Outcome = idemstore.ClaimAcquired
		return out, nil
	}
	switch d := p.Decide(rec, now); d {
	case idemstore.DecideReplay:
		out.Outcome = idemstore.ClaimCompleted
	case idemstore.DecideInFlight:
		out.Outcome = idemstore.ClaimInFlight
	case idemstore.DecideMismatch:
		out.Outcome = idemstore.ClaimMismatch
	default:
		return nil, fmt.Errorf("redis store: Redis is above maxmemory and refuses the write a claim needs (%s); nothing ran, and claims succeed again once memory frees: %w", d, oom)
	}
	return out, nil
}

// RecordComplete stores the response and completes the record, fenced by token and
// state in one script. With Config.WaitReplicas set, it waits for the replicas'
// acknowledgement too; a completion they do not acknowledge in time still stands, and
// is logged at Warn.
func (s *Store) RecordComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	resp := p.Response
	if resp == nil {
		return errors.New("redis store: idemstore.CompleteParams.Response is nil")
	}
	res, acks, err := s.run(ctx, completeScript, s.RecordKey(p.Scope, p.Key),
		nowArg(p.Now),
		p.Token,
		p.TTL.Microseconds(),
		s.cfg.TTLMargin.Milliseconds(),
		resp.Status,
		encodeHeader(resp.Header),
		resp.Body,
		boolArg(resp.NotStored),
	)
	n, err := intReply(res, err)
	if err != nil {
		return s.interpretError(err)
	}
	if n != 1 {
		return idemstore.ErrLeaseLost
	}
	if acks < int64(s.cfg.WaitReplicas) {
		// The operation ran and its response is stored on the master: failing the
		// call would not undo either. A failover before it replicates leaves the
		// record in flight on the new master, and a retry after the lease executes
		// again (a backstop in the database answers it instead).
		s.cfg.Logger.WarnContext(ctx, "redis store: a completion was stored on the master, but "+s.notReplicated("it", acks).Error()+
			"; a retry after the lease would then execute again unless a database backstop answers it")
	}
	return nil
}

// RecordRelease deletes the in-flight record, fenced by token and state in one script.
func (s *Store) RecordRelease(ctx context.Context, p *idemstore.ReleaseParams) error {
	n, err := releaseScript.Run(ctx, s.client, []string{s.RecordKey(p.Scope, p.Key)}, p.Token).Int()
	if err != nil {
		return s.interpretError(err)
	}
	if n != 1 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// RecordRenew extends the lease, fenced by token and state in one script. With
// Config.WaitReplicas set, a renewal that fewer replicas acknowledge fails with
// [ErrNotReplicated], so that the holder keeps counting on its old lease end.
func (s *Store) RecordRenew(ctx context.Context, p *idemstore.RenewParams) (time.Time, error) {
	res, acks, err := s.run(ctx, renewScript, s.RecordKey(p.Scope, p.Key),
		nowArg(p.Now),
		p.Token,
		p.Lease.Microseconds(),
		p.TTL.Microseconds(),
		s.cfg.TTLMargin.Milliseconds(),
	)
	if err != nil {
		return time.Time{}, s.interpretError(err)
	}
	str, ok := res.Val().(string)
	if !ok {
		return time.Time{}, idemstore.ErrLeaseLost
	}
	if acks < int64(s.cfg.WaitReplicas) {
		// The holder keeps its old lease end: a failover could bring that one back.
		return time.Time{}, s.notReplicated("the renewal", acks)
	}
	return parseMicros(str)
}

// RecordGet reads the record; an absent one, or one past expires_at by Redis's clock
// (or params.Now), is [idemstore.ErrNotFound]. Scope and Key are filled in from params:
// Redis holds neither.
func (s *Store) RecordGet(ctx context.Context, p *idemstore.GetParams) (*idemstore.Record, error) {
	rec, _, err := s.get(ctx, p.Scope, p.Key, p.Now)
	return rec, err
}

// get reads the record (scope, key) and Redis's time (or now, when not zero).
func (s *Store) get(ctx context.Context, scope, key string, now time.Time) (*idemstore.Record, time.Time, error) {
	res, err := getScript.Run(ctx, s.client, []string{s.RecordKey(scope, key)}, nowArg(now)).Slice()
	if err != nil {
		return nil, time.Time{}, s.interpretError(err)
	}
	if len(res) != 2 {
		return nil, time.Time{}, fmt.Errorf("redis store: get script answered %d values", len(res))
	}
	nowStr, _ := res[0].(string)
	if now, err = parseMicros(nowStr); err != nil {
		return nil, time.Time{}, err
	}
	fields, ok := res[1].([]any)
	if !ok {
		return nil, time.Time{}, fmt.Errorf("redis store: get script answered %T", res[1])
	}
	if len(fields) == 0 {
		return nil, now, idemstore.ErrNotFound
	}
	rec, err := decodeRecord(scope, key, fields)
	return rec, now, err
}

// RecordDeleteExpired returns 0, nil: Redis deletes records itself when their key TTL
// (expires_at plus Config.TTLMargin) runs out.
func (s *Store) RecordDeleteExpired(context.Context, *idemstore.DeleteExpiredParams) (int, error) {
	return 0, nil
}

// errNoRecoveryPoints says why the Redis store keeps no recovery points.
var errNoRecoveryPoints = fmt.Errorf("redis store: %w: recovery points (SPEC §13) need a step's writes to commit with the record, "+
	"which Redis cannot do with the application's database, and a query for resumable records, which digests of keys cannot answer",
	errors.ErrUnsupported)

// RecordStep returns an error wrapping [errors.ErrUnsupported]: the Redis store keeps
// no recovery points (Capabilities.RecoveryPoints is false).
func (s *Store) RecordStep(context.Context, *idemstore.StepParams) error {
	return errNoRecoveryPoints
}

// RecordListResumable returns an error wrapping [errors.ErrUnsupported]: the Redis
// store keeps no recovery points, so no record is ever resumable.
func (s *Store) RecordListResumable(context.Context, *idemstore.ListResumableParams) ([]*idemstore.Record, error) {
	return nil, errNoRecoveryPoints
}

// RecordCountUnfinished returns an error wrapping [errors.ErrUnsupported]: the Redis
// store keeps no recovery points, so no operation is ever unfinished.
func (s *Store) RecordCountUnfinished(context.Context, *idemstore.CountUnfinishedParams) (*idemstore.CountUnfinishedResult, error) {
	return nil, errNoRecoveryPoints
}

// interpretError normalises go-redis errors at the store's edge.
//
// A Redis Cluster client refreshes its slot map only on MOVED replies and once a
// minute, so after a master dies it would keep sending that master's slots to a dead
// address until the next refresh. Any error that is not a Redis reply (a refused
// connection, a timeout) therefore asks it to refresh now; refreshes coalesce, and
// once a replica is promoted the next one routes its slots there. So does a MOVED or
// ASK reply, which only a pipeline sent to a key's master itself (Config.WaitReplicas)
// gets, since the cluster client follows redirections on its own.
func (s *Store) interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, goredis.Nil):
		return idemstore.ErrNotFound
	}
	var reply goredis.Error
	if cc, ok := s.client.(*goredis.ClusterClient); ok && (!errors.As(err, &reply) || isRedirect(err)) {
		cc.ReloadState(context.Background())
	}
	return fmt.Errorf("redis store: %w", err)
}

func nowArg(now time.Time) string {
	if now.IsZero() {
		return ""
	}
	return strconv.FormatInt(now.UnixMicro(), 10)
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// isRedirect reports whether err is a cluster's MOVED or ASK reply.
func isRedirect(err error) bool {
	_, moved := goredis.IsMovedError(err)
	_, ask := goredis.IsAskError(err)
	return moved || ask
}
