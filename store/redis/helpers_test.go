package redis_test

import (
	"context"
	"strconv"

	goredis "github.com/redis/go-redis/v9"
)

func itoa(n int) string { return strconv.Itoa(n) }

// go-redis logs its own retries and dial failures to stderr; the tests that take Redis
// down (a kill, a failover) would fill their output with them. The store reports what
// matters as errors.
func init() { goredis.SetLogger(quietGoRedis{}) }

type quietGoRedis struct{}

func (quietGoRedis) Printf(context.Context, string, ...any) {}
