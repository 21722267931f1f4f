package client

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// staleConnServer answers the first request of every connection with status (201 with
// a charge, or an idem error) and keeps the connection alive; it reads a later request on the same connection, counts it, and
// closes the connection unanswered, as a server does whose idle timeout strikes as a
// request arrives. The http.Transport underneath then finds its reused connection
// failed after the request was written, and re-sends the request on a new one unless
// it is kept from doing so.
//
// A first request carrying X-Warm-Up waits until warmUps of them have arrived, so that
// as many connections are open (and idle, once answered) when the test begins.
type staleConnServer struct {
	ln       net.Listener
	status   int
	warm     sync.WaitGroup
	requests atomic.Int64 // every request read, warm-ups included
	dropped  atomic.Int64 // requests read and left unanswered
	wg       sync.WaitGroup
}

func newStaleConnServer(t *testing.T, warmUps, status int) *staleConnServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &staleConnServer{ln: ln, status: status}
	s.warm.Add(warmUps)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(c)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

func (s *staleConnServer) url() string { return "http://" + s.ln.Addr().String() }

func (s *staleConnServer) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i := 0; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		s.requests.Add(1)
		if i > 0 {
			s.dropped.Add(1)
			return
		}
		if req.Header.Get("X-Warm-Up") != "" {
			s.warm.Done()
			s.warm.Wait()
		}
		body := `{"object":"charge"}`
		if s.status != http.StatusCreated {
			body = `{"error":{"type":"idempotency_error","code":"store_unavailable","message":"down"}}`
		}
		_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			s.status, http.StatusText(s.status), len(body), body)
	}
}

// warmUp opens n connections to s through base and leaves them idle in its pool.
func (s *staleConnServer) warmUp(t *testing.T, base *http.Transport, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, s.url()+"/warm-up", nil)
			req.Header.Set("X-Warm-Up", "1")
			resp, err := base.RoundTrip(req)
			if err != nil {
				t.Errorf("warm-up: %v", err)
				return
			}
			discard(resp)
		})
	}
	wg.Wait()
}

// requestsSince reports the requests s read after a warm-up of n.
func (s *staleConnServer) requestsSince(n int) int64 { return s.requests.Load() - int64(n) }

// The http.Transport's re-send of a request over a stale keep-alive connection is an
// attempt: with MaxAttempts 1 a POST reaches the server once, with a body (whose
// re-send the Transport refuses through GetBody) and without one (which it keeps
// net/http from re-sending at all).
func TestMaxAttemptsOneNeverSendsAPostTwice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		body io.Reader
	}{
		{"with a body", strings.NewReader(`{"amount": 100, "currency": "usd"}`)},
		{"without a body", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newStaleConnServer(t, 1, http.StatusCreated)
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			srv.warmUp(t, base, 1)
			c := fastClient(&Transport{Base: base, MaxAttempts: 1})
			req, _ := http.NewRequest(http.MethodPost, srv.url()+"/v1/charges", tc.body)
			resp, err := c.Do(req)
			var re *RetryError
			switch {
			case err == nil:
				resp.Body.Close()
				t.Errorf("got %d after %d attempt(s); want the dropped request to fail", resp.StatusCode, Attempts(resp))
			case !errors.As(err, &re) || re.Attempts != 1 || re.Resends != 0:
				t.Errorf("error %v; want a RetryError after 1 attempt and no re-send", err)
			}
			if n := srv.requestsSince(1); n != 1 {
				t.Errorf("the server received the POST %d times; want once (MaxAttempts 1)", n)
			}
			if srv.dropped.Load() == 0 {
				t.Fatal("the server dropped nothing; the test did not exercise a stale connection")
			}
		})
	}
}

// Concurrent POSTs over stale connections cannot re-send more than the budget holds,
// beyond each request's one free retry after a broken connection: each re-send takes
// its token (or that free retry) before it happens. With one token, 20 POSTs whose
// reused connections all fail make at most 20 + 1 re-sends, and the budget never goes
// below zero.
func TestConcurrentResendsNeverOverdrawTheBudget(t *testing.T) {
	t.Parallel()
	const posts = 20
	srv := newStaleConnServer(t, posts, http.StatusCreated)
	base := &http.Transport{MaxIdleConnsPerHost: posts}
	t.Cleanup(base.CloseIdleConnections)
	srv.warmUp(t, base, posts)
	budget := newBudget(0, 0, 1, newFrozenClock().Now) // one token, no deposits, no refill
	c := fastClient(&Transport{Base: base, Budget: budget, MaxAttempts: 10})

	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		resends atomic.Int64
	)
	for range posts {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodPost, srv.url()+"/v1/charges", strings.NewReader(`{"amount": 100, "currency": "usd"}`))
			<-start
			resp, err := c.Do(req)
			var re *RetryError
			switch {
			case err == nil:
				resends.Add(int64(Attempts(resp) - 1))
				resp.Body.Close()
			case errors.As(err, &re):
				resends.Add(int64(re.Attempts - 1))
			default:
				t.Errorf("error %v, want a RetryError", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if tokens := budget.Tokens(); tokens < 0 {
		t.Errorf("budget at %v after the POSTs; a re-send must take its token before it happens", tokens)
	}
	if n := resends.Load(); n > posts+1 {
		t.Errorf("%d re-sends and retries counted for %d requests (one free retry each) and a budget of 1 token", n, posts)
	}
	if n := srv.requestsSince(posts); n > 2*posts+1 {
		t.Errorf("the server received %d POSTs for %d logical requests, one free retry each and 1 token", n, posts)
	}
	if srv.dropped.Load() < 2 {
		t.Fatalf("the server dropped %d requests; the test did not make several POSTs want a re-send", srv.dropped.Load())
	}
}
