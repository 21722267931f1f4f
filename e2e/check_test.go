package e2e

import (
	"bufio"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/check"
	"github.com/idem-go/idem/internal/testenv"
)

// idem check's restart check (--between) against idem itself: `idem payments` and
// `idem proxy` SIGKILLed while a request holds its key, and started again on the
// same address and SQLite file. The key is not stuck: once its lease (--lock-timeout
// 1s) lapses, payments takes it over and charges (201), and the proxy answers 500
// outcome_unknown (--on-lapse unknown); both are final answers within the check's
// timeout, and the check passes.
func TestIdemCheckFindsNoKeyStuckAfterARestartOfIdem(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		start func(t *testing.T, store string) *server
		says  string
	}{
		{"payments", func(t *testing.T, store string) *server {
			return startServer(t, "--store", store, "--processor-latency", "3s", "--lock-timeout", "1s")
		}, "after --between its retry got 201"},
		{"proxy", func(t *testing.T, store string) *server {
			up := startUpstream(t, langNode, "--delay", "3000")
			s := newCommand(t, "proxy", "--upstream", up.url, "--store", store, "--lock-timeout", "1s", "--ttl", "1h")
			s.start("127.0.0.1:0")
			return s
		}, "a final answer, 500 outcome_unknown"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			db := filepath.Join(dir, "idem.db")
			s := c.start(t, "sqlite:"+db)
			killFIFO, upFIFO := filepath.Join(dir, "kill"), filepath.Join(dir, "up")
			for _, f := range []string{killFIFO, upFIFO} {
				if err := syscall.Mkfifo(f, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cfg := check.Config{
				URL:     s.URL() + "/v1/charges",
				Body:    chargeJSON(2000),
				Header:  http.Header{"Authorization": {"Bearer sk_test_restart"}},
				Timeout: 15 * time.Second,
				Checks:  []*check.Check{check.RestartCheck},
				// The command hands the test its key and waits until the server is
				// back: the test kills and restarts it.
				Between: `echo "$IDEM_CHECK_KEY" > ` + killFIFO + ` && read -r _ < ` + upFIFO,
			}
			type result struct {
				rep *check.Report
				err error
			}
			done := make(chan result, 1)
			go func() {
				rep, err := check.Run(testenv.Context(t), cfg)
				done <- result{rep, err}
			}()
			// O_RDWR does not wait for a writer, and the scanner ends when the test
			// closes the file, so that a run that ends before its command leaves no
			// goroutine behind.
			f, err := os.OpenFile(killFIFO, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			keys := make(chan string, 1)
			go func() {
				sc := bufio.NewScanner(f)
				if sc.Scan() {
					keys <- strings.TrimSpace(sc.Text())
				}
				close(keys)
			}()
			var key string
			select {
			case key = <-keys:
			case r := <-done:
				t.Fatalf("the check ended before its --between command ran: %v %+v", r.err, r.rep)
			}
			waitInFlight(t, db, key)
			s.kill()
			s.restart()
			up, err := os.OpenFile(upFIFO, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = up.WriteString("up\n")
			up.Close()
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			got := r.rep.Checks[0]
			if got.Status != check.StatusPass || !strings.Contains(got.Summary, c.says) {
				var text strings.Builder
				_ = r.rep.WriteText(&text)
				t.Errorf("restart: %s (%s), want pass saying %q\n%s", got.Status, got.Summary, c.says, text.String())
			}
		})
	}
}
