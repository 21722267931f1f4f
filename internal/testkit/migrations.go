package testkit

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The rule of rolling upgrades: while a deploy replaces processes one by one, a
// process of the previous version runs beside a schema that the new version migrated,
// so a migration only adds (tables, columns that are NULL or have a default, indexes,
// functions under new names) and never changes or removes what the previous version
// uses.
var (
	changesWhatExists = []*regexp.Regexp{
		regexp.MustCompile(`(?i)\bDROP\s+(FUNCTION|TABLE|COLUMN|INDEX|TYPE|VIEW|TRIGGER)\b`),
		regexp.MustCompile(`(?i)\bCREATE\s+OR\s+REPLACE\b`),
		regexp.MustCompile(`(?i)\bALTER\s+COLUMN\b`),
		regexp.MustCompile(`(?i)\bRENAME\b`),
	}
	addColumn  = regexp.MustCompile(`(?i)\bADD\s+COLUMN\b([^,;]*)`)
	sqlComment = regexp.MustCompile(`--[^\n]*`)
)

// MigrationsOnlyAdd fails t unless every migration file of dir (NNNN_name…sql)
// numbered after last only adds, by the rule of rolling upgrades. A migration that
// drops what no running version uses any more is listed in exempt.
func MigrationsOnlyAdd(t testing.TB, dir string, last int, exempt ...int) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.sql"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations in %s: %v", dir, err)
	}
	for _, f := range files {
		version, err := strconv.Atoi(strings.SplitN(filepath.Base(f), "_", 2)[0])
		if err != nil {
			t.Fatalf("%s: not named NNNN_name: %v", f, err)
		}
		if version <= last || slices.Contains(exempt, version) {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sql := sqlComment.ReplaceAllString(string(b), "")
		for _, re := range changesWhatExists {
			if m := re.FindString(sql); m != "" {
				t.Errorf("%s: %q changes what a process of the previous version may use; add instead", f, m)
			}
		}
		for _, m := range addColumn.FindAllStringSubmatch(sql, -1) {
			if def := strings.ToUpper(m[1]); strings.Contains(def, "NOT NULL") && !strings.Contains(def, "DEFAULT") {
				t.Errorf("%s: ADD COLUMN%s: a NOT NULL column without a default fails the previous version's inserts", f, m[1])
			}
		}
	}
}
