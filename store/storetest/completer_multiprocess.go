package storetest

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
)

// completerRecords is how many dead holders' records RunCompleterMultiProcess leaves
// for the completers of its children.
const completerRecords = 40

// RunCompleterMultiProcess proves that completers in several processes finish each
// resumable record exactly once (SPEC §13, §14). In the parent it creates and
// migrates a fresh database and leaves in it records whose holders died after their
// first step committed, their leases lapsed. Then it starts MultiProcess.Processes
// copies of the test binary, each running only the calling test, which calls
// RunCompleterMultiProcess again and acts as a child: it opens the store, registers
// the resume function of the records' operation, waits at a barrier until every child
// is ready, runs two passes of an idem.Completer at once with the others, and reports
// on stdout every record its resume function ran for. The parent asserts that every
// record was resumed exactly once across all processes, and completed with the result
// of that one run.
//
// Stores without Capabilities.MultiProcess or Capabilities.RecoveryPoints are skipped
// with a log line.
func RunCompleterMultiProcess(t *testing.T, p MultiProcess) {
	t.Helper()
	p.setDefaults()
	switch os.Getenv(envRole) {
	case roleComplete:
		childForTest(t)
		completeChild(t, p)
		return
	case roleClaim, roleMigrate:
		t.Skip("storetest: child process of another multi-process run; nothing to complete")
	}
	if p.NewDSN == nil || p.Open == nil {
		t.Fatal("storetest: RunCompleterMultiProcess needs MultiProcess.NewDSN and MultiProcess.Open")
	}
	dsn := p.NewDSN(t)
	if p.Migrate != nil {
		if err := p.Migrate(dsn); err != nil {
			t.Fatalf("Migrate(%q): %v", dsn, err)
		}
	}
	s := p.Open(t, dsn)
	switch caps := s.Capabilities(); {
	case !caps.MultiProcess:
		t.Skip("store lacks Capabilities.MultiProcess: skipping multi-process completers")
	case !caps.RecoveryPoints:
		t.Skip("store lacks Capabilities.RecoveryPoints (SPEC §13): skipping multi-process completers")
	}

	// Holders that died after their first step, their leases lapsed a lease ago by the
	// store's clock (the children's completers use it).
	scope, prefix := "mp-scope-"+rand.Text(), "mp-key-"+rand.Text()
	b := &bundle{t: t, s: s, ctx: t.Context(), t0: time.Now().UTC().Add(-3 * lease).Truncate(time.Millisecond),
		scope: scope, fp: mpFingerprint}
	for i := range completerRecords {
		k := *b
		k.key = mpKey(prefix, i)
		p := k.acquire(b.t0)
		k.step(p.Token, "charge_pending", stepsOf("charge_pending", charge{ID: fmt.Sprintf("ch_%d", i), Amount: 2000}))
	}

	outs := runChildren(t, p, roleComplete, envDSN+"="+dsn, envScope+"="+scope, envKeys+"="+prefix)
	resumed := make([][]int, completerRecords) // children whose resume ran, per record
	for child, out := range outs {
		for _, line := range out.lines(lineResumed) {
			i, err := strconv.Atoi(line)
			if err != nil || i < 0 || i >= completerRecords {
				t.Fatalf("child %d: bad line %q", child, lineResumed+line)
			}
			resumed[i] = append(resumed[i], child)
		}
	}
	for i, children := range resumed {
		if len(children) != 1 {
			t.Errorf("record %d resumed %d times across %d processes (children %v), want exactly once", i, len(children), p.Processes, children)
			continue
		}
		rec, err := s.RecordGet(t.Context(), &idemstore.GetParams{Scope: scope, Key: mpKey(prefix, i)})
		if err != nil {
			t.Errorf("record %d: RecordGet after the completers: %v", i, err)
			continue
		}
		var got charge
		if rec.State != idemstore.StateCompleted || json.Unmarshal(rec.Response.Body, &got) != nil ||
			got != (charge{ID: fmt.Sprintf("ch_%d/child_%d", i, children[0]), Amount: 2000}) {
			t.Errorf("record %d: %v, want completed with the one resume's result", i, rec.State)
		}
	}
	if !t.Failed() {
		t.Logf("%d processes × 2 completer passes over %d resumable records: every record resumed exactly once", p.Processes, completerRecords)
	}
}

// mpFingerprint is the fingerprint of the records of the multi-process runs.
var mpFingerprint = idemstore.Fingerprint{Version: idemstore.FingerprintVersion, Sum: [32]byte{'m', 'p'}}

func completeChild(t *testing.T, p MultiProcess) {
	dsn, prefix := os.Getenv(envDSN), os.Getenv(envKeys)
	child := os.Getenv(envChild)
	s := p.Open(t, dsn)
	g := idem.NewGuard(idem.GuardConfig{Store: s, Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	var lines []string
	g.RegisterResume(chargeOperation, func(ctx context.Context, h *idem.Handle) error {
		pending, err := idem.Step(ctx, "charge_pending", func(context.Context) (charge, error) {
			return charge{}, fmt.Errorf("the committed step charge_pending ran again")
		})
		if err != nil {
			return err
		}
		i := strings.TrimPrefix(h.Key(), prefix+"-")
		lines = append(lines, lineResumed+i) // one pass at a time: no lock needed
		return h.SetResult(charge{ID: pending.ID + "/child_" + child, Amount: pending.Amount})
	})
	c := idem.NewCompleter(g, idem.CompleterConfig{BatchSize: 7})
	waitAtBarrier(t)
	for range 2 {
		if pass := c.Pass(t.Context()); pass.Err != nil || pass.Failed != 0 {
			t.Fatalf("completer pass: %+v", pass)
		}
	}
	fmt.Println(strings.Join(lines, "\n"))
}
