package check

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/client"
)

// RestartCheck: a key whose first request was cut off by a restart does not stay in
// flight.
var RestartCheck = &Check{
	Name: "restart",
	Doc:  "with --between, a key whose first request was cut off by the command (a restart, a kill) is answered within --timeout of it, not left in flight",
	rule: rules("§5.3 (a claim held by a dead process is taken over once its lease expires); §5.2 (Retry-After says when to retry); IETF draft 2.6", "", ""),
	run:  runRestart,
}

// hookMethod is the Method of the --between command's exchange, whose URL is the
// command.
const hookMethod = "sh -c"

// hookOutput is how much of the --between command's output the evidence keeps.
const hookOutput = 2 << 10

func runRestart(ctx context.Context, e *env) Result {
	if e.cfg.Between == "" {
		return skip(nil, "no --between: give a command that restarts or kills the server between a request and its retry")
	}
	// Whether completed keys replay is found out before the command restarts the
	// server, which may forget them (Run does it before this check runs): after it, a
	// retry of the first request would say what the restart did, not what the
	// endpoint does.
	replays, _ := e.knowReplays(ctx)
	key := client.NewKey()
	wrote := make(chan struct{})
	var once sync.Once
	written := func() { once.Do(func() { close(wrote) }) }
	firstDone := make(chan *Exchange, 1)
	go func() {
		x := e.send(ctx, request{label: "first request with a fresh key, cut off by --between", body: e.body, keys: []string{key}, wrote: written, fresh: true})
		written()
		firstDone <- x
	}()
	<-wrote
	hook := e.runHook(ctx, key)
	first := <-firstDone
	ev := []*Exchange{first, hook}
	if hook.Error != "" {
		return skip(ev, "the --between command failed (%s): nothing to judge", hook.Error)
	}
	start := time.Now()
	// An in-flight status is a lease still held, unless the answer names a resource: a
	// stored final answer (a replay with 409, as some libraries answer every retry of
	// a completed key), which no wait will change.
	inFlight := func(x *Exchange) bool {
		return (e.inFlightDuplicate(x) || e.inFlightRetry(x)) && !namesResource(x) && !carries(first, x)
	}
	retry := request{label: "the retry after --between: the same key and body", body: e.body, keys: []string{key}}
	retries := e.sendWhile(ctx, retry, inFlight, e.cfg.Timeout)
	ev = append(ev, retries...)
	last := retries[len(retries)-1]
	if inFlight(last) {
		// Past --timeout: ask on, up to restartObserve times as long, only to tell a
		// lease longer than --timeout from a key that stays stuck.
		retry.label = "past --timeout, the retry again (a longer lease, or a stuck key?)"
		more := e.sendWhile(ctx, retry, inFlight, restartObserve*e.cfg.Timeout)
		ev = append(ev, more...)
		final := more[len(more)-1]
		waited := time.Since(start)
		if final.Response != nil && !inFlight(final) {
			return fail(ev, "lease-longer-than-timeout", "still in flight after --timeout (%s); the server's lease looks longer: the key got a final answer, %s, %s after --between; give --timeout %s or more",
				seconds(e.cfg.Timeout), final.Outcome(), waited.Round(100*time.Millisecond), suggestTimeout(waited))
		}
		return fail(ev, "stuck", "the key is still in flight %s after --between, %d times --timeout (%s) (%d answers, the last %s): a key cut off by a restart stays stuck, or its lease is longer still",
			waited.Round(100*time.Millisecond), restartObserve+1, seconds(e.cfg.Timeout), len(retries)+len(more), final.Outcome())
	}
	switch {
	case last.Response == nil:
		return fail(ev, "no-answer", "after --between the retry got %s", last.describe())
	case first.ok() && carries(first, last):
		return pass(ev, "the first request finished before the command; its retry got its answer (%d)", last.status())
	case first.ok() && last.ok() && !replays:
		return pass(ev, "the first request got %s; after --between its retry got a final answer, %d (%s), not stuck: it ran again, as every retry of a completed key does here (see replay)", identity(first), last.status(), identity(last))
	case first.ok() && (last.ok() || namesResource(last)):
		return fail(ev, "ran-twice", "the first request got %s, yet its retry after --between ran again (%s): the request ran twice", identity(first), identity(last))
	case last.ok():
		return pass(ev, "the first request got %s; after --between its retry got %d (%s) after %d answer(s)", first.describe(), last.status(), identity(last), len(retries))
	case namesResource(last):
		return pass(ev, "the first request got %s; after --between its retry got a final answer, %d naming %s (a stored answer, not a lease still held), after %d answer(s)", first.describe(), last.status(), identity(last), len(retries))
	}
	return pass(ev, "the first request got %s; after --between its retry got a final answer, %s: the key is not stuck", first.describe(), last.describe())
}

// restartObserve is how many times --timeout the restart check asks on past
// --timeout, to tell a longer lease from a stuck key.
const restartObserve = 3

// seconds renders d as "5 s" or "2.5 s".
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s"
}

// suggestTimeout is a --timeout above a lease that ran out after waited: half as
// long again, in whole seconds.
func suggestTimeout(waited time.Duration) string {
	return fmt.Sprintf("%ds", int(math.Ceil(waited.Seconds()*1.5)))
}

// runHook runs the --between command with sh -c, IDEM_CHECK_URL and IDEM_CHECK_KEY
// (the first request's key) in its environment, and returns it as an exchange of the
// evidence: its output in the answer's body, its failure as the error.
func (e *env) runHook(ctx context.Context, key string) *Exchange {
	x := &Exchange{Label: "--between", Request: SentRequest{Method: hookMethod, URL: e.cfg.Between}}
	ctx, cancel := context.WithTimeout(ctx, max(e.cfg.Timeout, time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", e.cfg.Between)
	cmd.Env = append(os.Environ(), "IDEM_CHECK_URL="+e.cfg.URL, "IDEM_CHECK_KEY="+key)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	start := time.Now()
	err := cmd.Run()
	x.Elapsed = Millis(time.Since(start))
	b := out.Bytes()
	if len(b) > hookOutput {
		b = b[len(b)-hookOutput:]
	}
	status := 0
	if err != nil {
		x.Error = oneLine(err.Error())
		if last := lastLine(b); last != "" {
			x.Error += ": " + last
		}
		status = 1
	}
	x.Response = &Answer{Status: status, Body: string(b), raw: b}
	return x
}

// lastLine returns the last non-empty line of b.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return oneLine(lines[len(lines)-1])
}
