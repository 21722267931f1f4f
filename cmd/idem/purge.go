package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/idem-go/idem/idemstore"
)

const purgeSynopsis = `--store URL [--older-than DURATION]

Deletes the idempotency records whose expires_at is before now - DURATION, in batches,
and prints "purged N records". A record in flight under a live lease is never deleted,
nor an unfinished operation's (in flight after one of its steps committed, SPEC §13),
which never expires: 'idem keys list --state unfinished' shows them.
A Redis store expires its records itself (key TTL): purge checks that it answers and
says so.`

// purgeBatch bounds one delete, so that purging never holds locks for long.
const purgeBatch = 1000

func runPurge(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem purge"
	fs := newFlagSet("purge", purgeSynopsis)
	rawStore := storeFlag(fs)
	olderThan := fs.Duration("older-than", 0, "keep records that expired less than this long ago")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	u, err := requiredStore(*rawStore)
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}
	if *olderThan < 0 {
		return usageError(stderr, fs, fmt.Sprintf("--older-than must not be negative, got %v", *olderThan))
	}
	st, err := openStore(ctx, u, newLogger(io.Discard, 0), nil, true)
	if err != nil {
		return failure(stderr, name, err)
	}
	defer st.close()
	if _, err := st.check(ctx, u.connTimeout()); err != nil {
		return failure(stderr, name, err)
	}
	if u.kind == kindRedis {
		fmt.Fprintf(stdout, "%s: %s\n", u, redisNoPurge)
		return exitOK
	}
	n, err := purge(ctx, st.store, *olderThan)
	if err != nil {
		return failure(stderr, name, fmt.Errorf("purging %s after %d records: %w", u, n, err))
	}
	fmt.Fprintf(stdout, "purged %d records\n", n)
	return exitOK
}

// purge deletes expired records in batches until a batch comes back short.
func purge(ctx context.Context, st idemstore.Store, olderThan time.Duration) (int, error) {
	total := 0
	for {
		n, err := st.RecordDeleteExpired(ctx, &idemstore.DeleteExpiredParams{Retention: olderThan, Limit: purgeBatch})
		total += n
		if err != nil || n < purgeBatch {
			return total, err
		}
	}
}
