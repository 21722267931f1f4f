package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// runHoldBodies opens --conns connections to a server and sends each a keyed POST
// that announces --size bytes of body and sends all but the last byte, then holds
// them open: what a thousand hostile clients do to a server's memory. It prints the
// resident memory of --pid (from /proc) before, once every connection sent its bytes,
// and what the server answered the connections it answered early (a refusal).
func runHoldBodies(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("holdbodies", flag.ContinueOnError)
	target := fs.String("url", "", "the server's `URL` (required)")
	conns := fs.Int("conns", 1000, "connections to hold")
	size := fs.Int("size", 1<<20, "announced body `bytes`; all but the last are sent")
	pid := fs.Int("pid", 0, "the server's process id, whose RSS is read (required)")
	settle := fs.Duration("settle", 3*time.Second, "how long to wait after the bytes were sent before reading the RSS")
	if err := fs.Parse(args); err != nil {
		return err
	}
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" || *pid <= 0 {
		return fmt.Errorf("--url and --pid are required")
	}
	before, err := rss(*pid)
	if err != nil {
		return err
	}
	body := make([]byte, *size-1)
	for i := range body {
		body[i] = 'x'
	}
	answered := map[string]int{}
	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i := 0; i < *conns; i++ {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
		if err != nil {
			return fmt.Errorf("connection %d: %w", i+1, err)
		}
		open = append(open, c)
		key := make([]byte, 16)
		_, _ = rand.Read(key)
		fmt.Fprintf(c, "POST /v1/charges HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer sk_hold_%d\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
			u.Host, i, hex.EncodeToString(key), *size)
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(body); err != nil {
			answered["write failed (the server answered or closed)"]++
		}
	}
	time.Sleep(*settle) // a measurement, not a synchronisation: the server reads what was sent
	for _, c := range open {
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		buf := make([]byte, 64)
		if n, _ := c.Read(buf); n > 0 {
			line, _, _ := strings.Cut(string(buf[:n]), "\r\n")
			answered[line]++
		}
	}
	after, err := rss(*pid)
	if err != nil {
		return err
	}
	fmt.Printf("connections %d, body %d bytes announced, %d sent each\n", *conns, *size, *size-1)
	fmt.Printf("RSS before %.1f MB, while held %.1f MB (+%.1f MB, %.2f MB per connection)\n",
		float64(before)/1e6, float64(after)/1e6, float64(after-before)/1e6, float64(after-before)/1e6/float64(*conns))
	for line, n := range answered {
		fmt.Printf("answered early: %d × %s\n", n, line)
	}
	return nil
}

// rss is the resident set size of process pid, in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for process %d", pid)
}
