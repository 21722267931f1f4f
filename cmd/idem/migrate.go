package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

const migrateSynopsis = `--store URL [--create] [--finalize [--force]]

Creates or upgrades the idempotency store's schema (idempotent; safe when several
processes migrate at once), then says the store's state (SPEC §20): its format level,
its sealing state and the releases of idem that served it in the last 35 days. The
payments tables are migrated by 'idem payments' itself. An SQLite file must exist, so
that a mistyped path is not taken for a new store; --create makes a new one (at this
release's format level). A Redis store has no schema: migrate checks that it answers.
On PostgreSQL it then says what a failover of the database may lose (its replication:
synchronous, asynchronous, none, or unknown to a role without pg_monitor), with a
warning for asynchronous standbys.

--finalize raises the store's format level to this release's once every process that
serves the store runs this release (docs/operations.md, "Versions that share a store"):
it gives up the rollback to the previous release, and says so. It refuses while a
release that does not know the level served the store today or yesterday, unless
--force. idem 0.2.0 does not record itself: make sure it is gone first.

It fails (exit 1) on a store whose format level is newer than this release knows, and
on a schema with migrations this release does not know (a later release applied them).`

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem migrate"
	fs := newFlagSet("migrate", migrateSynopsis)
	rawStore := storeFlag(fs)
	create := fs.Bool("create", false, "create the SQLite database file when it does not exist (otherwise a missing file is refused)")
	finalize := fs.Bool("finalize", false, "raise the store's format level to this release's, giving up the rollback to the previous release")
	force := fs.Bool("force", false, "with --finalize: finalize even though an older release served the store in the last day")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	u, err := requiredStore(*rawStore)
	if err != nil {
		return usageError(stderr, fs, err.Error())
	}
	if *force && !*finalize {
		return usageError(stderr, fs, "--force goes with --finalize")
	}
	st, err := openStore(ctx, u, newLogger(io.Discard, 0), nil, !*create)
	if errors.Is(err, iofs.ErrNotExist) {
		err = fmt.Errorf("%w (--create makes a new one)", err)
	}
	if err != nil {
		return failure(stderr, name, err)
	}
	defer st.close()
	if u.kind == kindRedis {
		fmt.Fprintf(stdout, "%s: %s\n", u, redisNoMigrate)
	} else {
		if err := st.migrate(ctx); err != nil {
			return failure(stderr, name, fmt.Errorf("migrating %s: %w", u, err))
		}
		unknown, err := st.unknownMigrations(ctx)
		if err != nil {
			return failure(stderr, name, err)
		}
		if len(unknown) > 0 {
			return failure(stderr, name, fmt.Errorf("the schema of %s has migrations this release does not know: %s (a later release applied them); "+
				"this is idem %s, which knows migrations up to %s: run the later release's idem migrate",
				u, strings.Join(unknown, ", "), idem.Release, st.lastMigration))
		}
		fmt.Fprintf(stdout, "migrated %s: idempotency store schema is up to date\n", u)
	}
	state, err := st.check(ctx, u.connTimeout())
	if err != nil {
		return failure(stderr, name, err)
	}
	if *finalize {
		res, err := idem.FinalizeUpgrade(ctx, st.store, idem.FinalizeOptions{Force: *force})
		var older *idem.OlderReleaseError
		switch {
		case errors.As(err, &older):
			return failure(stderr, name, fmt.Errorf("%w (--force finalizes anyway)", err))
		case err != nil:
			return failure(stderr, name, err)
		case !res.Changed():
			fmt.Fprintf(stdout, "format level %d: finalized already, nothing to do\n", res.After.Level)
		default:
			for _, r := range res.Older {
				fmt.Fprintf(stdout, "warning: finalized with --force although %s served the store on %s\n", r.Name(), r.Day)
			}
			fmt.Fprintf(stdout, "finalized: format level %d -> %d\n%s\n", res.Before.Level, res.After.Level, idem.FinalizeGivesUp)
			if u.kind != kindRedis {
				// The schema changes that waited for the level (PostgreSQL: the index of
				// expiry goes).
				if err := st.migrate(ctx); err != nil {
					return failure(stderr, name, fmt.Errorf("migrating %s after finalizing: %w", u, err))
				}
			}
		}
		state = res.After
	}
	if err := writeStoreStatus(ctx, stdout, st, state); err != nil {
		return failure(stderr, name, err)
	}
	if st.pg != nil {
		// What a failover of this database may lose, where the operator looks once.
		r, err := st.pg.Replication(ctx)
		switch {
		case err != nil:
			fmt.Fprintf(stdout, "PostgreSQL: replication unknown: %v\n", err)
		case r.Warning() != "":
			fmt.Fprintf(stdout, "PostgreSQL: %s\nwarning: %s\n", r, r.Warning())
		default:
			fmt.Fprintf(stdout, "PostgreSQL: %s\n", r)
		}
	}
	return exitOK
}

// writeStoreStatus writes the store's state (SPEC §20): its format level, who wrote
// it, its sealing state, and the releases that served the store lately.
func writeStoreStatus(ctx context.Context, w io.Writer, st *openedStore, state idem.StoreState) error {
	fmt.Fprintf(w, "format level %d (this release, idem %s, knows up to %d); state written by %s", state.Level, idem.Release, idem.CurrentFormatLevel, state.WrittenBy())
	if !state.WrittenAt.IsZero() {
		fmt.Fprintf(w, " at %s", state.WrittenAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(w)
	if state.Level < idem.CurrentFormatLevel {
		fmt.Fprintf(w, "not finalized: processes write what idem 0.2.0 reads; once every process serving the store runs idem %s, run idem migrate --finalize\n", idem.Release)
	}
	switch state.Sealing.Phase {
	case idem.SealingNone:
		fmt.Fprintln(w, "sealing: never begun")
	default:
		fmt.Fprintf(w, "sealing: %s at %s\n", state.Sealing.Phase, state.Sealing.At.UTC().Format(time.RFC3339))
	}
	ctx, cancel := context.WithTimeout(ctx, st.url.connTimeout())
	defer cancel()
	served, err := idem.ServedReleases(ctx, st.store, time.Now(), int(idem.ServedRetention/(24*time.Hour)))
	if err != nil {
		return err
	}
	fmt.Fprintln(w, "releases that served the store in the last 35 days (idem 0.2.0 and older do not record themselves):")
	for _, r := range served {
		fmt.Fprintf(w, "  %s  %s (knows format level %d)\n", r.Day, r.Name(), r.Level)
	}
	return nil
}
