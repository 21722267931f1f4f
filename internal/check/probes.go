package check

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/client"
)

// SpreadDuplicatesCheck: duplicates that arrive at any moment of the first request's
// execution, not only at once, get an in-flight answer or its replay.
var SpreadDuplicatesCheck = &Check{
	Name: "spread-duplicates",
	Doc:  "duplicates of one key sent one after another across the first request's whole execution (and just after it) each get an in-flight answer or the replay: never an error, never a second resource",
	rule: rules("§5.1 (one claim wins), §5.2 (a duplicate in flight gets 409 request_in_progress), §5.4 (a completed key replays); a record is written whole (§7)",
		"§5.1, §5.2, §5.4; IETF draft 2.6 (a duplicate gets 409 while the first runs, its result once it completed)",
		"§5.1, §5.2, §5.4; Stripe (a concurrent duplicate gets 409, a later one the first result)"),
	run: runSpreadDuplicates,
}

// spreadSpan is how long, in durations of one execution, the spread duplicates go on:
// past the execution's end, where a library writes its record (in two steps, some).
const spreadSpan = 1.5

// minExecution is the shortest duration of one execution the spread duplicates are
// paced by.
const minExecution = 20 * time.Millisecond

func runSpreadDuplicates(ctx context.Context, e *env) Result {
	var rounds []roundResult
	took := time.Duration(e.fixture.Elapsed)
	for round := range e.cfg.Rounds {
		rr, first := e.spreadRound(ctx, round+1, took)
		rounds = append(rounds, rr)
		if first.Response != nil {
			took = time.Duration(first.Elapsed)
		}
	}
	return e.judgeRounds(rounds, func(roundsText, where string) string {
		return fmt.Sprintf("%s of %d duplicates spread over the first request's execution%s, one resource each", roundsText, e.cfg.Concurrency, where)
	})
}

// spreadRound sends a fresh key's first request and, while it runs, Concurrency
// duplicates of it, evenly spaced over spreadSpan times took (the duration of one
// execution measured before), each sent without waiting for the others' answers; then
// the key once more, and judges the answers as a burst's. It returns the round and the
// first request's exchange.
func (e *env) spreadRound(ctx context.Context, round int, took time.Duration) (roundResult, *Exchange) {
	n := e.cfg.Concurrency
	key := client.NewKey()
	took = max(took, minExecution)
	step := time.Duration(float64(took) * spreadSpan / float64(n))
	xs := make([]*Exchange, n+1)
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		xs[0] = e.send(ctx, request{label: fmt.Sprintf("round %d: the first request", round), body: e.body, keys: []string{key}})
	})
	for i := 1; i <= n; i++ {
		at := time.Duration(i) * step
		t := time.NewTimer(time.Until(start.Add(at)))
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		wg.Go(func() {
			xs[i] = e.send(ctx, request{label: fmt.Sprintf("round %d: duplicate %d of %d, %s after the first request", round, i, n, at.Round(time.Millisecond)),
				body: e.body, keys: []string{key}, instance: i % len(e.urls)})
		})
	}
	wg.Wait()
	after := e.sendUntilFinal(ctx, request{label: fmt.Sprintf("round %d: afterwards, the same key and body again", round), body: e.body, keys: []string{key}, instance: (round - 1) % len(e.urls)})
	what := fmt.Sprintf("%d requests spread over the first one's execution (a duplicate every %s)", n+1, step.Round(time.Millisecond))
	return e.judgeDuplicates(ctx, round, what, xs, after), xs[0]
}

// DistinctKeysCheck: requests with distinct keys, sent at once, all run.
var DistinctKeysCheck = &Check{
	Name: "distinct-keys",
	Doc:  "requests with distinct fresh keys sent at once all run, each as itself, about as fast as one alone: keys are locked one by one, not by one lock for all (which refuses them, or runs them one at a time)",
	rule: rules("§5.1 (a claim is of one (scope, key): other keys never wait for it); IETF draft 2.6 (a key identifies one request, not the resource)", "", ""),
	run:  runDistinctKeys,
}

// queueShare is the share of Concurrency executions by which the first and last
// answers of a burst of distinct keys must lie apart for the burst to have run one at
// a time: one request after another, their answers come one execution apart, where
// requests that share the server's processors (or wait on I/O) end together.
const queueShare = 0.5

// queueGaps is the share of the gaps between a burst's consecutive answers that must
// each be half an execution or more for the burst to have run one at a time: a
// request behind a lock answers one execution after the one before it, so no two
// answers of a queue come together. Answers that a busy server's processors delay
// (a loaded machine, a database that takes one write at a time) spread too, as far
// apart as a queue's, but come in clusters: a spread alone would call such a server a
// queue in one run and not in the next.
const queueGaps = 0.75

// oneAtATime reports whether answers that came after the durations ds (in any order)
// came one at a time, each about one execution (one) after the one before it: at
// least queueGaps of the gaps between consecutive answers are one/2 or more.
func oneAtATime(ds []time.Duration, one time.Duration) bool {
	if len(ds) < 2 {
		return false
	}
	ds = slices.Sorted(slices.Values(ds))
	apart := 0
	for i := 1; i < len(ds); i++ {
		if ds[i]-ds[i-1] >= one/2 {
			apart++
		}
	}
	return float64(apart) >= queueGaps*float64(len(ds)-1)
}

// minQueueExecution is the shortest duration of one execution for which the check
// tells a queue from a burst served at once: below it, the server's processors, a
// database that takes one write at a time (SQLite) and the scheduling of the client
// decide the spread of the answers as much as a lock would, and a lock that short
// costs little.
const minQueueExecution = 100 * time.Millisecond

func runDistinctKeys(ctx context.Context, e *env) Result {
	n := e.cfg.Concurrency
	alone := e.send(ctx, request{label: "one request with a fresh key, alone (how long one takes)", body: e.body, keys: []string{client.NewKey()}})
	ev := []*Exchange{alone}
	switch {
	case alone.Response == nil:
		return fail(ev, "no-answer", "a request with a fresh key, alone, got %s", alone.describe())
	case !alone.ok():
		return skip(ev, "a request with a fresh key, alone, got %s: nothing to compare a burst with", alone.describe())
	}
	rs := make([]request, n)
	for i := range rs {
		rs[i] = request{label: fmt.Sprintf("distinct key %d of %d, sent at once", i+1, n), body: e.body, keys: []string{client.NewKey()}, instance: i % len(e.urls)}
	}
	burst := e.burst(ctx, rs)
	ev = append(ev, burst...)
	tally := tallyAnswers(burst, len(e.urls) > 1)
	var refused []*Exchange
	var resources []string // named by an id or a Location
	unnamed := 0           // 2xx answers naming none (an empty 204)
	first, last := time.Duration(-1), time.Duration(0)
	var took []time.Duration // of the 2xx answers
	for _, x := range burst {
		if !x.ok() {
			refused = append(refused, x)
			continue
		}
		took = append(took, time.Duration(x.Elapsed))
		if id := resourceOf(x); id != "" && !slices.Contains(resources, id) {
			resources = append(resources, id)
		} else if id == "" {
			unnamed++
		}
		d := time.Duration(x.Elapsed)
		if first < 0 || d < first {
			first = d
		}
		last = max(last, d)
	}
	// One execution: the request alone, or the fastest of the burst, if faster (the
	// one alone may have met a busy moment).
	one := time.Duration(alone.Elapsed)
	if first >= 0 {
		one = min(one, first)
	}
	ran := n - len(refused)
	switch {
	case len(refused) > 0:
		return fail(ev, "distinct-keys-refused", "%d of %d requests with distinct fresh keys, sent at once, got no 2xx (%s): a lock over every key (a global lock) turns other clients' requests away, or keeps them waiting, while one runs; answers: %s",
			len(refused), n, refused[0].describe(), tally)
	case len(resources)+unnamed < ran:
		return fail(ev, "distinct-keys-shared", "%d requests with distinct fresh keys ran as %d resources (%s): requests of different keys were answered as one; answers: %s",
			ran, len(resources), list(resources, 3), tally)
	case one >= minQueueExecution && last-first >= time.Duration(queueShare*float64(n))*one && oneAtATime(took, one):
		return warn(ev, "%d requests with distinct fresh keys, sent at once, ran one at a time: their answers came one by one from %s to %s, where one alone takes %s: one lock for every key (a queue), or a server that serves one request at a time",
			n, first.Round(time.Millisecond), last.Round(time.Millisecond), one.Round(time.Millisecond))
	case one < minQueueExecution:
		return pass(ev, "%d requests with distinct fresh keys at once, %d resources (one alone takes %s, too short to tell a queue)", n, len(resources), one.Round(time.Millisecond))
	}
	return pass(ev, "%d requests with distinct fresh keys at once, %d resources, answered from %s to %s (one alone: %s)", n, len(resources), first.Round(time.Millisecond), last.Round(time.Millisecond), one.Round(time.Millisecond))
}

// PatchCheck: a PATCH with a key is replayed, not run again.
var PatchCheck = &Check{
	Name: "patch",
	Doc:  "a PATCH of the first request's resource, sent twice with one fresh key, gets its first answer again (a PATCH is not idempotent: keys are for it as for POST)",
	rule: rules("§2 (PATCH: a key is required and honoured like POST's); §5.4 (a retry gets the first answer); IETF draft 1 (keys make POST and PATCH fault-tolerant)", "", ""),
	run:  runPatch,
}

// patchTarget is the URL of the first request's resource: its Location, resolved
// against the URL, else the URL and its id; "" when the first answer names neither.
func (e *env) patchTarget() string {
	base, err := url.Parse(e.cfg.URL)
	if err != nil {
		return ""
	}
	if loc := e.fixture.Response.Header.Get("Location"); loc != "" {
		if u, err := base.Parse(loc); err == nil {
			return u.String()
		}
	}
	if id := resourceID(e.fixture.Response.raw); id != "" {
		u := *base
		u.Path = strings.TrimSuffix(u.Path, "/") + "/" + id
		u.RawPath = ""
		return u.String()
	}
	return ""
}

func runPatch(ctx context.Context, e *env) Result {
	if e.cfg.Method == http.MethodPatch {
		return skip(nil, "the endpoint's method is PATCH: the replay check has judged its retries")
	}
	if !e.replays {
		return skip(nil, "a PATCH's retry would prove nothing: %s", e.noReplayReason())
	}
	target := e.patchTarget()
	if target == "" {
		return skip(nil, "the first answer names no resource (no Location, no id) to PATCH")
	}
	body := e.cfg.PatchBody
	if body == nil {
		body = e.bodyAlt
	}
	key := client.NewKey()
	r := request{label: "PATCH of the first request's resource with a fresh key", method: http.MethodPatch, url: target, body: body, keys: []string{key}}
	one := e.send(ctx, r)
	ev := []*Exchange{one}
	switch {
	case one.Response == nil:
		return fail(ev, "no-answer", "a PATCH of %s got %s", redactURL(target), one.describe())
	case !one.ok():
		return skip(ev, "a PATCH of the first request's resource got %s: not served, or the body is not one it takes (--patch-body)", one.describe())
	}
	r.label = "the same PATCH again, the same key and body"
	again := e.sendUntilFinal(ctx, r)
	ev = append(ev, again...)
	last := again[len(again)-1]
	switch {
	case last.Response == nil:
		return fail(ev, "no-answer", "the PATCH's retry got %s", last.describe())
	case last.ok() && !bytes.Equal(last.Response.raw, one.Response.raw):
		return fail(ev, "patch-ran-twice", "the PATCH's retry with the same key got another answer (%d, %s): it ran again", last.status(), e.diffAt(one.Response.raw, last.Response.raw))
	case last.ok() && last.status() != one.status():
		return fail(ev, "status-differs", "the PATCH's retry got %d where the PATCH got %d", last.status(), one.status())
	case last.ok() && last.replayed():
		return pass(ev, "PATCH %d, and its retry with the same key the same answer (%s: true)", one.status(), HeaderReplayed)
	case last.ok():
		return warn(ev, "PATCH %d, and its retry with the same key the same bytes without a replay marker: whether it ran again cannot be told (a versioned resource would show it)", one.status())
	case carries(one, last) && last.status() == http.StatusConflict:
		return warn(ev, "the PATCH's retry got its first answer with 409, not %d: clients take a 409 for a failure", one.status())
	}
	return fail(ev, "patch-not-replayed", "the PATCH got %d, its retry with the same key %s: a completed PATCH is not replayed", one.status(), last.describe())
}

// After5xxCheck: a request answered 5xx leaves its key free for the retry.
var After5xxCheck = &Check{
	Name: "after-5xx",
	Doc:  "a request answered with a 5xx (--body-5xx, or --body-invalid where the endpoint fails on it) leaves its key to the retry: the same request again gets a final answer, not an in-flight one",
	rule: rules("§6 (every 5xx releases the key: the client's retry runs afresh); §12 (clients retry 5xx with the same key)", "", ""),
	run:  runAfter5xx,
}

func runAfter5xx(ctx context.Context, e *env) Result {
	body, flag := e.cfg.Body5xx, "--body-5xx"
	if body == nil {
		body, flag = e.cfg.BodyInvalid, "--body-invalid"
	}
	if body == nil {
		return skip(nil, "no --body-5xx, and no --body-invalid to try: nothing to make a 5xx with")
	}
	r := request{label: flag + " with a fresh key", body: body, keys: []string{client.NewKey()}}
	x := e.send(ctx, r)
	ev := []*Exchange{x}
	if x.Response != nil && x.status() < 500 {
		return skip(ev, "%s got %s, not a 5xx: nothing to retry (give --body-5xx, a body the endpoint fails on with a 5xx)", flag, x.describe())
	}
	inFlight := func(y *Exchange) bool {
		return (e.inFlightDuplicate(y) || e.inFlightRetry(y)) && !namesResource(y)
	}
	r.label = "the retry after the 5xx: the same key and body"
	retries := e.sendWhile(ctx, r, inFlight, e.cfg.Timeout)
	ev = append(ev, retries...)
	last := retries[len(retries)-1]
	switch {
	case inFlight(last):
		return fail(ev, "held-after-5xx", "%s got %s; its retry with the same key was still answered as in flight after --timeout (%s, %d answers, the last %s): the failed request left its key held, so no retry completes",
			flag, x.describe(), seconds(e.cfg.Timeout), len(retries), last.Outcome())
	case last.Response == nil:
		return fail(ev, "no-answer", "%s got %s; its retry got %s", flag, x.describe(), last.describe())
	}
	return pass(ev, "%s got %s; its retry with the same key got a final answer, %s", flag, x.describe(), last.describe())
}
