package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// The Sentinel settings of the deployments StartSentinel starts: small, so that a
// killed master is replaced within seconds. A Sentinel marks the master subjectively
// down after SentinelDownAfter milliseconds without a valid reply, the quorum (two of
// the three) agrees that it is down, one Sentinel is elected to lead the failover, and
// it promotes the replica; SentinelFailoverTimeout bounds each attempt (and a failed
// attempt is retried after twice that).
const (
	SentinelMasterName      = "idemtest"
	SentinelDownAfter       = 1000
	SentinelFailoverTimeout = 3000
	sentinelQuorum          = 2
)

// SentinelOptions configures StartSentinel. The zero value is a deployment without
// passwords whose one replica replicates directly from its master.
type SentinelOptions struct {
	// Replicas is how many replicas the master has. Defaults to 1.
	Replicas int
	// Password, when set, is the requirepass of the master and the replica (and the
	// replica's masterauth, and the Sentinels' auth-pass for them).
	Password string
	// SentinelPassword, when set, is the Sentinels' own requirepass (and the
	// sentinel-pass they use with each other).
	SentinelPassword string
	// TLS, when set, makes every server and Sentinel listen over TLS only, with this
	// authority's certificate, and replicate and watch over TLS.
	TLS *TLS
	// ReplicaLink, when set, is given the master's address and returns the address a
	// replica replicates from (it is called once per replica): a fault proxy in front
	// of the master, so that a test can stall replication. The Sentinels still find
	// each replica by its own port.
	ReplicaLink func(masterAddr string) string
}

// Sentinel is a private Redis Sentinel deployment: a master, its replicas, and three
// Sentinels that watch the master under SentinelMasterName (quorum 2).
type Sentinel struct {
	t         testing.TB
	opts      SentinelOptions
	Master    *Server
	Replicas  []*Server
	Sentinels []*Server
}

// StartSentinel starts a master, its replicas (each synced with it), and three
// Sentinels that watch it, each on a free loopback port, and waits until every
// Sentinel knows the replicas and the two other Sentinels and agrees that a failover
// could be authorised (SENTINEL CKQUORUM). Every process is killed at t's cleanup.
func StartSentinel(t testing.TB, opts SentinelOptions) *Sentinel {
	t.Helper()
	RequireBinaries(t)
	d := &Sentinel{t: t, opts: opts}
	var auth []string
	if opts.Password != "" {
		auth = []string{"--requirepass", opts.Password, "--masterauth", opts.Password}
	}
	// Replicas sync at once instead of after the default 5 s delay.
	d.Master = startServer(t, &Server{t: t, dir: t.TempDir(), args: append([]string{"--repl-diskless-sync-delay", "0"}, auth...), tls: opts.TLS})
	for range max(opts.Replicas, 1) {
		link := ""
		if opts.ReplicaLink != nil {
			link = opts.ReplicaLink(d.Master.Addr())
		}
		d.Replicas = append(d.Replicas, startReplica(t, d.Master, link, opts.TLS, auth...))
	}
	// Started after the replicas synced, the Sentinels find them in their first INFO
	// of the master rather than ten seconds later.
	for range 3 {
		d.Sentinels = append(d.Sentinels, d.startSentinel(t))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

// StartReplica starts a redis-server that replicates from master, through link (a
// proxy in front of the master; "" for the master itself), with args (such as
// "--masterauth", password), and waits until the master counts it online: it has
// synced, and its acknowledgements count for WAIT. It is killed at t's cleanup.
func StartReplica(t testing.TB, master *Server, link string, args ...string) *Server {
	t.Helper()
	return startReplica(t, master, link, nil, args...)
}

// startReplica is StartReplica, over TLS when c is set.
func startReplica(t testing.TB, master *Server, link string, c *TLS, args ...string) *Server {
	t.Helper()
	if link == "" {
		link = master.Addr()
	}
	host, port, err := net.SplitHostPort(link)
	if err != nil {
		t.Fatalf("redistest: replica link %q: %v", link, err)
	}
	r := startServer(t, &Server{t: t, dir: t.TempDir(), tls: c,
		args: append([]string{"--replicaof", host, port, "--repl-diskless-sync-delay", "0"}, args...)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The replica has synced, but it may take a moment more before it acknowledges
	// what the master writes next: the master's own WAIT decides. The probe's key is
	// deleted in the same round trip.
	err = poll(ctx, "the replica does not acknowledge writes", func(ctx context.Context) error {
		c := master.Client()
		defer c.Close()
		var acks *goredis.Cmd
		_, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
			p.Set(ctx, "redistest:replica-probe", 1, 0)
			p.Del(ctx, "redistest:replica-probe")
			// On the connection that wrote: WAIT waits for its own connection's writes.
			acks = p.Do(ctx, "wait", 1, 100)
			return nil
		})
		if err != nil {
			return err
		}
		if n, err := acks.Int64(); err != nil || n < 1 {
			return fmt.Errorf("replica %s has not acknowledged a write of master %s (WAIT: %d, %v)", r.Addr(), master.Addr(), n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startSentinel starts one Sentinel watching the master.
func (d *Sentinel) startSentinel(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	name := SentinelMasterName
	conf := []string{
		fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d", name, d.Master.Port(), sentinelQuorum),
		fmt.Sprintf("sentinel down-after-milliseconds %s %d", name, SentinelDownAfter),
		fmt.Sprintf("sentinel failover-timeout %s %d", name, SentinelFailoverTimeout),
		fmt.Sprintf("sentinel parallel-syncs %s 1", name),
	}
	if d.opts.Password != "" {
		conf = append(conf, fmt.Sprintf("sentinel auth-pass %s %s", name, d.opts.Password))
	}
	if d.opts.SentinelPassword != "" {
		conf = append(conf, "requirepass "+d.opts.SentinelPassword, "sentinel sentinel-pass "+d.opts.SentinelPassword)
	}
	// A Sentinel rewrites its configuration file as its view changes, so the file is
	// its own and writable.
	file := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(file, []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startServer(t, &Server{t: t, dir: dir, sentinel: file, tls: d.opts.TLS})
}

// URL returns the deployment's store URL: redis+sentinel://[:password@]s1,s2,s3/0
// ?master=SentinelMasterName[&sentinel_password=…], naming every Sentinel
// (rediss+sentinel://…&skip_verify=true over TLS).
func (d *Sentinel) URL() string {
	var addrs []string
	for _, s := range d.Sentinels {
		addrs = append(addrs, s.Addr())
	}
	userinfo := ""
	if d.opts.Password != "" {
		userinfo = ":" + d.opts.Password + "@"
	}
	scheme := "redis+sentinel"
	if d.opts.TLS != nil {
		scheme = "rediss+sentinel"
	}
	u := scheme + "://" + userinfo + strings.Join(addrs, ",") + "/0?master=" + SentinelMasterName
	if d.opts.SentinelPassword != "" {
		u += "&sentinel_password=" + d.opts.SentinelPassword
	}
	if d.opts.TLS != nil {
		u += "&skip_verify=true" // the URL cannot name the test's authority
	}
	return u
}

// sentinelClient returns a client of the Sentinel s.
func (d *Sentinel) sentinelClient(s *Server) *goredis.SentinelClient {
	o := &goredis.Options{Addr: s.Addr(), Password: d.opts.SentinelPassword, MaxRetries: -1, DialTimeout: time.Second}
	if d.opts.TLS != nil {
		o.TLSConfig = d.opts.TLS.ClientConfig()
	}
	return goredis.NewSentinelClient(o)
}

// WaitReady waits until every Sentinel sees the master up, its replicas connected
// and the other Sentinels, and SENTINEL CKQUORUM says a failover could be
// authorised. It polls, since Sentinels discover each other (every 2 s) and the
// replica (through the master's INFO) without announcing it to a client.
func (d *Sentinel) WaitReady(ctx context.Context) error {
	return poll(ctx, "the Sentinels did not converge", func(ctx context.Context) error {
		for _, s := range d.Sentinels {
			if err := d.sentinelReady(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
}

func (d *Sentinel) sentinelReady(ctx context.Context, s *Server) error {
	c := d.sentinelClient(s)
	defer c.Close()
	m, err := c.Master(ctx, SentinelMasterName).Result()
	if err != nil {
		return fmt.Errorf("sentinel %s: SENTINEL MASTER: %w", s.Addr(), err)
	}
	switch {
	case m["flags"] != "master":
		return fmt.Errorf("sentinel %s: master flags %q", s.Addr(), m["flags"])
	case m["num-slaves"] != strconv.Itoa(len(d.Replicas)):
		return fmt.Errorf("sentinel %s: knows %s replicas, want %d", s.Addr(), m["num-slaves"], len(d.Replicas))
	case m["num-other-sentinels"] != strconv.Itoa(len(d.Sentinels)-1):
		return fmt.Errorf("sentinel %s: knows %s other sentinels, want %d", s.Addr(), m["num-other-sentinels"], len(d.Sentinels)-1)
	}
	replicas, err := c.Replicas(ctx, SentinelMasterName).Result()
	if err != nil {
		return fmt.Errorf("sentinel %s: SENTINEL REPLICAS: %w", s.Addr(), err)
	}
	for _, r := range replicas {
		if r["flags"] != "slave" || r["master-link-status"] != "ok" {
			return fmt.Errorf("sentinel %s: replica %s:%s flags %q link %q", s.Addr(), r["ip"], r["port"], r["flags"], r["master-link-status"])
		}
	}
	if _, err := c.CkQuorum(ctx, SentinelMasterName).Result(); err != nil {
		return fmt.Errorf("sentinel %s: CKQUORUM: %w", s.Addr(), err)
	}
	return nil
}

// WatchSwitch subscribes to +switch-master on every Sentinel and returns a channel
// that receives, once, the new master's host:port when the first of them announces
// that the master was replaced. The subscriptions end with ctx.
func (d *Sentinel) WatchSwitch(ctx context.Context) (<-chan string, error) {
	out := make(chan string, 1)
	for _, s := range d.Sentinels {
		c := d.sentinelClient(s)
		ps := c.Subscribe(ctx, "+switch-master")
		// Wait for the subscription's confirmation, so that no switch can be missed.
		if _, err := ps.Receive(ctx); err != nil {
			ps.Close()
			c.Close()
			return nil, fmt.Errorf("redistest: subscribing to +switch-master on %s: %w", s.Addr(), err)
		}
		go func() {
			defer c.Close()
			defer ps.Close()
			ch := ps.Channel()
			for {
				select {
				case <-ctx.Done():
					return
				case msg, ok := <-ch:
					if !ok {
						return
					}
					// <master name> <old ip> <old port> <new ip> <new port>
					f := strings.Fields(msg.Payload)
					if len(f) == 5 && f[0] == SentinelMasterName {
						select {
						case out <- net.JoinHostPort(f[3], f[4]):
						default:
						}
						return
					}
				}
			}
		}()
	}
	return out, nil
}

// poll calls check every 50 ms until it succeeds or ctx ends, and then returns what
// with check's last error.
func poll(ctx context.Context, what string, check func(ctx context.Context) error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		// Each check has its own deadline, so that the error reported is the last real
		// state rather than ctx's expiry.
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		last := check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: %s: %w", what, last)
		case <-tick.C:
		}
	}
}

// infoValue returns the value of name in an INFO answer ("name:value" lines).
func infoValue(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
