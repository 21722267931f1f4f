package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/client"
)

// The crash test's load and faults.
const (
	crashPayouts  = 300                    // logical payouts, each with its own key and reference
	crashClients  = 16                     // clients posting them at once
	crashKills    = 8                      // SIGKILLs of the server
	crashEvery    = 30                     // answers between two kills
	crashDowntime = 500 * time.Millisecond // how long the server stays down
	crashLease    = 3 * time.Second        // the server's lease: a killed request holds its key that long
	crashDrop     = 0.1                    // the share of the bank's replies lost
)

// The crash test: it builds this program and runs it against a fake bank (in this
// process, so that it outlives the kills) that takes up to 100 ms per transfer and
// loses a tenth of its replies after making the transfer. 16 clients, each the client
// package's Transport with its default settings, post 300 payouts while the server is
// SIGKILLed 8 times (down 500 ms each time, mid-transfer), and every payout must get
// its 201. Then it counts, in the database and at the bank: one reservation per payout,
// one transfer per payout, every payout paid with its transfer, and not a cent more
// debited than paid out.
//
//	go test -run Crash -v    # in examples/payouts, with PostgreSQL at 127.0.0.1:5432
func TestCrashesDuplicateNoReservationNorTransfer(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the server and kills it for about half a minute")
	}
	began := time.Now()
	dbURL := testDatabase(t)
	store, err := open(t.Context(), dbURL) // the schema, before the server starts
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	const accounts, balance = 4, 1_000_000_000
	for i := range accounts {
		if _, err := store.Pool().Exec(t.Context(), `INSERT INTO accounts (id, balance) VALUES ($1, $2)`, fmt.Sprintf("acc_%d", i), balance); err != nil {
			t.Fatal(err)
		}
	}
	bank := newFakeBank(crashDrop, 100*time.Millisecond)
	bankSrv := httptest.NewServer(bank)
	t.Cleanup(bankSrv.Close)
	srv := newServerProcess(t, buildServer(t), "-db", dbURL, "-bank", bankSrv.URL,
		"-lease", crashLease.String(), "-completer-interval", "1s")
	srv.start()

	var warnings strings.Builder
	var warningsMu sync.Mutex
	c := client.NewClient(&client.Transport{Logger: slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		warningsMu.Lock()
		defer warningsMu.Unlock()
		return warnings.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	var (
		wg       sync.WaitGroup
		next     atomic.Int64
		answers  = make(chan struct{}, crashPayouts)
		failures atomic.Int64
		firstErr atomic.Value
		paid     atomic.Int64 // the amounts the answers say were paid
	)
	for range crashClients {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < crashPayouts; i = next.Add(1) - 1 {
				amount := 100 + i
				status, body, err := postPayout(c, srv.url(), payoutBody(fmt.Sprintf("acc_%d", i%accounts), amount, "DE89370400440532013000", fmt.Sprintf("order-%04d", i)))
				if err == nil && (status != http.StatusCreated || !strings.Contains(body, `"status":"paid"`)) {
					err = fmt.Errorf("answered %d %s", status, body)
				}
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				} else {
					paid.Add(amount)
				}
				answers <- struct{}{}
			}
		})
	}
	answered, kills, midTransfer := 0, 0, 0
	deadline := time.After(3 * time.Minute)
	await := func(n int) {
		for ; answered < n; answered++ {
			select {
			case <-answers:
			case <-deadline:
				t.Fatalf("%d of %d payouts answered after 3 minutes; the server's last lines:\n%s", answered, crashPayouts, srv.lastLines())
			}
		}
	}
	for kills < crashKills && answered+crashEvery < crashPayouts {
		await(answered + crashEvery)
		if bank.inFlight.Load() > 0 {
			midTransfer++ // killed while it waited on the bank
		}
		srv.kill()
		kills++
		time.Sleep(crashDowntime) // the restart's downtime
		srv.start()
	}
	await(crashPayouts)
	wg.Wait()
	srv.kill()

	if failures.Load() > 0 {
		t.Fatalf("%d of %d payouts failed with the default client, the first: %v", failures.Load(), crashPayouts, firstErr.Load())
	}
	// Reservations: one payout row per reference, each paid with its transfer.
	var rows, references, unpaid int
	var left int64
	err = store.Pool().QueryRow(t.Context(), `SELECT count(*), count(DISTINCT reference), count(*) FILTER (WHERE status <> 'paid' OR transfer_id IS NULL),
		(SELECT sum(balance) FROM accounts WHERE id <> 'acc_demo') FROM payouts`).Scan(&rows, &references, &unpaid, &left)
	if err != nil {
		t.Fatal(err)
	}
	debited := accounts*balance - left
	// Transfers: one per payout at the bank, and the one each payout recorded.
	byPayout := map[string]int{}
	for _, tr := range bank.madeTransfers() {
		byPayout[tr.Reference]++
	}
	duplicateTransfers := 0
	for _, n := range byPayout {
		duplicateTransfers += n - 1
	}
	var recorded int
	for id, n := range byPayout {
		var tid string
		if err := store.Pool().QueryRow(t.Context(), `SELECT coalesce(transfer_id, '') FROM payouts WHERE id = $1`, id).Scan(&tid); err == nil && n > 0 && tid != "" {
			recorded++
		}
	}
	t.Logf("%d payouts from %d clients through %d SIGKILLs (%d while a transfer was in flight): %d reservations (%d duplicate), "+
		"%d transfers (%d duplicate), %d unpaid; the bank got %d requests, answered %d repeats from memory and lost %d replies; %v in all",
		crashPayouts, crashClients, kills, midTransfer, rows, rows-references, len(bank.madeTransfers()), duplicateTransfers, unpaid,
		bank.requests.Load(), bank.repeats.Load(), bank.dropped.Load(), time.Since(began).Round(100*time.Millisecond))
	switch {
	case rows != crashPayouts || references != crashPayouts:
		t.Errorf("%d reservations for %d references, want %d of each: a payout reserved twice, or not at all", rows, references, crashPayouts)
	case len(byPayout) != crashPayouts || duplicateTransfers != 0 || recorded != crashPayouts:
		t.Errorf("%d payouts transferred, %d duplicate transfers, %d recorded; want %d, 0, %d", len(byPayout), duplicateTransfers, recorded, crashPayouts, crashPayouts)
	case unpaid != 0 || debited != paid.Load():
		t.Errorf("%d payouts unpaid, %d debited for %d paid out", unpaid, debited, paid.Load())
	}
	if warnings.Len() > 0 {
		t.Errorf("the clients logged warnings:\n%s", warnings.String())
	}
	// The faults must have happened, or the test proved nothing.
	if kills < crashKills/2 || midTransfer == 0 || bank.dropped.Load() == 0 || bank.repeats.Load() == 0 {
		t.Errorf("%d kills (%d mid-transfer), %d lost replies, %d repeats: the faults did not happen", kills, midTransfer, bank.dropped.Load(), bank.repeats.Load())
	}
}

// postPayout posts one payout through c and returns the status and body.
func postPayout(c *http.Client, url, body string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/payouts", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_crash")
	resp, err := c.Do(req) // adds an Idempotency-Key, kept across its attempts
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// buildServer builds this program, as a user would run it.
func buildServer(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "payouts")
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// serverProcess is the payouts server, run from its binary, on one address at every
// start.
type serverProcess struct {
	t    *testing.T
	bin  string
	addr string
	args []string
	cmd  *exec.Cmd
	logs *io.PipeWriter // its stderr

	mu    sync.Mutex
	lines []string // the last lines of its log
}

func newServerProcess(t *testing.T, bin string, args ...string) *serverProcess {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	s := &serverProcess{t: t, bin: bin, addr: addr, args: args}
	t.Cleanup(s.kill)
	return s
}

func (s *serverProcess) url() string { return "http://" + s.addr }

// start starts the server and returns once it listens.
func (s *serverProcess) start() {
	s.t.Helper()
	cmd := exec.Command(s.bin, append([]string{"-addr", s.addr}, s.args...)...)
	logs, w := io.Pipe()
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	s.cmd, s.logs = cmd, w
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(logs)
		ready := false
		for sc.Scan() {
			s.keep(sc.Text())
			if !ready && strings.Contains(sc.Text(), "listening on "+s.addr) {
				ready = true
				close(listening)
			}
		}
	}()
	select {
	case <-listening:
	case <-time.After(time.Minute):
		s.t.Fatalf("the server did not start; its last lines:\n%s", s.lastLines())
	}
}

func (s *serverProcess) keep(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, line)
	if len(s.lines) > 50 {
		s.lines = s.lines[1:]
	}
}

func (s *serverProcess) lastLines() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

// kill SIGKILLs the server, if it runs, and waits for it to exit.
func (s *serverProcess) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	_ = s.logs.Close()
	s.cmd = nil
}
