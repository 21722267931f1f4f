package postgres

import (
	"context"
	"sync/atomic"
	"time"
)

// What a store knows of its sessions' synchronous_commit. Every statement that writes
// a record raises the transaction's setting to on when it is weaker ({{durable}},
// queries/records.sql), so that a record commits durably whatever the server, the
// database, the role or the connection's parameters say. Where they say on or
// stronger already, the raise changes nothing and still costs PostgreSQL the setting's
// save and its restore at the commit (issue 50). So the store reads the setting from
// its pool, when it first writes a record and again every durabilityReread, and while
// the last read found on, remote_write or remote_apply it sends the kept statements
// (queries.kept), which do not raise. Until a read answered, and whenever it found
// off or local, it sends the statements that raise.
//
// What a read cannot see: a session whose setting an application lowered with SET
// (not SET LOCAL) on one pooled connection, or an AfterConnect hook that lowers it on
// some connections only. A setting lowered for the server, the database or the role
// is seen at the next read, within durabilityReread; a write that meets an error not
// from the server (a lost connection, a failover) forgets the last read, so that the
// writes raise again until the store read the setting anew (forget).

// durabilityReread is how long a read of the sessions' synchronous_commit holds.
const durabilityReread = time.Minute

// durabilityRetry is how soon a read that failed is tried again (the store sends the
// raising statements meanwhile).
const durabilityRetry = time.Second

// durability is the last read of the sessions' synchronous_commit.
type durability struct {
	// origin is the store's creation: due counts from it, on the monotonic clock.
	origin time.Time
	// due is when the next read is due, in nanoseconds after origin (0: at once).
	due atomic.Int64
	// kept says that the last read found on or stronger.
	kept atomic.Bool
	// reading says that a read is under way.
	reading atomic.Bool
}

// writes returns the statements that write records: the kept ones while the last read
// of the sessions' synchronous_commit found it on or stronger, the raising ones
// otherwise. It starts a read in the background when one is due.
func (s *Store) writes() *queries {
	d := &s.durability
	if time.Since(d.origin).Nanoseconds() >= d.due.Load() && d.reading.CompareAndSwap(false, true) {
		go s.readDurability()
	}
	if d.kept.Load() {
		return s.q.kept
	}
	return s.q
}

// readDurability reads the sessions' synchronous_commit once and records what it found.
func (s *Store) readDurability() {
	d := &s.durability
	defer d.reading.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var setting string
	next := durabilityReread
	if err := s.pool.QueryRow(ctx, s.q.sessionSynchronousCommit).Scan(&setting); err != nil {
		next = durabilityRetry // keep what the last read found: the writes fail meanwhile too
	} else {
		d.kept.Store(synchronousCommitKept(setting))
	}
	d.due.Store((time.Since(d.origin) + next).Nanoseconds())
}

// forget forgets what the last read found, after a write met the store unavailable (a
// connection lost, a server gone: a failover may put the store on a server whose
// settings differ): the writes raise the setting again until the next read, due at
// once, says otherwise.
func (d *durability) forget() {
	if d.kept.CompareAndSwap(true, false) {
		d.due.Store(0)
	}
}

// synchronousCommitKept reports whether a session's synchronous_commit is one that
// raiseSynchronousCommit keeps as it is.
func synchronousCommitKept(setting string) bool {
	switch setting {
	case "on", "remote_write", "remote_apply":
		return true
	}
	return false
}
