package redis_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/store/redis"
	"github.com/idem-go/idem/store/redis/redistest"
	"github.com/idem-go/idem/store/storetest"
)

// multiProcess hands storetest.RunMultiProcess a Redis URL and a fresh key prefix,
// joined as "<url>|<prefix>" into the DSN that the children receive.
func multiProcess(newURL func(t testing.TB) string) storetest.MultiProcess {
	return storetest.MultiProcess{
		NewDSN: func(t testing.TB) string {
			return newURL(t) + "|" + testenv.Name("idemtest") + ":"
		},
		Open: func(t testing.TB, dsn string) idemstore.Store {
			url, prefix, _ := strings.Cut(dsn, "|")
			s, err := redis.Open(t.Context(), url, redis.Config{KeyPrefix: prefix, Logger: discardLogger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if !storetest.IsChild() {
					deletePrefix(t, s.Client(), prefix)
				}
				s.Close()
			})
			return s
		},
	}
}

func TestClaimIsExclusiveAcrossProcesses(t *testing.T) {
	t.Parallel()
	storetest.RunMultiProcess(t, multiProcess(func(t testing.TB) string { return testenv.RedisURL(t) }))
}

// The cluster starts in NewDSN, which runs in the parent only; the children reach it
// through the DSN.
func TestClusterClaimIsExclusiveAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster; skipped with -short")
	}
	t.Parallel()
	storetest.RunMultiProcess(t, multiProcess(func(t testing.TB) string { return redistest.StartCluster(t).URL() }))
}
