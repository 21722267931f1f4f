package redis

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/internal/secret"
)

// URL schemes that Open accepts for a Redis Cluster. The rest of the URL is go-redis's
// cluster URL format ([goredis.ParseClusterURL]): the host is one seed node and every
// addr query parameter adds another.
const (
	SchemeCluster    = "redis+cluster"
	SchemeClusterTLS = "rediss+cluster"
)

// URL schemes that Open accepts for a master found through Redis Sentinel: the hosts
// are Sentinels, separated by commas, and the master parameter names the master they
// watch (see [NewClient]).
const (
	SchemeSentinel    = "redis+sentinel"
	SchemeSentinelTLS = "rediss+sentinel"
)

// DefaultSentinelPort is the port of a Sentinel address given without one: Redis
// Sentinel's own default port.
const DefaultSentinelPort = "26379"

// The query parameters of every store URL form that set the store's [Config] rather
// than the client: Open reads them, and NewClient checks them and otherwise ignores
// them.
const (
	// ParamWaitReplicas sets Config.WaitReplicas.
	ParamWaitReplicas = "wait_replicas"
	// ParamWaitTimeout sets Config.WaitTimeout.
	ParamWaitTimeout = "wait_timeout"
)

// schemes lists the accepted schemes for error messages.
const schemes = "redis://, rediss://, " + SchemeCluster + "://, " + SchemeClusterTLS + "://, " +
	SchemeSentinel + ":// or " + SchemeSentinelTLS + "://"

// IsURL reports whether rawURL names a Redis store (redis://, rediss://,
// redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://), so
// that a command can route a --store URL.
func IsURL(rawURL string) bool {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return false
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", SchemeCluster, SchemeClusterTLS, SchemeSentinel, SchemeSentinelTLS:
		return true
	}
	return false
}

// NewClient builds the go-redis client for rawURL:
//
//	redis://[user:password@]host:port[/db][?option=value…]        one server (or a primary)
//	rediss://[user:password@]host:port[/db][?option=value…]       the same over TLS
//	redis+cluster://[user:password@]host:port[?addr=host:port…]   a Redis Cluster
//	rediss+cluster://[user:password@]host:port[?addr=host:port…]  a Redis Cluster over TLS
//	redis+sentinel://[user:password@]host:port[,host:port…][/db]?master=NAME[&option=value…]
//	                                                              the master that Sentinels watch
//	rediss+sentinel://…                                           the same over TLS
//
// The single-server forms are parsed by [goredis.ParseURL]; the cluster forms by
// [goredis.ParseClusterURL] after the "+cluster" suffix is dropped from the scheme. A
// cluster URL needs only one reachable seed node (more addr parameters make start-up
// survive a dead seed); the client discovers every master and replica itself. A cluster
// has no databases, so its URL has no /db.
//
// A Sentinel URL names the Sentinels (host:port, separated by commas; a port left out
// is [DefaultSentinelPort]) and, with master=NAME, the master they watch under that
// name; the client is go-redis's failover client ([goredis.NewFailoverClient]), which
// asks the Sentinels where the master is and follows it when they replace it. The
// userinfo is the Redis user and password of the master and its replicas, as in a
// redis:// URL; sentinel_username and sentinel_password are the Sentinels' own (their
// requirepass or ACL user), when they have one. Over TLS (rediss+sentinel://) the
// Sentinels and the master are all reached over TLS, each verified against its own
// host name; skip_verify=true skips the verification.
//
// Every form accepts go-redis's snake_case options as query parameters, such as
// dial_timeout=3s or pool_size=20, and the store's own [ParamWaitReplicas] and
// [ParamWaitTimeout], which set [Config.WaitReplicas] and [Config.WaitTimeout] when
// [Open] opens the URL (NewClient checks them and leaves them to Open). An unknown
// parameter is an error.
//
// The client honours the deadlines of the contexts it is given
// (ContextTimeoutEnabled), so that the middleware's StoreTimeout and the lease bound
// every call even when read_timeout is longer; a client passed to [NewFromClient]
// should enable it too.
func NewClient(rawURL string) (goredis.UniversalClient, error) {
	c, _, err := newClient(rawURL)
	return c, err
}

// urlConfig is what a store URL says about the store's Config.
type urlConfig struct {
	waitReplicas    int
	hasWaitReplicas bool
	waitTimeout     time.Duration
	hasWaitTimeout  bool
	// node names the server in warnings when its client cannot: the master a
	// Sentinel URL names.
	node string
}

// newClient is NewClient, also returning the store's settings from the URL.
func newClient(rawURL string) (goredis.UniversalClient, urlConfig, error) {
	fail := func(err error) (goredis.UniversalClient, urlConfig, error) {
		return nil, urlConfig{}, fmt.Errorf("redis store: URL %q: %w", redactURL(rawURL), secret.RedactURLError(err))
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, urlConfig{}, fmt.Errorf("redis store: URL %q has no scheme (want %s)", redactURL(rawURL), schemes)
	}
	scheme = strings.ToLower(scheme)
	rest, cfg, err := cutConfigParams(rest)
	if err != nil {
		return fail(err)
	}
	switch scheme {
	case "redis", "rediss":
		opts, err := goredis.ParseURL(scheme + "://" + rest)
		if err != nil {
			return fail(err)
		}
		opts.ContextTimeoutEnabled = true
		return goredis.NewClient(opts), cfg, nil
	case SchemeCluster, SchemeClusterTLS:
		base := strings.TrimSuffix(scheme, "+cluster")
		opts, err := goredis.ParseClusterURL(base + "://" + rest)
		if err != nil {
			return fail(err)
		}
		opts.ContextTimeoutEnabled = true
		return goredis.NewClusterClient(opts), cfg, nil
	case SchemeSentinel, SchemeSentinelTLS:
		opts, err := parseSentinelURL(scheme == SchemeSentinelTLS, rest)
		if err != nil {
			return fail(err)
		}
		opts.ContextTimeoutEnabled = true
		cfg.node = fmt.Sprintf("master %q of the Sentinels", opts.MasterName)
		return goredis.NewFailoverClient(opts), cfg, nil
	default:
		return nil, urlConfig{}, fmt.Errorf("redis store: URL %q: unknown scheme %q (want %s)", redactURL(rawURL), scheme, schemes)
	}
}

// cutConfigParams removes the store's own parameters (wait_replicas, wait_timeout)
// from the query of rest (a URL after its "scheme://") and returns what is left, the
// rest as given, with the settings they make.
func cutConfigParams(rest string) (string, urlConfig, error) {
	var cfg urlConfig
	base, query, hasQuery := strings.Cut(rest, "?")
	if !hasQuery {
		return rest, cfg, nil
	}
	query, fragment, hasFragment := strings.Cut(query, "#")
	var kept []string
	for _, p := range strings.Split(query, "&") {
		rawName, value, _ := strings.Cut(p, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil || (name != ParamWaitReplicas && name != ParamWaitTimeout) {
			kept = append(kept, p)
			continue
		}
		if value, err = url.QueryUnescape(value); err != nil {
			return "", cfg, fmt.Errorf("%s: %w", name, err)
		}
		switch name {
		case ParamWaitReplicas:
			if cfg.hasWaitReplicas {
				return "", cfg, fmt.Errorf("%s is given twice", name)
			}
			n, err := strconv.Atoi(value)
			if err != nil || n < 0 {
				return "", cfg, fmt.Errorf("%s=%q: want a number of replicas, 0 or more", name, value)
			}
			cfg.waitReplicas, cfg.hasWaitReplicas = n, true
		case ParamWaitTimeout:
			if cfg.hasWaitTimeout {
				return "", cfg, fmt.Errorf("%s is given twice", name)
			}
			d, err := time.ParseDuration(value)
			if err != nil || d <= 0 {
				return "", cfg, fmt.Errorf("%s=%q: want a positive duration such as 100ms", name, value)
			}
			cfg.waitTimeout, cfg.hasWaitTimeout = d, true
		}
	}
	out := base
	if len(kept) > 0 {
		out += "?" + strings.Join(kept, "&")
	}
	if hasFragment {
		out += "#" + fragment
	}
	return out, cfg, nil
}

// Query parameters of a Sentinel URL that are not go-redis's: they are taken out
// before go-redis parses the rest.
const (
	paramMaster           = "master"
	paramSentinelUsername = "sentinel_username"
	paramSentinelPassword = "sentinel_password"
	paramSkipVerify       = "skip_verify"
)

// sentinelRefused are go-redis's failover URL parameters that a Sentinel URL spells
// otherwise, with what to write instead.
var sentinelRefused = map[string]string{
	"master_name": "name the master with master=NAME",
	"addr":        "list every Sentinel in the host part, separated by commas: redis+sentinel://host1:port,host2:port/…",
	"username":    "the Redis user and password go in the userinfo (redis+sentinel://user:password@…); sentinel_username and sentinel_password are the Sentinels' own",
	"password":    "the Redis user and password go in the userinfo (redis+sentinel://user:password@…); sentinel_username and sentinel_password are the Sentinels' own",
}

// parseSentinelURL parses rest, a Sentinel URL after its "scheme://" (over TLS when
// tlsOn), into failover options: the Sentinels' addresses, the master's name, the
// credentials of the master (userinfo) and of the Sentinels (sentinel_username,
// sentinel_password), the database, and go-redis's other options, which
// goredis.ParseFailoverURL reads.
func parseSentinelURL(tlsOn bool, rest string) (*goredis.FailoverOptions, error) {
	rest, _, _ = strings.Cut(rest, "#") // as url.Parse, and so go-redis, ignores it
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	path, query, _ := strings.Cut(tail, "?")

	var user, password string
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		var err error
		if user, password, err = parseUserinfo(authority[:i]); err != nil {
			return nil, err
		}
		authority = authority[i+1:]
	}
	addrs, err := sentinelAddrs(authority)
	if err != nil {
		return nil, err
	}
	db := 0
	if p := strings.TrimPrefix(path, "/"); p != "" {
		if db, err = strconv.Atoi(p); err != nil || db < 0 {
			return nil, fmt.Errorf("database %q: want a number, such as /0", p)
		}
	}

	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("query: %w", err)
	}
	for name, fix := range sentinelRefused {
		if q.Has(name) {
			return nil, fmt.Errorf("parameter %s: %s", name, fix)
		}
	}
	single := func(name string) (string, error) {
		vs := q[name]
		delete(q, name)
		if len(vs) > 1 {
			return "", fmt.Errorf("%s is given %d times", name, len(vs))
		}
		if len(vs) == 0 {
			return "", nil
		}
		return vs[0], nil
	}
	master, err := single(paramMaster)
	if err != nil {
		return nil, err
	}
	if master == "" {
		return nil, errors.New(`no master name: add ?master=NAME, the name the Sentinels watch the master under ("sentinel monitor NAME host port quorum")`)
	}
	sentinelUser, err := single(paramSentinelUsername)
	if err != nil {
		return nil, err
	}
	sentinelPassword, err := single(paramSentinelPassword)
	if err != nil {
		return nil, err
	}
	skip, err := single(paramSkipVerify)
	if err != nil {
		return nil, err
	}
	skipVerify := false
	if skip != "" {
		if !tlsOn {
			return nil, fmt.Errorf("%s is for TLS: use %s://", paramSkipVerify, SchemeSentinelTLS)
		}
		if skipVerify, err = strconv.ParseBool(skip); err != nil {
			return nil, fmt.Errorf("%s=%q: want true or false", paramSkipVerify, skip)
		}
	}

	// go-redis reads the other options from a failover URL of its own form, which
	// carries no secret: the first Sentinel as the host, the others as addr.
	q.Set("master_name", master)
	q["addr"] = addrs[1:]
	opts, err := goredis.ParseFailoverURL("redis://" + addrs[0] + "/" + strconv.Itoa(db) + "?" + q.Encode())
	if err != nil {
		return nil, err
	}
	opts.Username, opts.Password = user, password
	opts.SentinelUsername, opts.SentinelPassword = sentinelUser, sentinelPassword
	if tlsOn {
		// No ServerName: crypto/tls then verifies each connection against the host it
		// dials, the Sentinel's or the master's.
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: skipVerify}
	}
	return opts, nil
}

// parseUserinfo decodes "user[:password]", percent-escapes included.
func parseUserinfo(s string) (user, password string, err error) {
	rawUser, rawPassword, _ := strings.Cut(s, ":")
	if user, err = url.PathUnescape(rawUser); err != nil {
		return "", "", errors.New("the user name in the userinfo has a bad %-escape")
	}
	if password, err = url.PathUnescape(rawPassword); err != nil {
		// Not err: it would quote the password.
		return "", "", errors.New("the password in the userinfo has a bad %-escape")
	}
	return user, password, nil
}

// sentinelAddrs parses the host part of a Sentinel URL: host:port addresses separated
// by commas, IPv6 hosts in brackets, a missing port DefaultSentinelPort.
func sentinelAddrs(hosts string) ([]string, error) {
	if hosts == "" {
		return nil, errors.New("no Sentinel address: want redis+sentinel://host:port[,host:port…]/db?master=NAME")
	}
	var out []string
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			return nil, fmt.Errorf("an empty Sentinel address in %q", hosts)
		}
		addr := h
		if !strings.Contains(strings.TrimPrefix(h, "["), ":") || strings.HasSuffix(h, "]") {
			addr = net.JoinHostPort(strings.Trim(h, "[]"), DefaultSentinelPort)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host == "" {
			return nil, fmt.Errorf("Sentinel address %q: want host:port", h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("Sentinel address %q: port %q is not a number from 1 to 65535", h, port)
		}
		out = append(out, addr)
	}
	return out, nil
}

// redactURL hides the passwords of a URL (userinfo and query) in error messages.
func redactURL(rawURL string) string { return secret.RedactURL(rawURL) }
