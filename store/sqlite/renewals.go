package sqlite

import (
	"context"
	"errors"
	"sync"
)

// errRenewalSuperseded ends a lease renewal that waits for the write turn held by the
// transaction that is completing the same record.
var errRenewalSuperseded = errors.New("sqlite: lease renewal superseded by the transaction completing the record")

// renewals lets [Store.InTx] call off the lease renewals of its own record.
//
// The idem middleware renews a lease from a heartbeat goroutine and, when the handler's
// InTx asks for the completion (Handle.PrepareCompletion), waits for that goroutine to
// stop. A renewal that started while InTx held the write turn waits for the turn that
// InTx will give back only after the completion: without this it would hold up the
// completion, and SQLite's one write lock with it, until the renewal's own timeout (a
// heartbeat period, 10 s by default). The renewal is not needed: while the transaction
// holds the write lock no process can take the key over.
type renewals struct {
	mu         sync.Mutex
	completing map[recordKey]bool
	waiting    map[recordKey]map[*renewal]struct{}
}

type recordKey struct{ scope, key string }

// renewal is one RecordRenew in progress.
type renewal struct{ cancel context.CancelCauseFunc }

// start registers a renewal of k, or reports false when k is being completed.
func (r *renewals) start(k recordKey, rn *renewal) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.completing[k] {
		return false
	}
	if r.waiting == nil {
		r.waiting = map[recordKey]map[*renewal]struct{}{}
	}
	if r.waiting[k] == nil {
		r.waiting[k] = map[*renewal]struct{}{}
	}
	r.waiting[k][rn] = struct{}{}
	return true
}

// end unregisters a renewal of k.
func (r *renewals) end(k recordKey, rn *renewal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waiting[k], rn)
	if len(r.waiting[k]) == 0 {
		delete(r.waiting, k)
	}
}

// supersede marks k as being completed, calls off its renewals in progress, and
// returns the func that ends the mark.
func (r *renewals) supersede(k recordKey) (done func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.completing == nil {
		r.completing = map[recordKey]bool{}
	}
	r.completing[k] = true
	for rn := range r.waiting[k] {
		rn.cancel(errRenewalSuperseded)
	}
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.completing, k)
	}
}
