package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// CheckDurability reads appendonly, appendfsync, save and maxmemory-policy from Redis
// (from every master of a cluster), and its replication (INFO replication), and returns
// one plain warning for each setting under which Redis can lose or evict acknowledged
// records, saying what that means for idempotency: a retry of a request whose record
// was lost executes the operation again. A master with replicas gets one when claims do
// not wait for them (Config.WaitReplicas is 0: a failover can lose the last records),
// and one when fewer replicas are connected than claims wait for (every claim fails).
// It returns nil when Redis keeps every acknowledged write (appendonly yes, appendfsync
// always, maxmemory-policy noeviction, and no replica to fail over to, or claims that
// wait for one). When Redis refuses CONFIG GET, as managed
// services do, it returns a single "durability unknown" warning. It never changes the
// configuration, and its warnings are advice, not errors.
//
// Identical warnings from several cluster masters are merged into one that lists the
// nodes.
func (s *Store) CheckDurability(ctx context.Context) []string {
	var (
		mu    sync.Mutex
		found = map[string][]string{} // warning → nodes
		order []string
	)
	add := func(node string, warnings []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, w := range warnings {
			if _, ok := found[w]; !ok {
				order = append(order, w)
			}
			found[w] = append(found[w], node)
		}
	}
	check := func(ctx context.Context, c goredis.Cmdable, node string) error {
		add(node, nodeDurability(ctx, c))
		add(node, replicationWarnings(ctx, c, s.cfg.WaitReplicas))
		return nil
	}
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return check(ctx, c, c.Options().Addr)
		})
		if err != nil {
			add("cluster", []string{unknownWarning(err)})
		}
	} else {
		_ = check(ctx, s.client, s.nodeName())
	}
	out := make([]string, 0, len(order))
	for _, w := range order {
		nodes := found[w]
		slices.Sort(nodes)
		out = append(out, fmt.Sprintf("%s (%s)", w, strings.Join(nodes, ", ")))
	}
	return out
}

// nodeName names the server of a single-server or Sentinel client in warnings.
func (s *Store) nodeName() string {
	if s.node != "" {
		return s.node
	}
	if cl, ok := s.client.(*goredis.Client); ok {
		if addr := cl.Options().Addr; addr != "FailoverClient" { // go-redis's name for a Sentinel client
			return addr
		}
		return "the Sentinels' master"
	}
	return "redis"
}

// nodeDurability returns the warnings for one Redis server.
func nodeDurability(ctx context.Context, c goredis.Cmdable) []string {
	conf := map[string]string{}
	for _, name := range []string{"appendonly", "appendfsync", "save", "maxmemory-policy"} {
		m, err := c.ConfigGet(ctx, name).Result()
		if err != nil {
			return []string{unknownWarning(err)}
		}
		v, ok := m[name]
		if !ok {
			return []string{unknownWarning(fmt.Errorf("CONFIG GET %s answered nothing", name))}
		}
		conf[name] = v
	}
	return durabilityWarnings(conf)
}

// durabilityWarnings judges one server's settings.
func durabilityWarnings(conf map[string]string) []string {
	var out []string
	aof, fsync, save, policy := conf["appendonly"], conf["appendfsync"], conf["save"], conf["maxmemory-policy"]
	switch {
	case aof != "yes" && save == "":
		out = append(out, `durability: Redis persistence is off (appendonly no, save ""): a Redis restart loses every idempotency record, and a retry of a request that already executed executes it again; set appendonly yes and appendfsync always`)
	case aof != "yes":
		out = append(out, fmt.Sprintf("durability: appendonly is no, so Redis persists only RDB snapshots (save %q): a Redis restart loses the records written since the last snapshot, and a retry of such a request executes it again; set appendonly yes and appendfsync always", save))
	case fsync != "always":
		out = append(out, fmt.Sprintf("durability: appendfsync is %s, not always: a crash of Redis or its host can lose records Redis had acknowledged (up to a second with everysec, more with no), and a retry of such a request executes it again; set appendfsync always", fsync))
	}
	if policy != "noeviction" {
		out = append(out, fmt.Sprintf("durability: maxmemory-policy is %s, not noeviction: when Redis reaches maxmemory it evicts keys, and every idempotency record has a TTL, so records can vanish before they expire and a retry of such a request executes it again; set maxmemory-policy noeviction", policy))
	}
	return out
}

func unknownWarning(err error) string {
	return fmt.Sprintf("durability unknown: CONFIG GET failed (%v); managed services often refuse it. idem cannot check that Redis persists every acknowledged record (appendonly yes, appendfsync always) and never evicts one (maxmemory-policy noeviction); without those, a restart, failover or eviction loses records and a retry of such a request executes it again", err)
}

// replicationWarnings returns the warnings about one server's replication for claims
// that wait for wait replicas: a master whose replicas a failover could promote before
// they have the last records, a master with fewer connected replicas than claims wait
// for, and a replica, which refuses writes. A server that does not answer INFO gets
// none: the durability check says what it could not read.
func replicationWarnings(ctx context.Context, c goredis.Cmdable, wait int) []string {
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return nil
	}
	if role := infoField(info, "role"); role != "master" {
		return []string{fmt.Sprintf("replication: this server is a replica (role:%s), which refuses writes, so every claim fails; point the store URL at the master, or at the Sentinels (redis+sentinel://)", role)}
	}
	replicas, _ := strconv.Atoi(infoField(info, "connected_slaves"))
	switch {
	case wait == 0 && replicas > 0:
		return []string{"replication: this master has replicas, and Redis replicates asynchronously: a failover (Sentinel, a cluster, a managed service) can promote a replica that lacks the records the master acknowledged last, and a retry of such a request executes it again; " +
			"set wait_replicas=1 (Config.WaitReplicas) so that a claim waits for a replica before its handler runs, and keep a database backstop (docs/redis.md#sentinel)"}
	case replicas < wait:
		return []string{fmt.Sprintf("replication: claims wait for %d replica(s) (wait_replicas) but this master has %d connected: every claim fails (503) until enough replicas connect and acknowledge it", wait, replicas)}
	}
	return nil
}
