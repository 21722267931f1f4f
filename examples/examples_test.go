package examples

import (
	"context"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/testenv"
)

// exampleTimeout bounds the vet and tests of one example module, builds included.
const exampleTimeout = 10 * time.Minute

// module is the root module, which every example requires (replaced by ../..).
const module = "github.com/idem-go/idem"

// exampleModules returns the examples: the directories here that hold a go.mod.
func exampleModules(t *testing.T) []string {
	t.Helper()
	mods, err := filepath.Glob("*/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mods {
		names = append(names, filepath.Dir(m))
	}
	if want := []string{"chi", "echo", "fiber", "gin", "mysql", "payouts", "postgres", "postgres-sql", "redis", "sqlite"}; !slices.Equal(names, want) {
		t.Fatalf("example modules %q, want %q", names, want)
	}
	return names
}

// Every example is its own module: the README's quick starts (sqlite, postgres, mysql,
// postgres-sql, redis), the frameworks (chi, echo, fiber, gin) and the hard case
// (payouts: a handler that calls a bank). Its tests serve it on a loopback port and
// send a duplicate POST, which must be replayed; payouts' crash test builds the
// program and SIGKILLs it under retrying clients (about 30 s). They run here
// with the go command on a copy of the example outside the repository, renamed
// example.com/NAME and requiring idem from this checkout, with the modules' go.sum as
// committed (-mod=readonly) and no workspace: as a user who copies an example out
// builds it. (Under its own path github.com/idem-go/idem/examples/NAME, the go command
// would let it import idem's internal packages.)
func TestExamplesPassTheirTests(t *testing.T) {
	if testing.Short() && !testenv.CI() {
		t.Skip("-short: the examples build their frameworks")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		testenv.Unavailable(t, "the go command is not on PATH: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range exampleModules(t) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), name)
			if err := os.CopyFS(dir, os.DirFS(name)); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{
				{"mod", "edit", "-module", "example.com/" + name, "-replace", module + "=" + root},
				{"vet", "./..."},
				{"test", "-count=1", "./..."},
			} {
				ctx, cancel := context.WithTimeout(context.Background(), exampleTimeout)
				cmd := exec.CommandContext(ctx, goBin, args...)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
				out, err := cmd.CombinedOutput()
				cancel()
				if err != nil {
					t.Fatalf("go %s in examples/%s, copied out as example.com/%[2]s, failed: %v\n%s\n"+
						"(a missing go.sum entry after a change of the root module's requirements: (cd examples/%[2]s && go mod tidy))",
						args, name, err, out)
				}
				t.Logf("go %s: %s", args, out)
			}
		})
	}
}

// An example is a program to copy: its Go files, tests included, import the standard
// library, idem's public packages, and their framework or driver, never a package of
// idem under an internal/ directory nor another example's.
func TestExamplesImportOnlyPublicPackages(t *testing.T) {
	files := 0
	for _, name := range exampleModules(t) {
		err := filepath.WalkDir(name, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || filepath.Ext(path) != ".go" {
				return err
			}
			files++
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			for _, imp := range f.Imports {
				p, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					return err
				}
				rest, ok := strings.CutPrefix(p, module+"/")
				if ok && (slices.Contains(strings.Split(rest, "/"), "internal") || strings.HasPrefix(rest, "examples/")) {
					t.Errorf("examples/%s imports %s: an example must build when copied out of the repository on its own", path, p)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files == 0 {
		t.Fatal("no Go file found in the examples: the test reads nothing")
	}
}
