package mysql

import (
	"context"
	"fmt"
)

// Durability is what the server's settings promise of a committed claim or completion
// when the server or its host crashes.
type Durability struct {
	// FlushLogAtTrxCommit is innodb_flush_log_at_trx_commit: 1 writes and flushes the
	// redo log at every commit; 2 writes it at commit and flushes it about once a
	// second (a crash of the host, not of mysqld, loses up to a second of commits); 0
	// does both about once a second (a crash of mysqld loses them too).
	FlushLogAtTrxCommit int
	// SyncBinlog is sync_binlog: 1 flushes the binary log at every commit; 0 leaves it
	// to the operating system; N flushes every N commits.
	SyncBinlog int
	// LogBin reports whether the binary log is on (log_bin).
	LogBin bool
	// Version is the server's version(), such as "10.11.6-MariaDB-0+deb12u1".
	Version string
}

// Durability reads the server's durability settings.
func (s *Store) Durability(ctx context.Context) (*Durability, error) {
	var d Durability
	err := s.db.QueryRowContext(ctx, queryDurability).Scan(&d.FlushLogAtTrxCommit, &d.SyncBinlog, &d.LogBin, &d.Version)
	if err != nil {
		return nil, interpretError(err)
	}
	return &d, nil
}

// Warnings says, one sentence each, how the settings can lose a committed claim or
// completion (a lost claim lets a retry run the holder's work again; a lost completion
// runs the whole request again): none when every commit is flushed. A Galera cluster
// commits to every node's memory first; there innodb_flush_log_at_trx_commit = 2 loses
// a commit only when every node's host crashes at once, which the warning names.
func (d *Durability) Warnings() []string {
	var w []string
	switch d.FlushLogAtTrxCommit {
	case 1:
	case 2:
		w = append(w, "innodb_flush_log_at_trx_commit = 2: a crash of the host (power, kernel) loses up to a second of "+
			"committed claims and completions, and a retry then runs its request again; set it to 1 (on a Galera "+
			"cluster, only a crash of every node's host at once loses them)")
	default:
		w = append(w, fmt.Sprintf("innodb_flush_log_at_trx_commit = %d: a crash of the server loses up to a second of "+
			"committed claims and completions, and a retry then runs its request again; set it to 1", d.FlushLogAtTrxCommit))
	}
	if d.LogBin && d.SyncBinlog != 1 {
		w = append(w, fmt.Sprintf("sync_binlog = %d with the binary log on: a crash of the host can lose the binary log's "+
			"last commits, which crash recovery then rolls back (and replicas never receive); set it to 1", d.SyncBinlog))
	}
	return w
}
