package faultproxy_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/faultproxy"
)

// echoServer echoes every connection's bytes back; it stops when the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	wantRead(t, c, msg)
}

// wantRead reads len(want) bytes from c within 10 s and fails unless they are want.
func wantRead(t *testing.T, c net.Conn, want string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}

// wantNothingFor fails if c yields a byte or ends within d: the proxy holds its bytes
// and keeps it open.
func wantNothingFor(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	n, err := c.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes, %v; want nothing until the deadline", n, err)
	}
}

func TestRelaysBothWays(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	c := dial(t, p)
	roundTrip(t, c, "ping")
	roundTrip(t, c, strings.Repeat("x", 100<<10))
	if p.Conns() != 1 {
		t.Fatalf("Conns() = %d, want 1", p.Conns())
	}
}

func TestStallHoldsBytesAndConnectionsUntilResume(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	before := dial(t, p)
	roundTrip(t, before, "a")

	p.Stall()
	if _, err := before.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	during := dial(t, p) // accepted while stalled, not forwarded
	if _, err := during.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	wantNothingFor(t, before, 300*time.Millisecond)
	wantNothingFor(t, during, 10*time.Millisecond)

	p.Resume()
	wantRead(t, before, "held")
	wantRead(t, during, "new")
}

func TestDelayAddsLatencyInBothDirections(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	c := dial(t, p)
	roundTrip(t, c, "warm")
	const d = 100 * time.Millisecond
	p.SetDelay(d)
	start := time.Now()
	roundTrip(t, c, "slow")
	if rt := time.Since(start); rt < 2*d {
		t.Fatalf("a round trip took %v with %v of delay each way", rt, d)
	}
}

func TestResetResetsEveryOpenConnection(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	a, b := dial(t, p), dial(t, p)
	roundTrip(t, a, "a")
	roundTrip(t, b, "b")
	if n := p.Reset(); n != 2 {
		t.Fatalf("Reset() = %d, want 2", n)
	}
	for _, c := range []net.Conn{a, b} {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after Reset: %v, want the connection reset", err)
		}
	}
	roundTrip(t, dial(t, p), "a new connection is proxied")
}

func TestCutAfterCutsARepliesMidway(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	c := dial(t, p)
	roundTrip(t, c, "before the cut")
	p.CutAfter(10)
	if _, err := c.Write(bytes.Repeat([]byte("y"), 100)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if len(got) != 10 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes then %v; want 10 bytes, then the connection reset", len(got), err)
	}
}

func TestCloseEndsEveryConnection(t *testing.T) {
	t.Parallel()
	p := faultproxy.New(t, echoServer(t))
	c := dial(t, p)
	p.Stall()
	_, _ = c.Write([]byte("held"))
	p.Close() // must not wait for the stall
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Close: %v, want the connection ended", err)
	}
}

// TestSetUpstreamMovesNewConnections: after SetUpstream, a new connection reaches the
// other server, and one open before it keeps its own.
func TestSetUpstreamMovesNewConnections(t *testing.T) {
	t.Parallel()
	// A server that answers what it reads upper-cased tells the two apart.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(bytes.ToUpper(buf[:n])); err != nil {
						return
					}
				}
			}()
		}
	}()
	p := faultproxy.New(t, echoServer(t))
	before := dial(t, p)
	roundTrip(t, before, "ping")
	p.SetUpstream(ln.Addr().String())
	after := dial(t, p)
	if _, err := after.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	wantRead(t, after, "PING")
	roundTrip(t, before, "pong")
}
