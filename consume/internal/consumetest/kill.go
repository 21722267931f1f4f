// Package consumetest holds what the tests of package consume's broker adapters share:
// a fixture (a SQLite store with an invoices table, and a Processor over it) and the
// crash proof.
//
// The crash proof shows that an adapter processes every message exactly once in
// effect, with real processes: [Run] publishes N messages to a real broker, runs
// consumer processes (the test binary again) that it kills with SIGKILL at chosen
// points — inside the effect's transaction, between the commit and the
// acknowledgement, or wherever the consumer happens to be — and lets the broker
// redeliver until every message is acknowledged. Then it counts the effects in the
// database (SQLite or PostgreSQL): with the helper, each message's exactly once; the
// same plan without the helper shows the duplicates it prevents.
//
// A broker's test supplies a [Broker] (the parent's side: a private queue, its
// outstanding count) and a consumer loop per database (the child's side: see
// [Children]), and calls [Main] from its TestMain and [Run] from its tests.
package consumetest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testkit"
)

// Broker is the parent's side of a broker.
type Broker interface {
	// Prepare creates a queue private to t holding n messages, with the ids ID(i) and
	// payloads Payload(i) for i in [0, n), removed when t ends. It returns the
	// environment ("NAME=value") a child needs to consume that queue.
	Prepare(t *testing.T, n int) (env []string)
	// Outstanding returns how many messages the broker still has to deliver: waiting,
	// delivered but not acknowledged, or due for redelivery. With no consumer
	// connected, zero means every message was acknowledged (or terminated).
	Outstanding(t *testing.T) int
}

// ID is the id of message i.
func ID(i int) string { return fmt.Sprintf("m-%04d", i) }

// Payload is the payload of message i.
func Payload(i int) []byte { return fmt.Appendf(nil, `{"order":%d,"amount":%d}`, i, 100+i) }

// Kill is where a consumer process is killed.
type Kill int

const (
	// KillAnywhere kills a consumer once it reported HangAt commits, wherever it is
	// then.
	KillAnywhere Kill = iota + 1
	// KillInEffect kills a consumer inside its HangAt-th effect, before the
	// transaction commits: nothing of it may survive.
	KillInEffect
	// KillAfterCommit kills a consumer after its HangAt-th commit and before that
	// message's acknowledgement: the broker redelivers a message whose effect
	// happened.
	KillAfterCommit
)

func (k Kill) String() string {
	return [...]string{"?", "anywhere", "in the effect", "after the commit"}[k]
}

// Plan is one proof.
type Plan struct {
	Broker Broker
	// DB is "sqlite" or "postgres".
	DB string
	// Helper runs the effect through the adapter and consume.Processor; without it the
	// consumer runs the effect in a plain transaction and acknowledges after the
	// commit, as consumers without idempotency do.
	Helper bool
	// N is how many messages are published.
	N int
	// Kills are the consumer processes killed, in order; one more consumer then runs
	// until every message is acknowledged.
	Kills []Kill
	// Timeout bounds the whole run. Defaults to 3 minutes.
	Timeout time.Duration
}

// Report is what a run measured.
type Report struct {
	N              int
	Rows, Distinct int // effects in the database: rows, and distinct message ids
	Kills          int
	Processes      int // consumer processes started, killed ones included
	Deliveries     int // deliveries handled to the end (killed ones excluded)
	Redeliveries   int // ... of which the broker had delivered before
	Replays        int // acknowledged without effect: processed before
	Naks           int // not acknowledged: redelivered later
	Takeovers      int // lapsed leases of killed consumers taken over
	Elapsed        time.Duration
}

// Duplicates is how many effects ran more than once.
func (r Report) Duplicates() int { return r.Rows - r.Distinct }

// Lost is how many messages have no effect.
func (r Report) Lost() int { return r.N - r.Distinct }

func (r Report) String() string {
	return fmt.Sprintf("N=%d effects=%d distinct=%d duplicates=%d lost=%d | %d kills, %d processes, %d deliveries handled (%d redelivered), %d replays, %d naks, %d takeovers, %v",
		r.N, r.Rows, r.Distinct, r.Duplicates(), r.Lost(), r.Kills, r.Processes, r.Deliveries, r.Redeliveries,
		r.Replays, r.Naks, r.Takeovers, r.Elapsed.Round(100*time.Millisecond))
}

// Kills are the kills of the proofs: 6 consumers killed, each after about HangAt
// messages, at each point twice.
var Kills = []Kill{KillAnywhere, KillInEffect, KillAfterCommit, KillAnywhere, KillAfterCommit, KillInEffect}

// ProofN is how many messages the proofs publish.
const ProofN = 200

// ProveExactlyOnce runs the proof with the helper on SQLite and PostgreSQL, each with a
// broker of newBroker: every message's effect must have run exactly once, and the
// kills must have hit where they aimed (repeats of committed messages were replayed,
// messages of consumers killed in their effects taken over).
func ProveExactlyOnce(t *testing.T, newBroker func() Broker) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			rep := Run(t, Plan{Broker: newBroker(), DB: db, Helper: true, N: ProofN, Kills: Kills})
			t.Log(rep)
			if rep.Duplicates() != 0 || rep.Lost() != 0 {
				t.Fatalf("with the helper: %v; want every message's effect exactly once", rep)
			}
			if rep.Replays == 0 || rep.Takeovers == 0 {
				t.Fatalf("%v: want replays (kills after commits) and takeovers (kills in effects), or the kills proved nothing", rep)
			}
		})
	}
}

// ProveDuplicatesWithoutHelper runs the same proof without the helper: no message may
// be lost, and each kill after a commit must have left a duplicate, which shows that
// the proof with the helper could fail.
func ProveDuplicatesWithoutHelper(t *testing.T, newBroker func() Broker) {
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			rep := Run(t, Plan{Broker: newBroker(), DB: db, Helper: false, N: ProofN, Kills: Kills})
			t.Log(rep)
			want := 0
			for _, k := range Kills {
				if k == KillAfterCommit {
					want++
				}
			}
			if rep.Lost() != 0 || rep.Duplicates() < want {
				t.Fatalf("without the helper: %v; want no message lost, and at least %d duplicates (one per kill after a commit)", rep, want)
			}
		})
	}
}

// Run carries out p and returns what it measured; it fails t when a process
// misbehaves or the run does not finish in time, not on duplicates: the caller asserts
// those.
func Run(t *testing.T, p Plan) Report {
	t.Helper()
	if p.Timeout == 0 {
		p.Timeout = 3 * time.Minute
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), p.Timeout)
	defer cancel()
	env := p.Broker.Prepare(t, p.N) // first: an absent broker skips the test
	db := newDatabase(t, p.DB)
	r := &runner{t: t, ctx: ctx, p: p, db: db, env: append(env, db.env...)}
	for _, k := range p.Kills {
		r.kill(k)
	}
	r.finish()
	rep := r.rep
	rep.N, rep.Kills, rep.Elapsed = p.N, len(p.Kills), time.Since(start)
	rep.Rows, rep.Distinct = db.count(t)
	return rep
}

// runner runs a Plan's processes.
type runner struct {
	t   *testing.T
	ctx context.Context
	p   Plan
	db  *database
	env []string
	rep Report
}

// kill starts a consumer and kills it at k.
func (r *runner) kill(k Kill) {
	t := r.t
	var env []string
	switch k {
	case KillInEffect:
		env = append(env, envHang+"="+hangEffect)
	case KillAfterCommit:
		env = append(env, envHang+"="+hangCommit)
	}
	c := r.start(env)
	commits := 0
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				t.Fatalf("consumer %d exited before it was killed %v: %v\n%s", r.rep.Processes, k, c.wait(), c.output())
			}
			if ev.hang != "" {
				c.kill()
				t.Logf("killed consumer %d %v, at %s", r.rep.Processes, k, ev.hang)
				return
			}
			if r.record(ev) {
				commits++
			}
			if k == KillAnywhere && commits == HangAt {
				c.kill()
				t.Logf("killed consumer %d %v, after it committed %d messages", r.rep.Processes, k, commits)
				return
			}
		case <-r.ctx.Done():
			c.kill()
			t.Fatalf("consumer %d was not killed %v within %v (%d messages outstanding):\n%s",
				r.rep.Processes, k, r.p.Timeout, r.p.Broker.Outstanding(t), c.output())
		}
	}
}

// finish runs consumers until every message is in the database and acknowledged, and
// stops them gracefully.
func (r *runner) finish() {
	t := r.t
	for round := 0; ; round++ {
		if round == 5 {
			t.Fatalf("consumetest: messages still outstanding after %d consumers ran to the end", round)
		}
		c := r.start(nil)
		r.drain(c)
		// Stop it: it finishes the message in hand and disconnects; what it held
		// unacknowledged goes back to the broker.
		c.stop()
		if r.p.Broker.Outstanding(t) == 0 {
			return
		}
	}
}

// drain waits until every message has its effect and the broker has nothing left to
// deliver, polling both.
func (r *runner) drain(c *child) {
	t := r.t
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				t.Fatalf("final consumer exited: %v\n%s", c.wait(), c.output())
			}
			r.record(ev)
		case <-tick.C:
			if _, distinct := r.db.count(t); distinct == r.p.N && r.p.Broker.Outstanding(t) == 0 {
				return
			}
		case <-r.ctx.Done():
			rows, distinct := r.db.count(t)
			c.kill()
			t.Fatalf("not drained within %v: %d effects, %d distinct of %d, %d outstanding\n%s",
				r.p.Timeout, rows, distinct, r.p.N, r.p.Broker.Outstanding(t), c.output())
		}
	}
}

// record counts a consumer's event, and reports whether it was a commit: a message
// acknowledged after its effect committed.
func (r *runner) record(ev event) bool {
	if ev.takeover {
		r.rep.Takeovers++
	}
	if ev.id == "" {
		return false
	}
	r.rep.Deliveries++
	if ev.delivery > 1 {
		r.rep.Redeliveries++
	}
	switch {
	case ev.action == "ack" && ev.replayed:
		r.rep.Replays++
	case ev.action == "ack":
		return true
	default:
		r.rep.Naks++
	}
	return false
}

// child is a consumer process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event // closed when its stdout closes
	stdout bytes.Buffer
	stderr testkit.Buffer
	r      *runner
}

// event is a line of a child's protocol.
type event struct {
	id       string
	action   string
	replayed bool
	delivery int
	hang     string // the id it hangs at, on a hang line
	takeover bool   // on a takeover line
}

// start starts a consumer with the run's environment and extra.
func (r *runner) start(extra []string) *child {
	t := r.t
	r.rep.Processes++
	c := &child{r: r, events: make(chan event, 64)}
	c.cmd = exec.Command(os.Args[0], "-test.run=^$")
	c.cmd.Env = append(append(append(os.Environ(), envRole+"="+roleChild, envHelper+"="+strconv.FormatBool(r.p.Helper)),
		r.env...), extra...)
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("starting a consumer: %v", err)
	}
	go func() {
		defer close(c.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			c.stdout.WriteString(line + "\n")
			if ev, ok := parseEvent(line); ok {
				c.events <- ev
			}
		}
	}()
	t.Cleanup(func() { c.kill() })
	return c
}

// stop asks the child to stop (by closing its stdin) and waits for it to exit,
// counting its last events.
func (c *child) stop() {
	t := c.r.t
	_ = c.stdin.Close()
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				if err := c.wait(); err != nil {
					t.Fatalf("consumer %d failed: %v\n%s", c.r.rep.Processes, err, c.output())
				}
				return
			}
			c.r.record(ev)
		case <-c.r.ctx.Done():
			c.kill()
			t.Fatalf("consumer %d did not stop within the run's timeout:\n%s", c.r.rep.Processes, c.output())
		}
	}
}

// kill kills the child with SIGKILL and reaps it; its remaining events are counted.
func (c *child) kill() {
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	for ev := range c.events {
		c.r.record(ev)
	}
	_ = c.wait()
}

// wait reaps the child, dropping the events not read yet.
func (c *child) wait() error {
	if c.cmd.ProcessState != nil {
		return nil
	}
	for range c.events {
	}
	return c.cmd.Wait()
}

// output is the child's stdout and stderr, for failure messages.
func (c *child) output() string {
	return "stdout:\n" + c.stdout.String() + "stderr:\n" + c.stderr.String()
}

// parseEvent parses "killtest-done ID ACTION REPLAYED DELIVERY" or
// "killtest-hang ID WHERE".
func parseEvent(line string) (event, bool) {
	f := strings.Fields(line)
	switch {
	case len(f) == 5 && f[0] == lineDone:
		n, err := strconv.Atoi(f[4])
		return event{id: f[1], action: f[2], replayed: f[3] == "true", delivery: n}, err == nil
	case len(f) == 3 && f[0] == lineHang:
		return event{hang: f[1] + " (" + f[2] + ")"}, true
	case len(f) == 1 && f[0] == lineTakeover:
		return event{takeover: true}, true
	}
	return event{}, false
}
