package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestFlushStreamsAndIsNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n int
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "part 1\n")
		w.(http.Flusher).Flush()
		io.WriteString(w, "part 2\n")
	}))
	first := serve(mw, req("POST", "/x", key, "{}"))
	if first.Code != 200 || first.Body.String() != "part 1\npart 2\n" || !first.Flushed {
		t.Errorf("streamed response: %d %q flushed=%v", first.Code, first.Body, first.Flushed)
	}
	if first.Header().Get("Idempotency-Key") != key || first.Header().Get("Content-Type") != "text/event-stream" {
		t.Errorf("streamed headers: %v", first.Header())
	}
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), 409, idem.CodeResponseNotStored)
	if n != 1 {
		t.Errorf("handler ran %d times: a streamed operation must never run again", n)
	}
}

func TestResponseOverTheLimitIsSentButNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.MaxResponseBytes = 10 })
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, "0123456789")
		io.WriteString(w, "abc")
	}))
	first := serve(mw, req("POST", "/x", key, "{}"))
	if first.Code != 201 || first.Body.String() != "0123456789abc" {
		t.Errorf("over-limit response: %d %q", first.Code, first.Body)
	}
	wantCode(t, serve(mw, req("POST", "/x", key, "{}")), 409, idem.CodeResponseNotStored)
}

func TestResponseAtTheLimitIsStored(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *idem.Config) { c.MaxResponseBytes = 10 })
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "01234")
		io.WriteString(w, "56789")
	}))
	serve(mw, req("POST", "/x", key, "{}"))
	w := serve(mw, req("POST", "/x", key, "{}"))
	if w.Code != 200 || w.Body.String() != "0123456789" || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %q", w.Code, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" {
		t.Errorf("sniffed Content-Type %q must be stored", ct)
	}
}

func TestStreamingReleaseStatusStillReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var n int
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		w.WriteHeader(503)
		w.(http.Flusher).Flush()
	}))
	serve(mw, req("POST", "/x", key, "{}"))
	serve(mw, req("POST", "/x", key, "{}"))
	if n != 2 {
		t.Errorf("a streamed 503 must release the key; ran %d times", n)
	}
}

func TestCaptureRefusesHijackAndHasNoReadFrom(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := http.NewResponseController(w).Hijack(); !errors.Is(err, http.ErrNotSupported) {
			t.Errorf("Hijack: %v, want ErrNotSupported", err)
		}
		if _, ok := w.(io.ReaderFrom); ok {
			t.Error("the capture must not expose ReadFrom")
		}
		w.WriteHeader(http.StatusSwitchingProtocols) // refused: not sent, not recorded
		w.WriteHeader(201)
	}))
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 201 {
		t.Errorf("got %d", w.Code)
	}
}

// deadlineWriter records the deadlines http.NewResponseController sets through Unwrap.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	deadline time.Time
}

func (d *deadlineWriter) SetWriteDeadline(t time.Time) error { d.deadline = t; return nil }

func TestCaptureUnwrapReachesTheUnderlyingWriter(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	when := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).SetWriteDeadline(when); err != nil {
			t.Errorf("SetWriteDeadline: %v", err)
		}
		w.WriteHeader(201)
	}))
	dw := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	mw.ServeHTTP(dw, req("POST", "/x", key, "{}"))
	if !dw.deadline.Equal(when) {
		t.Errorf("deadline %v did not reach the underlying writer", dw.deadline)
	}
}

func TestInformationalResponsesPassThroughUnrecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.WriteHeader(201)
		io.WriteString(w, "done")
	}))
	srv := httptest.NewServer(mw)
	defer srv.Close()
	post := func() (*http.Response, []int) {
		var got []int
		trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			got = append(got, code)
			return nil
		}}
		ctx := httptrace.WithClientTrace(context.Background(), trace)
		r, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/x", strings.NewReader("{}"))
		r.Header.Set("Authorization", "Bearer alice")
		r.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		return resp, got
	}
	resp, infos := post()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(body) != "done" || len(infos) != 1 || infos[0] != 103 {
		t.Errorf("first: %d %q, informational %v", resp.StatusCode, body, infos)
	}
	resp, infos = post()
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(body) != "done" || len(infos) != 0 || resp.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay: %d %q, informational %v (must not be recorded)", resp.StatusCode, body, infos)
	}
}

// A 1xx's header fields are the handler's header as it was then: a handler that clears
// its header after a 103 (as httputil.ReverseProxy does) sends its final response
// without them, and stores it so; one that keeps them sends and stores them with it.
func TestInformationalHeadersReachTheFinalResponseOnlyAsTheHandlerKeepsThem(t *testing.T) {
	t.Parallel()
	for _, keep := range []bool{false, true} {
		b := setup(t, nil)
		srv := httptest.NewServer(b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			if !keep {
				clear(w.Header())
			}
			w.WriteHeader(201)
		})))
		k := fmt.Sprintf("%s-%v", key, keep)
		for i := range 2 {
			r, _ := http.NewRequest("POST", srv.URL+"/x", strings.NewReader("{}"))
			r.Header.Set("Authorization", "Bearer alice")
			r.Header.Set("Idempotency-Key", k)
			resp, err := srv.Client().Do(r)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Get("Link") != ""; got != keep || resp.StatusCode != 201 {
				t.Errorf("keep %v, answer %d (replayed %q): status %d, Link present %v", keep, i+1, resp.Header.Get("Idempotent-Replayed"), resp.StatusCode, got)
			}
		}
		srv.Close()
	}
}

func TestHandlerWithoutWriteHeaderAnswers200(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	serve(mw, req("POST", "/x", key, "{}"))
	if w := serve(mw, req("POST", "/x", key, "{}")); w.Code != 200 || w.Header().Get("Idempotent-Replayed") != "true" {
		t.Errorf("got %d", w.Code)
	}
}

func TestNoContentRefusesABody(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	mw := b.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(204)
		if _, err := w.Write([]byte("x")); !errors.Is(err, http.ErrBodyNotAllowed) {
			t.Errorf("Write after 204: %v", err)
		}
	}))
	if w := serve(mw, req("DELETE", "/x", key, "")); w.Code != 204 || w.Body.Len() != 0 {
		t.Errorf("got %d %q", w.Code, w.Body)
	}
}
