package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
)

const migrateSynopsis = `--store URL [--create]

Creates or upgrades the idempotency store's schema (idempotent; safe when several
processes migrate at once). The payments tables are migrated by 'idem payments' itself.
An SQLite file must exist, so that a mistyped path is not taken for a new store;
--create makes a new one. A Redis store has no schema: migrate checks that it answers
and says so. On PostgreSQL it then says what a failover of the database may lose
(its replication: synchronous, asynchronous, none, or unknown to a role without
pg_monitor), with a warning for asynchronous standbys.`

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const name = "idem migrate"
	fs := newFlagSet("migrate", migrateSynopsis)
	rawStore := storeFlag(fs)
	create := fs.Bool("create", false, "create the SQLite database file when it does not exist (otherwise a missing file is refused)")
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	u, err := requiredStore(*rawStore)
	if err != nil {
		return usageError(stderr, fs, err.Error())
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
		return exitOK
	}
	if err := st.migrate(ctx); err != nil {
		return failure(stderr, name, fmt.Errorf("migrating %s: %w", u, err))
	}
	fmt.Fprintf(stdout, "migrated %s: idempotency store schema is up to date\n", u)
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
