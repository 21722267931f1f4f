package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// wal tells what each WAL record of a path's requests is: it sends --requests requests
// of each path one at a time to a fresh `benchtool serve`, and reads the WAL they wrote
// with pg_waldump, keeping the records of the benchmark's database (by relation) and
// the commits of the transactions that wrote them. It needs pg_waldump and read access
// to the server's pg_wal (run it as the postgres user, or as root, on the server's
// host). Other databases' records in the same range are left out; their commits too.
func runWAL(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("wal", flag.ContinueOnError)
	server := fs.String("postgres", "postgres://postgres@127.0.0.1:5432", "PostgreSQL server URL without a database: wal makes its own and drops it")
	paths := fs.String("paths", "/plain,/respond,/lease,/intx", "the paths to break down, separated by commas")
	n := fs.Int("requests", 200, "requests of each path")
	waldump := fs.String("waldump", "", "pg_waldump (default: the newest under /usr/lib/postgresql/*/bin)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *waldump == "" {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_waldump")
		if len(found) == 0 {
			return errors.New("no pg_waldump found: give --waldump")
		}
		sort.Strings(found)
		*waldump = found[len(found)-1]
	}
	db := fmt.Sprintf("idem_bench_wal_%d", os.Getpid())
	dbURL, err := withDatabase(*server, db)
	if err != nil {
		return err
	}
	admin, err := pgx.Connect(ctx, mustDatabase(*server, "postgres"))
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	var walDir string
	if err := admin.QueryRow(ctx, `SELECT current_setting('data_directory') || '/pg_wal'`).Scan(&walDir); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return err
	}
	defer func() { _, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") }()
	base, stop, err := startServer(ctx, dbURL, 4)
	if err != nil {
		return err
	}
	defer stop()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var dbOID uint32
	if err := admin.QueryRow(ctx, `SELECT oid FROM pg_database WHERE datname = $1`, db).Scan(&dbOID); err != nil {
		return err
	}
	for i, path := range strings.Split(*paths, ",") {
		prefix := fmt.Sprintf("wal%d", i)
		// Warm up: connections, prepared statements, the first pages of each table.
		if _, err := measure(ctx, base, []string{"--path", path, "--prefix", prefix + "w"}, 1, time.Second); err != nil {
			return err
		}
		if _, err := admin.Exec(ctx, `CHECKPOINT`); err != nil { // full-page images as after any checkpoint
			return err
		}
		var start, end string
		if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&start); err != nil {
			return err
		}
		f := loadFlags{url: base, path: path, prefix: prefix, token: "tok_bench", concurrency: 1}
		if err := sendN(ctx, &f, *n); err != nil {
			return err
		}
		if err := admin.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&end); err != nil {
			return err
		}
		rels, err := relationNames(ctx, conn)
		if err != nil {
			return err
		}
		counts, err := breakDown(ctx, *waldump, walDir, start, end, dbOID, rels)
		if err != nil {
			return err
		}
		fmt.Printf("\n%s: WAL records per request (%d requests, one at a time, after a checkpoint)\n", path, *n)
		keys := make([]string, 0, len(counts))
		total := 0
		for k, c := range counts {
			keys = append(keys, k)
			total += c
		}
		sort.Slice(keys, func(i, j int) bool {
			return counts[keys[i]] > counts[keys[j]] || counts[keys[i]] == counts[keys[j]] && keys[i] < keys[j]
		})
		for _, k := range keys {
			fmt.Printf("  %6.2f  %s\n", float64(counts[k])/float64(*n), k)
		}
		fmt.Printf("  %6.2f  total\n", float64(total)/float64(*n))
	}
	return nil
}

// sendN sends n new keys of f one at a time.
func sendN(ctx context.Context, f *loadFlags, n int) error {
	f.keys = int64(n)
	return prepareKeys(ctx, f)
}

// relationNames maps the relfilenodes of the database's relations to their names.
func relationNames(ctx context.Context, conn *pgx.Conn) (map[string]string, error) {
	rows, err := conn.Query(ctx, `SELECT pg_relation_filenode(oid)::text, relname FROM pg_class WHERE pg_relation_filenode(oid) IS NOT NULL`)
	if err != nil {
		return nil, err
	}
	names := map[string]string{}
	for rows.Next() {
		var node, name string
		if err := rows.Scan(&node, &name); err != nil {
			return nil, err
		}
		names[node] = name
	}
	return names, rows.Err()
}

var (
	walRecord = regexp.MustCompile(`^rmgr: (\S+)\s+len \(rec/tot\):\s+\d+/\s*\d+, tx:\s+(\d+), lsn: \S+, prev \S+, desc: (\S+)(.*)$`)
	walRel    = regexp.MustCompile(`rel \d+/(\d+)/(\d+)`)
	walFPI    = regexp.MustCompile(`FPW|FPI`)
)

// breakDown reads the WAL in [start, end) and counts the records of database dbOID by
// "rmgr desc relation", and the commits of the transactions that wrote them.
func breakDown(ctx context.Context, waldump, dir, start, end string, dbOID uint32, rels map[string]string) (map[string]int, error) {
	out, err := exec.CommandContext(ctx, waldump, "-p", dir, "-s", start, "-e", end).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(out) == 0 {
			return nil, fmt.Errorf("pg_waldump: %v: %s", err, ee.Stderr)
		}
	}
	counts := map[string]int{}
	ours := map[string]bool{} // transactions that wrote our relations
	type rec struct{ rmgr, xid, desc, rest string }
	var all []rec
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := walRecord.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		all = append(all, rec{m[1], m[2], m[3], m[4]})
	}
	for _, r := range all {
		rm := walRel.FindStringSubmatch(r.rest)
		if rm == nil || rm[1] != fmt.Sprint(dbOID) {
			continue
		}
		name := rels[rm[2]]
		if name == "" {
			name = "rel " + rm[2]
		}
		key := r.rmgr + " " + r.desc + " " + name
		if walFPI.MatchString(r.rest) {
			key += " (with a full-page image)"
		}
		counts[key]++
		if r.xid != "0" {
			ours[r.xid] = true
		}
	}
	for _, r := range all {
		if r.rmgr == "Transaction" && ours[r.xid] {
			counts["Transaction "+r.desc]++
		}
	}
	return counts, nil
}
