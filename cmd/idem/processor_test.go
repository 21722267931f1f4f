package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
)

var processorListening = regexp.MustCompile(`^level=INFO msg="idem processor listening" addr=(127\.0\.0\.1:\d+) store=(\S+) latency=0s fail_rate=0 lost_reply_rate=0$`)

func TestProcessorLogsOneLineChargesOnceAndStopsGracefully(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "processor.db")
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	lines, exit := startCommand(ctx, "processor", "--addr", "127.0.0.1:0", "--store", store)
	if !lines.Scan() {
		t.Fatalf("no start line; exit %d", <-exit)
	}
	m := processorListening.FindStringSubmatch(lines.Text())
	if m == nil || m[2] != store {
		t.Fatalf("start line %q", lines.Text())
	}
	rest := restOfLines(lines)

	base := "http://" + m[1]
	charge := func() (int, string) {
		req, _ := http.NewRequest("POST", base+"/v1/processor/charges", strings.NewReader(`{"amount": 2000, "currency": "usd"}`))
		req.Header.Set("Idempotency-Key", "key-processor-cmd")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status, first := charge()
	if status != http.StatusCreated || !strings.Contains(first, `"object":"processor_charge"`) {
		t.Fatalf("POST /v1/processor/charges: %d %s", status, first)
	}
	if status, again := charge(); status != http.StatusCreated || again != first {
		t.Fatalf("the retry: %d %s, want the first charge %s", status, again, first)
	}
	if status, body := get(t, base+"/v1/processor/charges"); status != http.StatusOK || strings.Count(body, `"pch_`) != 1 {
		t.Fatalf("GET /v1/processor/charges: %d %s, want one charge", status, body)
	}
	if status, _ := get(t, base+"/healthz"); status != http.StatusOK {
		t.Fatalf("GET /healthz: %d", status)
	}

	cancel() // SIGINT/SIGTERM
	if code := <-exit; code != exitOK {
		t.Fatalf("exit %d after shutdown", code)
	}
	if more := <-rest; len(more) != 1 || !strings.Contains(more[0], "idem processor stopped") {
		t.Fatalf("after the start line the command logged %q, want only the stop line", more)
	}
}
