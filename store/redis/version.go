package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// minMajorVersion is the oldest Redis major version the store runs on: Redis 7.0 is
// the first whose scripts declare flags (#!lua flags=…), which the store needs so that
// a full Redis refuses new claims while work already running can still store its
// outcome (see scripts.go). Valkey reports a redis_version of 7.2 or later too.
const minMajorVersion = 7

// checkVersion refuses a Redis older than 7.0 (on any master of a cluster). A server
// that does not answer INFO, or answers a version it cannot parse, passes: its first
// script will say whether it can run flagged scripts.
func (s *Store) checkVersion(ctx context.Context) error {
	check := func(ctx context.Context, c goredis.Cmdable, node string) error {
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return nil
		}
		return versionError(node, infoField(info, "redis_version"))
	}
	if cc, ok := s.client.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return check(ctx, c, c.Options().Addr)
		})
	}
	return check(ctx, s.client, s.nodeName())
}

// versionError returns an error when version (redis_version) is older than 7.0.
func versionError(node, version string) error {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	if err != nil || n >= minMajorVersion {
		return nil
	}
	return fmt.Errorf("redis store: %s runs Redis %s; idem needs Redis 7.0 or later, whose Lua scripts declare flags, "+
		"so that a full Redis refuses new claims while requests already running can still store their responses", node, version)
}

// infoField returns the value of name in an INFO answer ("name:value" lines).
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
