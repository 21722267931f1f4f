package idem

import "sync"

// localKeys is what one process knows of a ClaimInHandler route's keys without asking
// the store: the keys whose handler runs here now, and the last keys recorded or found
// recorded here. In its regime of new keys the route sends a request straight to its
// handler, whose transaction finds a recorded key itself, but only after the handler
// ran, and with it the function of the store's Respond (issue 28: on PostgreSQL a
// request and its retry ran it twice, six concurrent duplicates six times). A request
// whose key this process knows is answered before its handler instead, as on the lease
// path: a duplicate of a key whose handler runs here gets 409 request_in_progress, and
// a key recorded here is read first. It is a hint, never relied on for correctness
// (SPEC §14): it saves work and round trips, and a key that another process serves is
// found by the transaction as before.
type localKeys struct {
	mu      sync.Mutex
	running map[cacheKey]Fingerprint
	recent  map[cacheKey]struct{}
	ring    []cacheKey // the recent keys in the order they came, to forget the oldest
	next    int
}

// localRecentKeys is how many recorded keys a route remembers.
const localRecentKeys = 1024

// localKnows is what a route's process knows of a key.
type localKnows int

const (
	localNothing  localKnows = iota
	localRunning             // a request of the key with the same fingerprint is in its handler here
	localRecorded            // the key was recorded here, or found recorded
)

// begin tells what the process knows of k, requested with fingerprint fp, and, when it
// knows nothing, marks k running here until end.
func (l *localKeys) begin(k cacheKey, fp Fingerprint) localKnows {
	l.mu.Lock()
	defer l.mu.Unlock()
	if running, ok := l.running[k]; ok {
		if running.Matches(fp) {
			return localRunning
		}
		return localRecorded // another body: what the store holds decides (key_reused)
	}
	if _, ok := l.recent[k]; ok {
		return localRecorded
	}
	if l.running == nil {
		l.running = make(map[cacheKey]Fingerprint)
	}
	l.running[k] = fp
	return localNothing
}

// end ends the run that begin marked, remembering k as recorded when it is.
func (l *localKeys) end(k cacheKey, recorded bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.running, k)
	if recorded {
		l.remember(k)
	}
}

// remember adds k to the recent keys, forgetting the oldest beyond localRecentKeys.
func (l *localKeys) remember(k cacheKey) {
	if _, ok := l.recent[k]; ok {
		return
	}
	if l.recent == nil {
		l.recent = make(map[cacheKey]struct{}, localRecentKeys)
		l.ring = make([]cacheKey, localRecentKeys)
	}
	if old := l.ring[l.next]; old != (cacheKey{}) {
		delete(l.recent, old)
	}
	l.ring[l.next] = k
	l.next = (l.next + 1) % localRecentKeys
	l.recent[k] = struct{}{}
}

// recorded reports whether k was recorded here, or found recorded, lately: a lease
// route's hint that a request of k is a retry (so that its claim reads the key rather
// than trying the insert of a new key first: idemstore.ClaimParams.LikelyNew).
func (l *localKeys) recorded(k cacheKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.recent[k]
	return ok
}

// note remembers k as recorded here.
func (l *localKeys) note(k cacheKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.remember(k)
}
