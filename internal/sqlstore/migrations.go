package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
)

// Migration is one numbered file of a store's migrations, such as 0001_records.sql.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations lists the migrations in dir of fsys (files NNNN_name.sql) in version
// order; pkg prefixes errors.
func Migrations(fsys fs.FS, dir, pkg string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		name := strings.TrimSuffix(e.Name(), ".sql")
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("%s: migration file %q is not named NNNN_name.sql", pkg, e.Name())
		}
		b, err := fs.ReadFile(fsys, dir+"/"+e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	slices.SortFunc(ms, func(a, b Migration) int { return a.Version - b.Version })
	return ms, nil
}

// Last names the last of ms, "" when there is none.
func Last(ms []Migration, err error) string {
	if err != nil || len(ms) == 0 {
		return ""
	}
	return ms[len(ms)-1].Name
}

// Conn runs statements: a pool, a connection or a transaction.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// AppliedVersions creates the migrations' table when missing (create) and returns the
// versions it records (applied).
func AppliedVersions(ctx context.Context, c Conn, create, applied string) (map[int]bool, error) {
	if _, err := c.ExecContext(ctx, create); err != nil {
		return nil, err
	}
	rows, err := c.QueryContext(ctx, applied)
	if err != nil {
		return nil, err
	}
	vs, err := Collect(rows, func(r RowScanner) (v int, err error) { return v, r.Scan(&v) })
	done := map[int]bool{}
	for _, v := range vs {
		done[v] = true
	}
	return done, err
}

// UnknownMigrations runs query, which reads (version, name) of the migrations recorded
// after the last one a release embeds, and names them "0004_name".
func UnknownMigrations(ctx context.Context, c Conn, query string, args ...any) ([]string, error) {
	rows, err := c.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return Collect(rows, func(r RowScanner) (string, error) {
		var v int
		var name string
		if err := r.Scan(&v, &name); err != nil {
			return "", err
		}
		if !strings.HasPrefix(name, fmt.Sprintf("%04d_", v)) {
			name = fmt.Sprintf("%04d_%s", v, name)
		}
		return name, nil
	})
}
