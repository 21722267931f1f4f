package redis

import (
	"fmt"
	"strings"

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

// IsURL reports whether rawURL names a Redis store (redis://, rediss://,
// redis+cluster:// or rediss+cluster://), so that a command can route a --store URL.
func IsURL(rawURL string) bool {
	scheme, _, ok := strings.Cut(rawURL, "://")
	if !ok {
		return false
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss", SchemeCluster, SchemeClusterTLS:
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
//
// The single-server forms are parsed by [goredis.ParseURL]; the cluster forms by
// [goredis.ParseClusterURL] after the "+cluster" suffix is dropped from the scheme. A
// cluster URL needs only one reachable seed node (more addr parameters make start-up
// survive a dead seed); the client discovers every master and replica itself. Both
// forms accept go-redis's snake_case options as query parameters, such as
// dial_timeout=3s or pool_size=20. A cluster has no databases, so its URL has no /db.
//
// The client honours the deadlines of the contexts it is given
// (ContextTimeoutEnabled), so that the middleware's StoreTimeout and the lease bound
// every call even when read_timeout is longer; a client passed to [NewFromClient]
// should enable it too.
func NewClient(rawURL string) (goredis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, fmt.Errorf("redis store: URL %q has no scheme (want redis://, rediss://, %s:// or %s://)", redactURL(rawURL), SchemeCluster, SchemeClusterTLS)
	}
	switch strings.ToLower(scheme) {
	case "redis", "rediss":
		opts, err := goredis.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("redis store: URL %q: %w", redactURL(rawURL), secret.RedactURLError(err))
		}
		opts.ContextTimeoutEnabled = true
		return goredis.NewClient(opts), nil
	case SchemeCluster, SchemeClusterTLS:
		base := strings.TrimSuffix(strings.ToLower(scheme), "+cluster")
		opts, err := goredis.ParseClusterURL(base + "://" + rest)
		if err != nil {
			return nil, fmt.Errorf("redis store: URL %q: %w", redactURL(rawURL), secret.RedactURLError(err))
		}
		opts.ContextTimeoutEnabled = true
		return goredis.NewClusterClient(opts), nil
	default:
		return nil, fmt.Errorf("redis store: URL %q: unknown scheme %q (want redis://, rediss://, %s:// or %s://)", redactURL(rawURL), scheme, SchemeCluster, SchemeClusterTLS)
	}
}

// redactURL hides the passwords of a URL (userinfo and query) in error messages.
func redactURL(rawURL string) string { return secret.RedactURL(rawURL) }
