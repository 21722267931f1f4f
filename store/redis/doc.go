// Package redis is an [idemstore.Store] in Redis, built on go-redis v9: a single server, a
// master that Redis Sentinels watch, or a Redis Cluster, shared by any number of processes
// on any hosts (SPEC §14).
//
//	s, err := redis.Open(ctx, "redis://127.0.0.1:6379/0", redis.Config{})
//
// Store URLs ([NewClient]): redis://[user:password@]host:port[/db], rediss://… (TLS);
// for a Redis Cluster redis+cluster://host:port?addr=host2:port2&addr=… (or
// rediss+cluster://…), which is go-redis's cluster URL with "+cluster" added to the
// scheme; and for Sentinel redis+sentinel://[user:password@]s1:port,s2:port/db?master=NAME
// (or rediss+sentinel://…), which opens go-redis's failover client. Any of them may add
// wait_replicas=N (Config.WaitReplicas): each claim then waits for N replicas'
// acknowledgement (Redis WAIT) before its handler runs, and one that is not acknowledged
// in time is given back and fails with [ErrNotReplicated] (503).
//
// # How records are kept
//
// A record is one Redis hash named
//
//	<KeyPrefix>{<hex SHA-256 of len(scope) ‖ scope ‖ key>}
//
// with len(scope) as 8 bytes, big-endian ([Store.RecordKey]). The name is one-to-one,
// holds neither the raw key nor the principal, spreads records evenly over cluster
// slots, and its braces make the whole digest the hash tag. Every state change (claim,
// complete, release, renew) and the read are each one Lua script, run with EVALSHA and
// re-sent with EVAL when Redis has forgotten it; the scripts read Redis's TIME, make
// [idemstore.Decide]'s decision server-side, and fence complete, release and renew on the
// lock token and the in-flight state. Key TTLs run [Config.TTLMargin] past expires_at,
// so the stored expires_at decides; Redis then reclaims the key itself, which is why
// [idemstore.Capabilities.BatchedCleanup] is false. Redis cannot join the application's
// database transaction, so [idemstore.Capabilities.Transactions] is false too.
//
// The scripts declare Redis 7 script flags, so the store needs Redis 7.0 or later
// ([Open] checks). With maxmemory-policy noeviction, a Redis above maxmemory refuses a
// claim that would write (a new key, a takeover) before anything runs, and the
// middleware answers 503; replays, in-flight answers and mismatches are still served,
// and work already running can always complete, release or renew its key.
//
// # What it guarantees
//
// At most one execution per key while Redis keeps every write it acknowledged. A
// restart without appendonly yes and appendfsync always, eviction under a
// maxmemory-policy other than noeviction, and an asynchronous replica failover can each
// lose records, and a retry of a lost record's request executes again; a failover also
// cancels handlers whose lease renewals fail and may let a retry execute while the old
// holder still runs. Claims that wait for a replica (Config.WaitReplicas) keep every claim
// whose handler ran through a failover; a completion that had not replicated can still be
// lost. [Open] logs a warning for each risky setting it can read
// ([Store.CheckDurability]). Operations that must not run twice need a backstop in the
// database that holds their effects: a unique (scope, key) row written in the
// transaction of their writes. Package backstop (github.com/idem-go/idem/backstop)
// keeps one in a PostgreSQL or SQLite database; the payments API of cmd/idem has its
// own. docs/redis.md says all this at length.
package redis
