package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Parameters of the tests of a charge that outlives its TTL unfinished (issue 20): the
// issue's short TTL, lease, completer interval and processor timeout.
const (
	orphanTTL               = 6 * time.Second
	orphanCompleterInterval = 500 * time.Millisecond
	// orphanWarnAfter is --unfinished-warn-after: shorter than the outage.
	orphanWarnAfter = 3 * time.Second
	// orphanFinishBound bounds how long after the processor is back the completer
	// finishes the charge: its backoff is at most six intervals (3 s) plus jitter, a
	// pass that may be waiting on the processor still, and a loaded machine. Before,
	// its backoff doubled from 30 s to 10 min.
	orphanFinishBound = 15 * time.Second
)

// orphan is a charge left pending past its TTL: the processor took it and was stopped
// (SIGSTOP) before it answered, so that payments answered 503 processor_unavailable
// and kept the charge pending, and stayed stopped until the charge's record was older
// than its TTL.
type orphan struct {
	proc    *cardProcessor
	pay     *server
	c       *client
	op      *cardOp
	store   string
	pending string    // the pending charge's id
	resumed time.Time // when the processor came back
}

// chargeOutlivingItsTTL makes an orphan on a fresh store of kind, checks what an
// operator sees of it while the processor is down — the unfinished-operations metric,
// the WARN, `idem keys list --state unfinished` — and brings the processor back.
func chargeOutlivingItsTTL(t *testing.T, kind storeKind) *orphan {
	t.Helper()
	o := pendingCharge(t, kind)
	// The processor stays down until the completer has failed to finish the charge
	// (its first attempt, the processor client's eight, ends after 5 to 15 s) and said
	// so, and the charge is older than its TTL plus two seconds: the store's own count
	// says when.
	waitFor(t, 10*orphanTTL, "a WARN that the charge is still unfinished", func() (bool, string) {
		return strings.Contains(o.pay.output(), "still unfinished"), "no WARN"
	})
	metrics := o.pay.metricsURL(t)
	waitFor(t, 4*orphanTTL, "the unfinished charge to outlive its TTL", func() (bool, string) {
		s := scrapeMetrics(t, metrics)
		n, age := s.gauge("idem_unfinished_operations"), s.gauge("idem_unfinished_oldest_age_seconds")
		return n == 1 && age > (orphanTTL+2*time.Second).Seconds(), fmt.Sprintf("%v unfinished, the oldest %vs old", n, age)
	})
	o.wantListedUnfinished(t)
	if list := o.c.listCharges(t, o.pay.URL()); list[0]["status"] != "pending" {
		t.Fatalf("the charge while the processor is down: %v, want pending", list[0])
	}
	if warned := strings.Count(o.pay.output(), "still unfinished"); warned != 1 {
		t.Errorf("%d WARNs that the charge is still unfinished past --unfinished-warn-after %v, want one:\n%s", warned, orphanWarnAfter, o.pay.output())
	}
	o.proc.signal(syscall.SIGCONT)
	o.resumed = time.Now()
	return o
}

// pendingCharge starts a processor and payments on a fresh store of kind and posts a
// charge that the processor takes and, stopped (SIGSTOP), never answers: payments
// answers 503 processor_unavailable and keeps the charge pending.
func pendingCharge(t *testing.T, kind storeKind) *orphan {
	t.Helper()
	o := &orphan{store: newStore(t, kind), c: newClient(), op: newCardOp(777)}
	// Every reply of the processor is lost; a charge takes it a second (payments' calls
	// time out after 500 ms and find it in progress), long enough to stop it in the
	// middle. Stopped, it makes the charge when it comes back, and nobody hears of it:
	// its caller is long gone.
	o.proc = startCardProcessor(t, "--latency", "1s", "--lost-reply-rate", "1")
	o.pay = startServer(t, "--store", o.store, "--processor-url", o.proc.URL(), "--ttl", orphanTTL.String(),
		"--lock-timeout", leaseFlag, "--completer-interval", orphanCompleterInterval.String(), "--processor-timeout", "500ms",
		"--unfinished-warn-after", orphanWarnAfter.String(), "--metrics-addr", "127.0.0.1:0")
	o.c.http.Transport.(*http.Transport).DisableKeepAlives = true

	answer := postInBackground(o.c, o.pay.URL(), o.op.key, o.op.body)
	waitFor(t, 10*time.Second, "the processor to be making the charge", func() (bool, string) {
		n := o.proc.callsInFlight()
		return n == 1, fmt.Sprintf("%d calls in flight", n)
	})
	o.proc.signal(syscall.SIGSTOP)
	got := <-answer
	if got.err != nil {
		t.Fatalf("the charge while the processor is stopped: %v", got.err)
	}
	wantError(t, "the charge while the processor is stopped", got.res, http.StatusServiceUnavailable, "processor_unavailable")
	list := o.c.listCharges(t, o.pay.URL())
	if len(list) != 1 || list[0]["status"] != "pending" || list[0]["processor_charge_id"] != nil {
		t.Fatalf("charges after the 503: %v, want one pending charge without a processor charge", list)
	}
	o.pending = list[0]["id"].(string)
	return o
}

// wantListedUnfinished fails the test unless `idem keys list --state unfinished`
// shows the orphan's key, unfinished at charge_pending past its TTL and not expired,
// in JSON and as text.
func (o *orphan) wantListedUnfinished(t *testing.T) {
	t.Helper()
	var page struct {
		Records []struct {
			Key           string    `json:"key"`
			Unfinished    bool      `json:"unfinished"`
			Expired       bool      `json:"expired"`
			RecoveryPoint string    `json:"recovery_point"`
			Operation     string    `json:"operation"`
			CreatedAt     time.Time `json:"created_at"`
		} `json:"records"`
		Now time.Time `json:"now"`
	}
	out := mustRunIdem(t, "keys", "list", "--store", o.store, "--state", "unfinished", "--json").stdout
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("idem keys list --state unfinished --json: %v\n%s", err, out)
	}
	if r := page.Records; len(r) != 1 || r[0].Key != o.op.key || !r[0].Unfinished || r[0].Expired || r[0].RecoveryPoint != "charge_pending" ||
		r[0].Operation != "POST /v1/charges" || page.Now.Sub(r[0].CreatedAt) <= orphanTTL {
		t.Fatalf("idem keys list --state unfinished while the processor is down:\n%s\nwant the charge's key, unfinished at charge_pending "+
			"past its TTL, not expired", out)
	}
	text := mustRunIdem(t, "keys", "list", "--store", o.store, "--state", "unfinished").stdout
	for _, want := range []string{o.op.key, "charge_pending", "POST /v1/charges", "RECORD ID"} {
		if !strings.Contains(text, want) {
			t.Errorf("idem keys list --state unfinished says\n%s\nwant %q", text, want)
		}
	}
}

// finished checks the end of an orphan's story: the processor holds exactly one
// charge, payments exactly one, the pending one, succeeded and carrying it, and every
// answer of the key is that charge; no unfinished operation is left.
func (o *orphan) finished(t *testing.T) {
	t.Helper()
	if len(o.op.seen) == 0 || (&response{Body: o.op.seen[0]}).id(t) != o.pending {
		t.Fatalf("the key was answered %s, want the pending charge %s", o.op.seen, o.pending)
	}
	wantEachCardChargedOnce(t, o.c, o.pay, o.proc, []*cardOp{o.op})
	metrics := o.pay.metricsURL(t)
	waitFor(t, finishBound, "no unfinished operation left", func() (bool, string) {
		n := scrapeMetrics(t, metrics).gauge("idem_unfinished_operations")
		return n == 0, fmt.Sprintf("%v unfinished", n)
	})
}

// The sequence: the processor takes a charge and is unreachable (SIGSTOP) past
// the charge's TTL, its reply lost; the client retries after the TTL, once the
// processor is back. The retry finds the first record, resumes it under the same
// processor key and is answered the first charge, succeeded: one processor charge,
// one payments charge. (Before, the retry claimed the expired key afresh and charged
// the card again under a new key; the first charge stayed pending forever.)
func TestAChargeRetriedAfterItsTTLIsFinishedOnceUnderItsFirstKey(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			o := chargeOutlivingItsTTL(t, kind)
			res, err := retryUntilCreated(context.Background(), o.c, o.pay.URL(), o.op.key, o.op.body, finishBound)
			if err != nil {
				t.Fatal(err)
			}
			o.op.seen = append(o.op.seen, res.Body)
			again := o.c.postCharge(t, o.pay.URL(), o.op.key, o.op.body)
			want201(t, "the next retry", again)
			o.op.seen = append(o.op.seen, again.Body)
			o.finished(t)
		})
	}
}

// The same sequence without a client retry: the completer finishes the charge within
// a few of its intervals after the processor is back (its backoff is at most six), and
// a late retry is answered that charge.
func TestAChargeWhoseClientGaveUpIsFinishedAfterItsTTLByTheCompleter(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			o := chargeOutlivingItsTTL(t, kind)
			waitFor(t, orphanFinishBound, "the completer to finish the charge after the processor came back", func() (bool, string) {
				list := o.c.listCharges(t, o.pay.URL())
				return len(list) == 1 && list[0]["status"] == "succeeded", fmt.Sprint(list)
			})
			took := time.Since(o.resumed)
			t.Logf("the completer finished the charge %v after the processor came back (%.1f completer intervals)",
				took.Round(10*time.Millisecond), took.Seconds()/orphanCompleterInterval.Seconds())
			late := o.c.postCharge(t, o.pay.URL(), o.op.key, o.op.body)
			want201(t, "the late retry", late)
			if !late.replayed() {
				t.Fatalf("the late retry executed the charge again: %s", late)
			}
			o.op.seen = append(o.op.seen, late.Body)
			o.finished(t)
		})
	}
}

// The charge outlives its TTL while every payments process is down too (killed after
// the 503, restarted once the record is past its TTL), so that no completer holds its
// record meanwhile: after the restart, the processor back, the completer finds the
// record, past its TTL, and finishes the charge under its first key. (Before, the
// record counted as expired: it was claimed afresh and the pending charge orphaned.)
func TestAChargeOutlivingItsTTLWhileEveryProcessIsDownIsFinishedAfterTheRestart(t *testing.T) {
	t.Parallel()
	for _, kind := range sqlStores {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			o := pendingCharge(t, kind)
			o.pay.kill()
			// Past its expires_at (its TTL, or the lease of its last holder if that ended
			// later): before, it counted as expired from then on.
			waitFor(t, 4*orphanTTL, "the record to outlive its TTL and its last lease", func() (bool, string) {
				out := mustRunIdem(t, "keys", "list", "--store", o.store, "--state", "unfinished", "--json").stdout
				var page struct {
					Records []struct {
						ExpiresAt time.Time `json:"expires_at"`
					} `json:"records"`
					Now time.Time `json:"now"`
				}
				_ = json.Unmarshal([]byte(out), &page)
				return len(page.Records) == 1 && page.Now.Sub(page.Records[0].ExpiresAt) > time.Second, out
			})
			o.wantListedUnfinished(t)
			if out := mustRunIdem(t, "purge", "--store", o.store).stdout; out != "purged 0 records\n" {
				t.Fatalf("idem purge of a store holding an unfinished charge past its TTL: %q, want nothing purged", out)
			}
			o.pay.restart()
			o.proc.signal(syscall.SIGCONT)
			o.resumed = time.Now()
			waitFor(t, finishBound, "the restarted completer to finish the charge", func() (bool, string) {
				list := o.c.listCharges(t, o.pay.URL())
				return len(list) == 1 && list[0]["status"] == "succeeded", fmt.Sprint(list)
			})
			t.Logf("the restarted completer finished the charge %v after the processor came back", time.Since(o.resumed).Round(10*time.Millisecond))
			late := o.c.postCharge(t, o.pay.URL(), o.op.key, o.op.body)
			want201(t, "the late retry", late)
			o.op.seen = append(o.op.seen, late.Body)
			o.finished(t)
		})
	}
}

// gauge returns the value of the gauge name (without labels), or -1 when it is not
// served.
func (s scrape) gauge(name string) float64 {
	f := s[name]
	if f == nil || len(f.GetMetric()) == 0 {
		return -1
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}
