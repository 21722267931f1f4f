package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/release"
	"github.com/idem-go/idem/store/redis/redistest"
)

// The version-skew test (issue 46, SPEC §20): the previous release, built from the
// repository's own history (internal/release), and this build serve one store side by
// side, each attempt of a client going to the next process like a round-robin
// balancer's, while processes of either are SIGKILLed in the middle of their outside
// calls. Three phases on one store, which the previous release made: a rolling upgrade
// (the previous release and this build; then the previous release killed with requests
// outside, which this build alone resumes), a rollback (this build killed with requests
// outside, the previous release started in its place and resuming them), and this
// build with a key (IDEM_ENCRYPTION_KEY) beside the previous release. Per logical
// request it counts the outside executions, the ciphertexts replayed (a body starting
// "\xffidemS") and, once the completers had their time, the requests left unresolved:
// all three must be 0. docs/operations.md ("The skew test") quotes its counts.

// Parameters of the skew test.
const (
	skewOps     = 24 // operations per phase, each its own key and amount
	skewClients = 4  // client goroutines sharing them
	skewKills   = 2  // SIGKILLs per phase, alternating between the two processes
	// skewGiveUpEvery: every such operation is sent once; its client gives up on a
	// lost answer, and the record is left to the completers.
	skewGiveUpEvery = 4
	// skewBurst is how many requests are sent to one process alone before it is
	// killed in their middle (the previous release in the rolling upgrade, this build
	// at the rollback).
	skewBurst = 6
	// skewSettle bounds the wait for the completers at the end.
	skewSettle = 45 * time.Second
	// thisBuild names this build's processes in the test's logs and counts.
	thisBuild = "this build"
)

// sealedPrefix starts every sealed value (docs/security.md): a body starting with it
// is a ciphertext replayed to a client.
var sealedPrefix = []byte("\xffidemS")

// TestVersionSkew runs the previous release beside this build on PostgreSQL, SQLite
// (two processes on one file) and Redis, with `idem payments` charging through an
// `idem processor` that loses 30 % of its replies, and `idem proxy` in front of an
// upstream that counts its effects per derived key.
func TestVersionSkew(t *testing.T) {
	t.Parallel()
	// This build first: the previous release's build then finds the dependencies it
	// shares with it compiled (the same flags), which saves most of a cold build.
	idemBinary(t)
	prev := release.Previous()
	oldBin := release.ForTest(t, prev)
	// idem payments charges through the processor on an SQL store only (a charge and
	// its record's recovery point commit together); idem proxy runs on every store.
	for _, kind := range sqlStores {
		t.Run("payments/"+string(kind), func(t *testing.T) {
			t.Parallel()
			testPaymentsSkew(t, oldBin, prev.Version, kind)
		})
	}
	for _, kind := range allStores {
		t.Run("proxy/"+string(kind), func(t *testing.T) {
			t.Parallel()
			testProxySkew(t, oldBin, prev.Version, kind)
		})
	}
}

// skewStore returns the --store URL of a fresh store of kind for a skew test: on
// Redis a private server, whose database the store's state records are the whole of.
func skewStore(t *testing.T, kind storeKind) string {
	if kind == storeRedis {
		return redistest.StartServer(t).URL()
	}
	return newStore(t, kind)
}

// skewProc is one process of a release in a skew test.
type skewProc struct {
	*server
	version string // the release's version, or thisBuild
}

// balancer sends each attempt to the next of its processes, as a round-robin load
// balancer does, whether that process is up or not.
type balancer struct {
	mu    sync.Mutex
	procs []*skewProc
	next  int
}

func (b *balancer) set(procs ...*skewProc) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.procs = procs
}

func (b *balancer) pick() *skewProc {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := b.procs[b.next%len(b.procs)]
	b.next++
	return p
}

// skewOp is one logical request of a skew test, and what its attempts met.
type skewOp struct {
	*cardOp
	phase  string
	giveUp bool // sent once: the client gives up whatever the answer

	mu    sync.Mutex
	trail []string // each attempt: the version that got it and the answer
}

func (o *skewOp) note(version string, res *response, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case err != nil:
		o.trail = append(o.trail, version+": no answer")
	case res.errorCode() != "":
		o.trail = append(o.trail, fmt.Sprintf("%s: %d %s", version, res.Status, res.errorCode()))
	default:
		o.trail = append(o.trail, fmt.Sprintf("%s: %d replayed=%v", version, res.Status, res.replayed()))
	}
}

func (o *skewOp) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fmt.Sprintf("%s operation %d (key %s): %s", o.phase, o.amount, o.key, strings.Join(o.trail, ", "))
}

// skewRun is one skew test's processes, operations and counts.
type skewRun struct {
	t          *testing.T
	command    string   // payments or proxy
	flags      []string // every process's flags
	store      string   // their --store URL
	oldBin     string
	oldVersion string
	lb         balancer
	c          *client
	// inFlight returns how many requests the outside side (the processor, the
	// upstream) works on now: a kill then lands in the middle of an outside call.
	inFlight func() int
	// body is the body of the operation of amount.
	body func(amount int) []byte

	ops        []*skewOp
	ciphertext atomic.Int64
	stats      retryStats
	// kills and busyKills count the SIGKILLs, and those that landed while the
	// outside side worked on a request.
	kills, busyKills int
}

func newSkewRun(t *testing.T, command, oldBin, oldVersion, store string, flags ...string) *skewRun {
	c := newClient()
	// One connection per request: a killed process leaves no stale pooled ones.
	c.http.Transport.(*http.Transport).DisableKeepAlives = true
	flags = append([]string{"--store", store}, flags...)
	return &skewRun{t: t, command: command, flags: flags, store: store, oldBin: oldBin, oldVersion: oldVersion, c: c}
}

// start starts a process of version (the previous release's, or thisBuild) with more
// environment variables.
func (r *skewRun) start(version string, env ...string) *skewProc {
	r.t.Helper()
	s := newCommand(r.t, r.command, r.flags...)
	s.name = fmt.Sprintf("idem %s (%s)", r.command, version)
	if version != thisBuild {
		s.bin = r.oldBin
	}
	s.env = env
	s.start("127.0.0.1:0")
	return &skewProc{server: s, version: version}
}

// newOps makes n operations of phase with amounts from base.
func (r *skewRun) newOps(phase string, base, n int, giveUpEvery int) []*skewOp {
	ops := make([]*skewOp, n)
	for i := range ops {
		ops[i] = &skewOp{cardOp: newCardOp(base + i), phase: phase, giveUp: giveUpEvery > 0 && i%giveUpEvery == giveUpEvery-1}
		if r.body != nil {
			ops[i].body = r.body(base + i)
		}
	}
	r.ops = append(r.ops, ops...)
	return ops
}

// attempt sends o once to p and counts a ciphertext in its answer.
func (r *skewRun) attempt(ctx context.Context, p *skewProc, o *skewOp) (*response, error) {
	res, err := r.c.send(ctx, p.URL(), request{method: "POST", path: "/v1/charges", key: o.key, contentType: contentJSON, body: o.body})
	o.note(p.version, res, err)
	if err == nil && bytes.HasPrefix(res.Body, sealedPrefix) {
		r.ciphertext.Add(1)
		r.t.Errorf("%s: %s replayed a ciphertext: %q", o, p.version, res.Body[:min(len(res.Body), 40)])
	}
	return res, err
}

// complete sends o through the balancer until it gets a 2xx (once only for an
// operation whose client gives up), retrying what a client retries.
func (r *skewRun) complete(ctx context.Context, o *skewOp, giveUp bool) error {
	ctx, cancel := context.WithTimeout(ctx, killOpTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		res, err := r.attempt(ctx, r.lb.pick(), o)
		switch {
		case err == nil && res.Status/100 == 2:
			o.seen = append(o.seen, res.Body)
			return nil
		case giveUp:
			return nil
		case err != nil:
			r.stats.transportErrors.Add(1)
		case res.Status == http.StatusConflict && res.errorCode() == "request_in_progress":
			r.stats.inProgress.Add(1)
		case res.Status == http.StatusServiceUnavailable || res.Status == http.StatusBadGateway || res.Status == http.StatusGatewayTimeout:
			r.stats.unavailable.Add(1)
		default:
			return fmt.Errorf("%s: a final answer %s", o, res)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: no 2xx within %v", o, killOpTimeout)
		case <-time.After(backoff(attempt)):
		}
	}
}

// phase runs ops through the balancer from skewClients goroutines, calling kill(k)
// skewKills times spread over the phase, each at a moment the outside side is busy
// (within a bound).
func (r *skewRun) phase(ops []*skewOp, kill func(k int)) {
	r.t.Helper()
	var (
		done atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, skewClients)
	)
	for g := range skewClients {
		wg.Go(func() {
			for i := g; i < len(ops); i += skewClients {
				if err := r.complete(context.Background(), ops[i], ops[i].giveUp); err != nil {
					errs <- err
					return
				}
				done.Add(1)
			}
		})
	}
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()
	for k := range skewKills {
		threshold := int64((k + 1) * len(ops) / (skewKills + 1))
		waitUntil(clientsDone, 30*time.Second, func() bool { return done.Load() >= threshold })
		if waitUntil(clientsDone, 5*time.Second, func() bool { return r.inFlight() > 0 }) {
			r.busyKills++
		}
		r.kills++
		kill(k)
	}
	<-clientsDone
	close(errs)
	for err := range errs {
		r.t.Error(err)
	}
}

// killAndRelaunch SIGKILLs p and starts it again on its address.
func (r *skewRun) killAndRelaunch(p *skewProc) {
	r.t.Helper()
	p.kill()
	if err := p.relaunch(); err != nil {
		r.t.Fatalf("restarting %s after its kill: %v", p.name, err)
	}
}

// finish sends every operation once more until it gets a 2xx, which must be the
// same bytes as every 2xx it got before, and fails the test on any ciphertext
// replayed. It returns how many operations got no 2xx (a final error, such as 500
// outcome_unknown, or still in progress past killOpTimeout).
func (r *skewRun) finish() (unresolved int) {
	r.t.Helper()
	for _, o := range r.ops {
		if err := r.complete(context.Background(), o, false); err != nil {
			r.t.Errorf("unresolved: %v", err)
			unresolved++
			continue
		}
		for j, b := range o.seen {
			if !bytes.Equal(b, o.seen[0]) {
				r.t.Errorf("%s: 2xx #%d differs from the first:\n got %s\nwant %s", o, j+1, b, o.seen[0])
			}
		}
	}
	if n := r.ciphertext.Load(); n != 0 {
		r.t.Errorf("%d ciphertexts replayed", n)
	}
	return unresolved
}

// phaseCounts counts one phase's operations and their outside executions.
type phaseCounts struct {
	ops, executions, duplicates int
}

// countExecutions counts per phase the operations and the outside executions that
// executions(o) gives for each, and fails the test with the trail of every operation
// executed more than once, or never (each was answered a 2xx at the end).
func (r *skewRun) countExecutions(executions func(o *skewOp) (n int, detail string)) map[string]*phaseCounts {
	r.t.Helper()
	counts := map[string]*phaseCounts{}
	for _, o := range r.ops {
		pc := counts[o.phase]
		if pc == nil {
			pc = &phaseCounts{}
			counts[o.phase] = pc
		}
		n, detail := executions(o)
		pc.ops++
		pc.executions += n
		switch {
		case n > 1:
			pc.duplicates += n - 1
			r.t.Errorf("executed %d times (%s): %s", n, detail, o)
		case n == 0:
			r.t.Errorf("never executed: %s", o)
		}
	}
	return counts
}

// logCounts logs the counts of every phase, in order, and the run's totals.
func (r *skewRun) logCounts(what string, phases []string, counts map[string]*phaseCounts, unresolved int) {
	r.t.Helper()
	var lines []string
	total := phaseCounts{}
	for _, name := range phases {
		pc := counts[name]
		if pc == nil {
			continue
		}
		lines = append(lines, fmt.Sprintf("%s: %d requests, %d %s, %d duplicates", name, pc.ops, pc.executions, what, pc.duplicates))
		total.ops += pc.ops
		total.executions += pc.executions
		total.duplicates += pc.duplicates
	}
	r.t.Logf("idem %s %s beside %s; %s; total: %d requests, %d %s, %d duplicates, %d ciphertexts replayed, %d unresolved; %d SIGKILLs in the phases (%d while the outside side worked), and 2 with %d requests outside; retried: %v",
		r.command, r.oldVersion, thisBuild, strings.Join(lines, "; "), total.ops, total.executions, what, total.duplicates, r.ciphertext.Load(), unresolved, r.kills, r.busyKills, skewBurst, &r.stats)
}

// Names of the skew test's phases.
const (
	phaseUpgrade  = "rolling upgrade"
	phaseRollback = "rollback"
	phaseSealed   = "sealed beside the previous release"
)

var skewPhases = []string{phaseUpgrade, phaseRollback, phaseSealed}

// newEncryptionKey returns a fresh base64key:// URL.
func newEncryptionKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return "base64key://" + base64.URLEncoding.EncodeToString(b)
}

// runPhases runs the three phases of a skew test through r, whose every process
// serves the same store.
func (r *skewRun) runPhases() {
	r.t.Helper()
	// The previous release first: it made the store, as in production.
	old := r.start(r.oldVersion)
	cur := r.start(thisBuild)
	r.lb.set(old, cur)
	r.phase(r.newOps(phaseUpgrade, 10_000, skewOps, skewGiveUpEvery), func(k int) {
		r.killAndRelaunch([]*skewProc{old, cur}[k%2])
	})
	// The upgrade's direction for certain: the previous release is killed while its
	// requests are outside, and the retries go to this build alone, which resumes
	// that release's records; then the previous release serves again.
	resumed := r.killWithRequestsOutside(old, phaseUpgrade, 15_000)
	r.lb.set(cur)
	for _, o := range resumed {
		if err := r.complete(context.Background(), o, false); err != nil {
			r.t.Error(err)
		}
	}
	if err := old.relaunch(); err != nil {
		r.t.Fatal(err)
	}

	// The rollback: this build is killed while its requests are outside, and the
	// previous release takes its place; its processes resume this build's records
	// (idem payments' completer, or the retries at the end).
	r.killWithRequestsOutside(cur, phaseRollback, 25_000)
	old2 := r.start(r.oldVersion)
	r.lb.set(old, old2)
	r.phase(r.newOps(phaseRollback, 20_000, skewOps, skewGiveUpEvery), func(k int) {
		r.killAndRelaunch([]*skewProc{old, old2}[k%2])
	})

	// This build with a key beside the previous release: the store's format level (1)
	// keeps it writing what the previous release reads.
	old2.kill()
	key := newEncryptionKey()
	sealed := r.start(thisBuild, "IDEM_ENCRYPTION_KEY="+key)
	if out := sealed.output(); !strings.Contains(out, "sealing=ready") {
		r.t.Fatalf("%s with a key beside %s: want its start line to say sealing=ready; output:\n%s", thisBuild, r.oldVersion, out)
	}
	// Sealing cannot begin while the store is at the level the previous release reads.
	if res := runIdem(r.t, "keys", "seal", "begin", "--store", r.store, "--encryption-key", key); res.exitCode == 0 || !strings.Contains(res.stderr, "format level 1") {
		r.t.Fatalf("idem keys seal begin on a store at format level 1: exit %d, want it refused naming the level; stdout:\n%s\nstderr:\n%s", res.exitCode, res.stdout, res.stderr)
	}
	r.lb.set(old, sealed)
	r.phase(r.newOps(phaseSealed, 30_000, skewOps, skewGiveUpEvery), func(k int) {
		r.killAndRelaunch([]*skewProc{old, sealed}[k%2])
	})
}

// killWithRequestsOutside sends skewBurst new operations of phase (amounts from base)
// to p alone, whose clients give up, and kills p once at least two of them are at the
// outside side; it returns the operations.
func (r *skewRun) killWithRequestsOutside(p *skewProc, phase string, base int) []*skewOp {
	r.t.Helper()
	ops := r.newOps(phase, base, skewBurst, 1)
	answers := make([]<-chan answer, len(ops))
	for i, o := range ops {
		answers[i] = postInBackground(r.c, p.URL(), o.key, o.body)
	}
	waitUntil(nil, 10*time.Second, func() bool { return r.inFlight() >= 2 })
	p.kill()
	unanswered := 0
	for i, a := range answers {
		got := <-a
		ops[i].note(p.version, got.res, got.err)
		switch {
		case got.err != nil:
			unanswered++
		case got.res.Status/100 == 2:
			ops[i].seen = append(ops[i].seen, got.res.Body)
		}
	}
	r.t.Logf("%s: %s (%s) killed with %d of its %d last requests unanswered", phase, r.command, p.version, unanswered, len(ops))
	return ops
}

// testPaymentsSkew is TestVersionSkew's `idem payments` on a store of kind.
func testPaymentsSkew(t *testing.T, oldBin, oldVersion string, kind storeKind) {
	proc := startCardProcessor(t, "--latency", "100ms", "--lost-reply-rate", "0.3")
	r := newSkewRun(t, "payments", oldBin, oldVersion, newStore(t, kind),
		"--processor-url", proc.URL(), "--lock-timeout", leaseFlag, "--completer-interval", completerFlag)
	r.inFlight = proc.callsInFlight
	r.runPhases()
	if t.Failed() {
		t.FailNow()
	}

	// The completers finish what clients gave up on; then nothing is pending, and
	// every card the processor charged has its charge.
	live := r.lb.pick()
	unresolved := 0
	ok := waitUntil(nil, skewSettle, func() bool {
		unresolved = paymentsUnresolved(t, r.c, live.server, proc)
		return unresolved == 0
	})
	if !ok {
		t.Errorf("%d charges unresolved %v after the last phase (pending, or charged at the processor with no charge in payments)", unresolved, skewSettle)
	}
	unresolved += r.finish()

	perAmount := map[int64][]string{}
	for _, p := range proc.charges(t) {
		perAmount[p.Amount] = append(perAmount[p.Amount], p.IdempotencyKey[:min(12, len(p.IdempotencyKey))]+"…")
	}
	counts := r.countExecutions(func(o *skewOp) (int, string) {
		keys := perAmount[int64(o.amount)]
		return len(keys), "processor keys " + strings.Join(keys, ", ")
	})
	r.logCounts("processor executions", skewPhases, counts, unresolved)
	cardOps := make([]*cardOp, len(r.ops))
	for i, o := range r.ops {
		cardOps[i] = o.cardOp
	}
	wantCardsChargedAtMostOnce(t, r.c, live.server, proc, cardOps)
}

// paymentsUnresolved counts the charges payments holds that are not succeeded, and the
// processor's charges that no charge of payments carries.
func paymentsUnresolved(t *testing.T, c *client, pay *server, proc *cardProcessor) int {
	list := c.listCharges(t, pay.URL())
	carried := map[string]bool{}
	n := 0
	for _, ch := range list {
		if ch["status"] != "succeeded" {
			n++
		}
		if id, _ := ch["processor_charge_id"].(string); id != "" {
			carried[id] = true
		}
	}
	for _, p := range proc.charges(t) {
		if !carried[p.ID] {
			n++
		}
	}
	return n
}

// skewUpstream is an upstream that deduplicates by the derived key the proxies send
// (Idempotency-Key), as an upstream that honours it does: each operation's effects
// are the distinct keys it was sent under.
type skewUpstream struct {
	mu       sync.Mutex
	effects  map[string][]string // operation (its body's "op") → the keys of its effects
	inFlight atomic.Int64
}

func (u *skewUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.inFlight.Add(1)
	defer u.inFlight.Add(-1)
	var body bytes.Buffer
	_, _ = body.ReadFrom(r.Body)
	op := strings.TrimSuffix(strings.TrimPrefix(body.String(), `{"op":"`), `"}`)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	effect := -1
	for i, k := range u.effects[op] {
		if k == key && key != "" {
			effect = i
		}
	}
	if effect < 0 {
		u.effects[op] = append(u.effects[op], key)
		effect = len(u.effects[op]) - 1
	}
	u.mu.Unlock()
	time.Sleep(100 * time.Millisecond) // the work
	w.Header().Set("Content-Type", contentJSON)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"op":%q,"effect":%d}`, op, effect+1)
}

func (u *skewUpstream) keys(op string) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.effects[op]...)
}

// testProxySkew is TestVersionSkew's `idem proxy` on a store of kind, under
// --on-lapse take_over: a retry after a proxy died mid-forward is forwarded again,
// under the derived key of the record it takes over.
func testProxySkew(t *testing.T, oldBin, oldVersion string, kind storeKind) {
	up := &skewUpstream{effects: map[string][]string{}}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	r := newSkewRun(t, "proxy", oldBin, oldVersion, skewStore(t, kind), "--upstream", srv.URL,
		"--lock-timeout", leaseFlag, "--on-lapse", "take_over")
	r.inFlight = func() int { return int(up.inFlight.Load()) }
	r.body = func(amount int) []byte { return []byte(fmt.Sprintf(`{"op":"%d"}`, amount)) }
	r.runPhases()
	if t.Failed() {
		t.FailNow()
	}
	unresolved := r.finish()
	counts := r.countExecutions(func(o *skewOp) (int, string) {
		keys := up.keys(fmt.Sprint(o.amount))
		short := make([]string, len(keys))
		for i, k := range keys {
			short[i] = k[:min(12, len(k))] + "…"
		}
		sort.Strings(short)
		return len(keys), "upstream keys " + strings.Join(short, ", ")
	})
	r.logCounts("upstream executions", skewPhases, counts, unresolved)
}
