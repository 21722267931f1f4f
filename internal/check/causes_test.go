package check_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/check"
)

// A server whose completed keys never replay (every retry is refused with 422)
// fails replay, and the checks that need a replay to judge say so, naming what the
// retry got, instead of blaming the refusal, the bad keys or the principals; so they
// do when the replay check does not run and they must find it out themselves.
func TestWhenNothingReplaysLaterChecksSaySoInsteadOfInventingACause(t *testing.T) {
	t.Parallel()
	url := startServer(t, "python3", "testdata/server.py", "--port", "0", "--bug", "no-replay", "--work", "0.05")
	reason := "the endpoint replays no completed key (a retry of the first request got 422 payload_mismatch; see replay)"

	rep := run(t, config(url))
	want(t, rep, map[string]check.Status{
		"replay": check.StatusFail, "changed-body": check.StatusSkip, "other-request": check.StatusSkip,
		"errors-not-stored": check.StatusSkip, "per-principal": check.StatusSkip,
	})
	wantSays(t, rep, "replay", check.StatusFail, "the retry got 422 payload_mismatch where the first request got 201")
	if c := result(t, rep, "replay"); !slicesEqual(c.Causes, "status-differs") {
		t.Errorf("replay causes %v, want [status-differs]", c.Causes)
	}
	wantSays(t, rep, "changed-body", check.StatusSkip, "409 key_reused; whether the refusal kept the key's record cannot be told: "+reason)
	for _, name := range []string{"other-request", "errors-not-stored", "per-principal"} {
		wantSays(t, rep, name, check.StatusSkip, "proves nothing: "+reason)
	}
	if c := result(t, rep, "changed-body"); strings.Contains(c.Summary, "the refusal changed the key's record") {
		t.Errorf("changed-body invents a cause: %q", c.Summary)
	}
	if rep.NewFailures() != 1 {
		t.Errorf("%d failures, want 1 (replay alone)", rep.NewFailures())
	}

	// Without the replay check, changed-body finds out with one retry of its own.
	cfg := config(url)
	cfg.Checks = []*check.Check{check.ChangedBodyCheck}
	rep = run(t, cfg)
	wantSays(t, rep, "changed-body", check.StatusSkip, reason)
	if c := result(t, rep, "changed-body"); !strings.Contains(c.Evidence[len(c.Evidence)-1].Label, "does the endpoint replay a completed key?") {
		t.Errorf("changed-body's evidence does not end with its own retry: %q", c.Evidence[len(c.Evidence)-1].Label)
	}
}

// A server that keeps a key in flight past --timeout after a restart, and frees it
// when its lease ends, fails restart with the right cause: the lease is longer than
// --timeout, and the summary says which --timeout to give; a --timeout above the
// lease passes.
func TestARestartCheckTellsALeaseLongerThanTimeoutFromAStuckKey(t *testing.T) {
	t.Parallel()
	// The records outlive the process (--state); a dead holder's key is taken over 5 s
	// after its claim (more than the restart, on a loaded machine).
	url, between := superviseServer(t, "python3", "testdata/server.py", "--work", "1", "--state", filepath.Join(t.TempDir(), "records.json"), "--lease", "5")
	cfg := config(url)
	cfg.Between = between
	cfg.Timeout = 1500 * time.Millisecond
	cfg.Checks = []*check.Check{check.RestartCheck}
	rep := run(t, cfg)
	wantSays(t, rep, "restart", check.StatusFail, "still in flight after --timeout (1.5 s); the server's lease looks longer: the key got a final answer, 201", "; give --timeout ")
	c := result(t, rep, "restart")
	if !slicesEqual(c.Causes, "lease-longer-than-timeout") || strings.Contains(c.Summary, "stays stuck") {
		t.Errorf("restart: causes %v, %q; want lease-longer-than-timeout, not a stuck key", c.Causes, c.Summary)
	}

	cfg.Timeout = 7 * time.Second
	rep = run(t, cfg)
	wantSays(t, rep, "restart", check.StatusPass, "after --between its retry got 201")
}

// Without Retry-After, a key in flight is asked again after 100 ms, then 200, 400 …
// up to 2 s, not ten times a second; the report says so.
func TestPollingBacksOffWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	const held = 1500 * time.Millisecond
	var (
		mu       sync.Mutex
		done     = map[string]time.Time{}
		retries  int
		answered []byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		at, seen := done[key]
		switch {
		case !seen:
			done[key] = time.Now()
			answered = []byte(`{"id":"ch_1"}`)
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(answered)
		case time.Since(at) < held: // as if the record were not written yet
			retries++
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":{"code":"request_in_progress"}}`))
		default:
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(answered)
		}
	}))
	t.Cleanup(srv.Close)
	cfg := config(srv.URL + "/v1/charges")
	cfg.Checks = []*check.Check{check.ReplayCheck}
	rep := run(t, cfg)
	wantSays(t, rep, "replay", check.StatusPass, "201 again")
	mu.Lock()
	n := retries
	mu.Unlock()
	// 100 + 200 + 400 + 800 ms: 4 or 5 in-flight answers in 1.5 s (a fixed 100 ms
	// would be 15).
	if n < 3 || n > 6 {
		t.Errorf("%d in-flight answers in %v, want 3 to 6 (100 ms doubling)", n, held)
	}
	if !strings.Contains(rep.Polling, "without it after 100ms doubling to 2s") {
		t.Errorf("the report's polling: %q", rep.Polling)
	}
	var text bytes.Buffer
	_ = rep.WriteText(&text)
	if !strings.Contains(text.String(), "polling: after Retry-After") {
		t.Errorf("the text report does not state the polling:\n%s", text.String())
	}
}

// Resources are counted by their id, never by 2xx answers: against a server whose
// duplicates run (and whose replays are 201s too), the report's count is the
// number of charges the server made.
func TestResourcesAreCountedByIdNotBy2xxAnswers(t *testing.T) {
	t.Parallel()
	url := startServer(t, "python3", "testdata/server.py", "--port", "0", "--bug", "race", "--work", "0.3")
	cfg := config(url)
	rep := run(t, cfg)
	made := 0
	for _, h := range []http.Header{cfg.Header, cfg.Other} {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header = h
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		made += strings.Count(string(b), `"id":"ch_`)
	}
	answers := 0
	for _, c := range rep.Checks {
		for _, x := range c.Evidence {
			if x.Response != nil && x.Response.Status == http.StatusCreated && x.Request.Method == http.MethodPost {
				answers++
			}
		}
	}
	if rep.Created != made || answers <= made {
		t.Errorf("the report says %d created, the server made %d charges (%d 201 answers); want the server's count", rep.Created, made, answers)
	}
	var text bytes.Buffer
	_ = rep.WriteText(&text)
	if !strings.Contains(text.String(), fmt.Sprintf("created %d resources", made)) {
		t.Errorf("the totals do not say %d created:\n%s", made, text.String())
	}
}

// Bodies are in the reports only with IncludeBodies: otherwise a body is its length
// and hash, and a 2xx answer the resource it names.
func TestBodiesAreInTheReportsOnlyWhenAskedFor(t *testing.T) {
	t.Parallel()
	url := idemServer{}.start(t)
	for _, include := range []bool{false, true} {
		cfg := config(url)
		cfg.Body = []byte(`{"amount":100,"currency":"usd","customer":"cus_9QXz"}`)
		cfg.IncludeBodies = include
		rep := run(t, cfg)
		var text, js, page bytes.Buffer
		if err := errors.Join(rep.WriteText(&text), rep.WriteJSON(&js), rep.WriteHTML(&page), rep.WriteJUnit(&page)); err != nil {
			t.Fatal(err)
		}
		for name, out := range map[string]string{"text": text.String(), "json": js.String(), "html and junit": page.String()} {
			// The request body's customer; the currency of the request and response
			// bodies. (The text report shows the evidence of failures and warnings
			// only: here, none.)
			for _, data := range []string{"cus_9QXz", "usd"} {
				if shows := strings.Contains(out, data); shows != include && (name != "text" || shows) {
					t.Errorf("IncludeBodies %v: the %s report shows %q: %v", include, name, data, shows)
				}
			}
		}
		if !include && (!strings.Contains(js.String(), `"body_sha256"`) || !strings.Contains(page.String(), " bytes sha256:") || !strings.Contains(page.String(), "(resource: id ch_")) {
			t.Errorf("without bodies the reports lack the hashes and the resources:\n%s", page.String())
		}
		if rep.IncludeBodies != include {
			t.Errorf("the report says include_bodies %v", rep.IncludeBodies)
		}
	}
}

// Multi-instance tallies give each instance once.
func TestATallyNamesEachInstanceOnce(t *testing.T) {
	t.Parallel()
	a, b := idemServer{}, idemServer{}
	cfg := config(a.start(t))
	cfg.Instances = []string{b.start(t)}
	cfg.Checks = []*check.Check{check.ConcurrencyCheck}
	rep := run(t, cfg)
	c := result(t, rep, "concurrent-duplicates")
	for _, inst := range []string{"instance 1: ", "instance 2: "} {
		if n := strings.Count(c.Summary, inst); n != 1 {
			t.Errorf("%q appears %d times in %q, want once", inst, n, c.Summary)
		}
	}
}

func slicesEqual(got []string, want ...string) bool {
	return strings.Join(got, " ") == strings.Join(want, " ")
}

// timedServer is a charges endpoint whose keys replay and whose executions take
// execution each, and, with bunched, a burst's answers but the first wait until 2 s
// after the burst began and come together, as a busy server's delayed answers do
// (its processors shared by every request, a database that takes one write at a
// time); without it, one lock for every key makes a burst's requests run one after
// another (a queue).
func timedServer(t *testing.T, execution time.Duration, bunched bool) string {
	t.Helper()
	var (
		mu       sync.Mutex
		queue    sync.Mutex
		inFlight int
		began    time.Time
		records  = map[string][]byte{}
		next     int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		if key == "" {
			http.Error(w, `{"error":{"code":"key_required"}}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		if b, ok := records[key]; ok {
			mu.Unlock()
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(b)
			return
		}
		next++
		id := next
		wait := execution
		if inFlight == 0 {
			began = time.Now()
		} else if bunched {
			wait = time.Until(began.Add(2 * time.Second))
		}
		inFlight++
		mu.Unlock()
		if !bunched {
			queue.Lock()
		}
		time.Sleep(wait) // the execution, or the wait of a busy server's answer
		if !bunched {
			queue.Unlock()
		}
		b := fmt.Appendf(nil, `{"id":"ch_%08d"}`, id)
		mu.Lock()
		inFlight--
		records[key] = b
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1/charges"
}

// Distinct keys are judged run one at a time (a queue) when their answers came one
// by one, about one execution apart, not when a busy server delayed them and they
// came together: answers from 150 ms to 2 s, where one alone takes 150 ms, spread as
// far as a queue's (TestCheckPassesAgainstIdemPaymentsInBothProfiles warned so
// against idem on SQLite on a loaded machine in some runs, before the gaps were
// looked at), but fourteen of their fifteen gaps are nothing.
func TestDistinctKeysAnsweredTogetherAreNotAQueue(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		bunched bool
		status  check.Status
		says    string
	}{
		{true, check.StatusPass, "16 resources, answered from "},
		{false, check.StatusWarn, "ran one at a time: their answers came one by one from "},
	} {
		cfg := config(timedServer(t, 150*time.Millisecond, c.bunched))
		cfg.Checks = []*check.Check{check.DistinctKeysCheck}
		wantSays(t, run(t, cfg), "distinct-keys", c.status, c.says)
	}
}
