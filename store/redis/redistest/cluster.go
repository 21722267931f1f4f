package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of the clusters StartCluster starts, in
// milliseconds: small, so that a replica takes over a killed master within seconds.
const ClusterNodeTimeout = 2000

// Cluster is a private Redis Cluster: three masters, each with one replica.
type Cluster struct {
	t     testing.TB
	Nodes []*Server
}

// StartCluster starts six cluster-enabled redis-servers on free loopback ports, joins
// them with `redis-cli --cluster create … --cluster-replicas 1`, and waits until every
// node reports cluster_state:ok. Every process is killed at t's cleanup.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	RequireBinaries(t)
	c := &Cluster{t: t}
	for range 6 {
		c.Nodes = append(c.Nodes, StartServer(t,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(ClusterNodeTimeout),
			// Replicas sync at once instead of after the default 5 s delay; a replica
			// that never synced refuses to take over its master.
			"--repl-diskless-sync-delay", "0",
		))
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.Nodes {
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitOK(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// URL returns the cluster's store URL: redis+cluster://seed?addr=…&addr=… naming every
// node.
func (c *Cluster) URL() string {
	var b strings.Builder
	b.WriteString("redis+cluster://" + c.Nodes[0].Addr())
	for i, n := range c.Nodes[1:] {
		if i == 0 {
			b.WriteString("?")
		} else {
			b.WriteString("&")
		}
		b.WriteString("addr=" + n.Addr())
	}
	return b.String()
}

// Running returns the nodes whose process has not been killed.
func (c *Cluster) Running() []*Server {
	var out []*Server
	for _, n := range c.Nodes {
		n.mu.Lock()
		if n.cmd != nil {
			out = append(out, n)
		}
		n.mu.Unlock()
	}
	return out
}

// WaitOK waits until every running node reports cluster_state:ok with all 16384 slots
// served, every node agrees on three masters that are running, and every running
// replica's link to its master is up (so that it can take over). It polls CLUSTER
// INFO, since a cluster signals convergence no other way.
func (c *Cluster) WaitOK(ctx context.Context) error {
	return poll(ctx, "cluster did not converge", c.healthy)
}

func (c *Cluster) healthy(ctx context.Context) error {
	live := map[string]bool{}
	running := c.Running()
	for _, n := range running {
		live[n.Addr()] = true
	}
	for _, n := range running {
		info, masters, err := nodeView(ctx, n.Addr())
		if err != nil {
			return err
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return fmt.Errorf("%s: cluster_state not ok", n.Addr())
		}
		if len(masters) != 3 {
			return fmt.Errorf("%s sees %d masters serving slots, want 3: %v", n.Addr(), len(masters), masters)
		}
		for _, m := range masters {
			if !live[m] {
				return fmt.Errorf("%s still sees killed master %s serving slots", n.Addr(), m)
			}
		}
		if !slices.Contains(masters, n.Addr()) {
			if err := replicaLinkUp(ctx, n.Addr(), live); err != nil {
				return err
			}
		}
	}
	return nil
}

// replicaLinkUp checks that the replica at addr has synced with its master, unless
// that master was killed (its link then stays down until the failover).
func replicaLinkUp(ctx context.Context, addr string, live map[string]bool) error {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	info, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("%s: INFO replication: %w", addr, err)
	}
	field := func(name string) string { return infoValue(info, name) }
	master := net.JoinHostPort(field("master_host"), field("master_port"))
	if live[master] && field("master_link_status") != "up" {
		return fmt.Errorf("replica %s has not synced with master %s", addr, master)
	}
	return nil
}

// nodeView returns a node's CLUSTER INFO and the addresses of the masters that serve
// slots in its CLUSTER NODES, excluding those it flags as failed.
func nodeView(ctx context.Context, addr string) (info string, masters []string, err error) {
	rdb := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer rdb.Close()
	if info, err = rdb.ClusterInfo(ctx).Result(); err != nil {
		return "", nil, fmt.Errorf("%s: CLUSTER INFO: %w", addr, err)
	}
	nodes, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		return "", nil, fmt.Errorf("%s: CLUSTER NODES: %w", addr, err)
	}
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		// <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>…
		if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		a, _, _ := strings.Cut(f[1], "@")
		masters = append(masters, a)
	}
	return info, masters, nil
}

// MasterOf returns the running node that serves the slot of key.
func (c *Cluster) MasterOf(ctx context.Context, key string) (*Server, error) {
	rdb := goredis.NewClient(&goredis.Options{Addr: c.Running()[0].Addr()})
	defer rdb.Close()
	slot, err := rdb.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	shards, err := rdb.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, err
	}
	for _, sh := range shards {
		if int64(sh.Start) <= slot && slot <= int64(sh.End) && len(sh.Nodes) > 0 {
			for _, n := range c.Nodes {
				if n.Addr() == sh.Nodes[0].Addr {
					return n, nil
				}
			}
			return nil, fmt.Errorf("redistest: slot %d is served by unknown node %s", slot, sh.Nodes[0].Addr)
		}
	}
	return nil, fmt.Errorf("redistest: no node serves slot %d", slot)
}
