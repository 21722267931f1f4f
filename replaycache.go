package idem

import (
	"sync"
	"time"
)

// replayCacheMargin is how long before a record's expires_at its cache entry is
// dropped. The cache reads the process's clock while the store's clock decides expiry
// (SPEC §5); the margin absorbs a bounded skew between the two, so that the cache never
// replays a record the store already treats as absent.
const replayCacheMargin = 2 * time.Second

// replayCache is the bounded in-process cache of completed responses that SPEC §5
// allows ("Replays may need a second [round trip] ..., or none with an optional bounded
// cache of completed responses"). It holds only completed records, keyed by (scope,
// key), each with its fingerprint and expiry; it never holds or creates in-flight
// state. A completed record never changes until it expires (SPEC §5, §6: a completed
// record is never released), which is what makes serving it from memory safe, across
// any number of processes sharing the store.
//
// Eviction is least-recently-used over an intrusive list; one mutex guards it all.
type replayCache struct {
	mu      sync.Mutex
	max     int
	entries map[cacheKey]*cacheEntry
	lru     cacheEntry // sentinel: lru.next is the most recently used
}

type cacheKey struct{ scope, key string }

type cacheEntry struct {
	k          cacheKey
	fp         Fingerprint
	resp       *Response // owned by the cache, never written after put
	until      time.Time // expires_at minus the margin
	prev, next *cacheEntry
}

func newReplayCache(size int) *replayCache {
	c := &replayCache{max: size, entries: make(map[cacheKey]*cacheEntry, min(size, 1024))}
	c.lru.prev, c.lru.next = &c.lru, &c.lru
	return c
}

// get returns the cached response of (scope, key) when the request's fingerprint fp
// matches the record's and the entry has not reached its expiry at now. A mismatch
// misses, so that the store path answers key_reused as usual.
func (c *replayCache) get(scope, key string, fp Fingerprint, now time.Time) (*Response, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[cacheKey{scope, key}]
	if e == nil {
		return nil, false
	}
	if !now.Before(e.until) {
		c.remove(e)
		return nil, false
	}
	if !fp.Matches(e.fp) {
		return nil, false
	}
	c.unlink(e)
	c.pushFront(e)
	return e.resp, true
}

// put caches the completed response of (scope, key), fingerprinted fp and expiring at
// expiresAt, evicting the least recently used entry when full. resp must not be
// changed afterwards. An entry that would already be within the margin of its expiry
// at now is not cached.
func (c *replayCache) put(scope, key string, fp Fingerprint, resp *Response, expiresAt, now time.Time) {
	until := expiresAt.Add(-replayCacheMargin)
	if resp == nil || expiresAt.IsZero() || !now.Before(until) {
		return
	}
	k := cacheKey{scope, key}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[k]; e != nil {
		c.remove(e)
	}
	for len(c.entries) >= c.max {
		c.remove(c.lru.prev)
	}
	e := &cacheEntry{k: k, fp: fp, resp: resp, until: until}
	c.entries[k] = e
	c.pushFront(e)
}

// len returns how many entries the cache holds.
func (c *replayCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

func (c *replayCache) remove(e *cacheEntry) {
	c.unlink(e)
	delete(c.entries, e.k)
}

func (c *replayCache) unlink(e *cacheEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (c *replayCache) pushFront(e *cacheEntry) {
	e.prev, e.next = &c.lru, c.lru.next
	c.lru.next.prev = e
	c.lru.next = e
}

// cloneResponse returns a deep copy of r that shares no memory with it, for the cache
// to keep: the captured response lives in pooled buffers.
func cloneResponse(r *Response) *Response {
	if r == nil {
		return nil
	}
	c := &Response{Status: r.Status, NotStored: r.NotStored, Header: cloneHeader(r.Header)}
	if r.Body != nil {
		c.Body = append(make([]byte, 0, len(r.Body)), r.Body...)
	}
	return c
}

// cloneHeader copies h with every value in one backing array.
func cloneHeader(h map[string][]string) map[string][]string {
	n := 0
	for _, v := range h {
		n += len(v)
	}
	out := make(map[string][]string, len(h))
	all := make([]string, 0, n)
	for k, v := range h {
		all = append(all, v...)
		out[k] = all[len(all)-len(v) : len(all) : len(all)]
	}
	return out
}
