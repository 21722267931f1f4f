package postgres_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgtest"
	"github.com/idem-go/idem/store/postgres"
)

// These tests re-execute the test binary: each child runs the same test function,
// which sees IDEM_PG_CHILD and plays its part instead. Children open their own pools,
// report "ready", and wait for the parent's "go" on stdin, so that all of them act at
// the same moment without any sleep.

const (
	childEnv       = "IDEM_PG_CHILD"
	childURLEnv    = "IDEM_PG_URL"
	childSchemaEnv = "IDEM_PG_SCHEMA"
	childPrefix    = "idem-child: "
	processes      = 4
	keysPerRun     = 50
)

func TestClaimIsExclusiveAcrossProcesses(t *testing.T) {
	if os.Getenv(childEnv) == "claim" {
		childClaim(t)
		return
	}
	t.Parallel()
	dbURL, schema := pgtest.Schema(t)
	s, err := postgres.Open(t.Context(), dbURL, postgres.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}

	lines := runChildren(t, "TestClaimIsExclusiveAcrossProcesses", "claim", dbURL, schema)
	winners := map[string][]string{} // key → "child/token" that acquired it
	for child, out := range lines {
		for _, l := range out {
			if key, token, ok := strings.Cut(strings.TrimPrefix(l, "won "), " "); ok && strings.HasPrefix(l, "won ") {
				winners[key] = append(winners[key], fmt.Sprintf("%d/%s", child, token))
			}
		}
	}
	for i := range keysPerRun {
		key := fmt.Sprintf("key-%03d", i)
		w := winners[key]
		if len(w) != 1 {
			t.Errorf("%s acquired by %d processes (%v), want exactly 1", key, len(w), w)
			continue
		}
		rec, err := s.RecordGet(t.Context(), &idem.RecordGetParams{Scope: "scope", Key: key})
		if err != nil {
			t.Fatalf("RecordGet(%s): %v", key, err)
		}
		if _, token, _ := strings.Cut(w[0], "/"); rec.Token != token {
			t.Errorf("%s held by token %q, but process %s reported winning", key, rec.Token, w[0])
		}
	}
}

// childClaim claims every key once, with its own tokens, and reports the keys it won.
func childClaim(t *testing.T) {
	ctx := context.Background()
	s, err := postgres.Open(ctx, os.Getenv(childURLEnv), postgres.Config{Schema: os.Getenv(childSchemaEnv)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil { // connect before "ready", so the race is on the claims
		t.Fatal(err)
	}
	awaitGo(t)
	fp := idem.Fingerprint{Version: idem.FingerprintVersion}
	for i := range keysPerRun {
		p := &idem.RecordClaimParams{
			Scope: "scope", Key: fmt.Sprintf("key-%03d", i), Fingerprint: fp,
			Token: fmt.Sprintf("tok-%d-%d", os.Getpid(), i), RecordID: fmt.Sprintf("rec-%d-%d", os.Getpid(), i),
			Lease: time.Minute, TTL: time.Hour,
		}
		res, err := s.RecordClaim(ctx, p)
		if err != nil {
			t.Fatalf("RecordClaim(%s): %v", p.Key, err)
		}
		if res.Outcome == idem.ClaimAcquired {
			fmt.Printf("%swon %s %s\n", childPrefix, p.Key, p.Token)
		} else if res.Outcome != idem.ClaimInFlight {
			t.Fatalf("RecordClaim(%s) = %v, want acquired or in_flight", p.Key, res.Outcome)
		}
	}
}

func TestMigrateConcurrentlyAcrossProcesses(t *testing.T) {
	if os.Getenv(childEnv) == "migrate" {
		childMigrate(t)
		return
	}
	t.Parallel()
	dbURL, parent := pgtest.Schema(t)
	schema := parent + "_fresh" // does not exist yet: the children race to create it
	t.Cleanup(func() { pgtest.Exec(t, dbURL, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE") })

	lines := runChildren(t, "TestMigrateConcurrentlyAcrossProcesses", "migrate", dbURL, schema)
	for child, out := range lines {
		if !slices.Contains(out, "migrated") {
			t.Errorf("child %d did not report a successful migration: %q", child, out)
		}
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n, distinct int
	err = conn.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT version) FROM `+
		pgx.Identifier{schema, "idem_migrations"}.Sanitize()).Scan(&n, &distinct)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 || n != distinct {
		t.Errorf("idem_migrations holds %d rows for %d versions, want each version once", n, distinct)
	}
}

func childMigrate(t *testing.T) {
	ctx := context.Background()
	s, err := postgres.Open(ctx, os.Getenv(childURLEnv), postgres.Config{Schema: os.Getenv(childSchemaEnv)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	awaitGo(t)
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	fmt.Printf("%smigrated\n", childPrefix)
}

// awaitGo tells the parent this child is ready and blocks until it says go.
func awaitGo(t *testing.T) {
	fmt.Printf("%sready\n", childPrefix)
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "go" {
		t.Fatalf("waiting for go: %q, %v", line, err)
	}
}

// runChildren starts `processes` children running test in mode, releases them together
// once all are ready, waits for them, and returns each child's reported lines.
func runChildren(t *testing.T, test, mode, dbURL, schema string) [][]string {
	t.Helper()
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		lines chan string
		// stderr is filled by exec's copier, stdout (the lines that are not reports)
		// by the scanner goroutine; both are complete once lines is closed and Wait
		// returned.
		stderr, stdout strings.Builder
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	children := make([]*child, processes)
	for i := range children {
		c := &child{lines: make(chan string, keysPerRun+8)}
		c.cmd = exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
		c.cmd.Env = append(os.Environ(), childEnv+"="+mode, childURLEnv+"="+dbURL, childSchemaEnv+"="+schema)
		c.cmd.Stderr = &c.stderr
		stdout, err := c.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(c.lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if l, ok := strings.CutPrefix(sc.Text(), childPrefix); ok {
					c.lines <- l
				} else {
					c.stdout.WriteString(sc.Text() + "\n")
				}
			}
		}()
		children[i] = c
	}
	for i, c := range children {
		if l, ok := <-c.lines; !ok || l != "ready" {
			for range c.lines {
			}
			err := c.cmd.Wait()
			t.Fatalf("child %d did not get ready (%q): %v; output:\n%s%s", i, l, err, c.stdout.String(), c.stderr.String())
		}
	}
	for _, c := range children {
		_, _ = io.WriteString(c.stdin, "go\n")
		c.stdin.Close()
	}
	out := make([][]string, processes)
	for i, c := range children {
		for l := range c.lines {
			out[i] = append(out[i], l)
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("child %d: %v; output:\n%s%s", i, err, c.stdout.String(), c.stderr.String())
		}
	}
	return out
}
