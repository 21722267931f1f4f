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
and says so.`

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
	return exitOK
}
