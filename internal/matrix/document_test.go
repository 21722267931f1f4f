package matrix

import (
	"flag"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "write docs/combinations.md from the table")

// docs/combinations.md is the table this suite asserts, generated from it: a cell
// whose expectation changes changes the document, and a document edited by hand fails.
func TestCombinationsDocument(t *testing.T) {
	t.Parallel()
	const path = "../../docs/combinations.md"
	want := Document()
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s differs from the table the suite asserts: run (cd internal/matrix && go test -run TestCombinationsDocument -update)", path)
	}
}
