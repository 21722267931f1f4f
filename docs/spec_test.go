// Package docs holds the repository's documents; its test keeps every §N that the
// code and the documents cite resolvable in docs/spec.md, the behaviour contract.
package docs

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// sections are the numbered sections of the contract, §1 to §20.
const sections = 20

var (
	heading = regexp.MustCompile(`(?m)^## §(\d+) `)
	// citation is a §N in any file; §5.3 cites item 3 of §5.
	citation = regexp.MustCompile(`§(\d+)`)
)

func TestSpecHasEverySectionInOrder(t *testing.T) {
	spec, err := os.ReadFile("spec.md")
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, m := range heading.FindAllStringSubmatch(string(spec), -1) {
		n, _ := strconv.Atoi(m[1])
		got = append(got, n)
	}
	if len(got) != sections {
		t.Fatalf("spec.md has sections %v, want §1 to §%d", got, sections)
	}
	for i, n := range got {
		if n != i+1 {
			t.Fatalf("spec.md has sections %v, want §1 to §%d in order", got, sections)
		}
	}
}

// Every §N cited anywhere in the repository (code, SQL, scripts, documents) names a
// section of spec.md, and nothing points at a contract outside the repository.
func TestEveryCitationResolvesToSpec(t *testing.T) {
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".sql", ".lua", ".yaml", ".yml", "":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // a binary (a built idem at the root), not a document
		}
		text := string(b)
		for _, m := range citation.FindAllStringSubmatch(text, -1) {
			if n, _ := strconv.Atoi(m[1]); n < 1 || n > sections {
				t.Errorf("%s cites %s, which docs/spec.md does not have", path, m[0])
			}
		}
		if path != filepath.Join("..", "docs", "spec_test.go") && (strings.Contains(text, "SPEC.md") || strings.Contains(text, "shared/SPEC")) {
			t.Errorf("%s points at SPEC.md outside the repository; cite docs/spec.md", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
