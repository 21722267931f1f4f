package main

import (
	"context"
	"strings"
	"testing"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/mysqltest"
	"github.com/idem-go/idem/internal/testenv"
)

// mysqlStoreURL is a mysql:// URL naming a fresh database of the test server.
func mysqlStoreURL(t *testing.T) string {
	t.Helper()
	dc, err := gomysql.ParseDSN(mysqltest.Database(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	u := "mysql://" + dc.User
	if dc.Passwd != "" {
		u += ":" + dc.Passwd
	}
	return u + "@" + dc.Addr + "/" + dc.DBName
}

// TestMySQLStoreURLsServeMigrateKeysAndPurge: a mysql:// --store works wherever the
// other SQL stores do: migrate creates the schema (twice is a no-op), keys lists it,
// and purge cleans it.
func TestMySQLStoreURLsServeMigrateKeysAndPurge(t *testing.T) {
	t.Parallel()
	store := mysqlStoreURL(t)
	for _, args := range [][]string{
		{"migrate", "--create", "--store", store},
		{"migrate", "--store", store},
		{"keys", "list", "--store", store},
		{"purge", "--store", store},
	} {
		code, stdout, stderr := runCmd(t, args...)
		if code != exitOK {
			t.Fatalf("idem %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, stdout, stderr)
		}
	}
}

// TestProxyOnAMySQLStoreReplaysAKeyedPost: idem proxy --store mysql://… protects the
// upstream as on the other stores (it migrates the fresh database at start).
func TestProxyOnAMySQLStoreReplaysAKeyedPost(t *testing.T) {
	t.Parallel()
	up, calls := countingUpstream(t)
	store := mysqlStoreURL(t)
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	base, _, exit := startProxy(t, ctx, up.URL, store)
	postTwiceRunsOnce(t, base, "key-proxy-mysql-1", calls)
	cancel()
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d after shutdown", code)
	}
}
