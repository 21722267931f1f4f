package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The README's Go cannot drift from the API: every ```go block is the whole of a Go
// file of the repository, or excerpts of one, and those files are compiled by the
// README's test command (the example modules by examples/examples_test.go, the
// Example functions by their packages' tests, which also check their Output). The line
// before a block names its source:
//
//	<!-- file: examples/sqlite/main.go -->     the block is the whole file
//	<!-- excerpt: client/example_test.go -->   the block is consecutive lines of the file;
//	                                           a line "// …" skips lines, in order
//
// Blocks and files compare line by line with leading tabs as four spaces, each run of
// lines dedented to its own first line.
func TestReadmeGoIsCompiledCode(t *testing.T) {
	blocks := readmeGoBlocks(t)
	if len(blocks) == 0 {
		t.Fatal("no ```go block found in README.md: the test reads nothing")
	}
	for _, b := range blocks {
		if b.kind == "" {
			t.Errorf("README.md:%d: a ```go block without a <!-- file: PATH --> or <!-- excerpt: PATH --> line before it", b.line)
			continue
		}
		if filepath.Ext(b.path) != ".go" {
			t.Errorf("README.md:%d: %s is not a Go file", b.line, b.path)
			continue
		}
		src, err := os.ReadFile(filepath.Join("..", b.path))
		if err != nil {
			t.Errorf("README.md:%d: %v", b.line, err)
			continue
		}
		file := normalise(strings.Split(strings.TrimRight(string(src), "\n"), "\n"))
		switch b.kind {
		case "file":
			if !equalLines(b.code, file) {
				t.Errorf("README.md:%d: the block is not %s as it is: copy the file into the README again", b.line, b.path)
			}
		case "excerpt":
			if missing := excerptMissing(b.code, file); missing != "" {
				t.Errorf("README.md:%d: %s has no run of lines starting %q where the block has it (in order, after the previous run): copy it from the file again", b.line, b.path, missing)
			}
		default:
			t.Errorf("README.md:%d: unknown source kind %q (want file or excerpt)", b.line, b.kind)
		}
	}
}

// The README's go get line names the module, and its relative links lead to files.
func TestReadmeNamesTheModuleAndLinksToFiles(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	module := strings.TrimPrefix(strings.SplitN(string(mod), "\n", 2)[0], "module ")
	if !strings.Contains(string(readme), "go get "+module+"\n") {
		t.Errorf("README.md has no line `go get %s`", module)
	}
	links := regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`).FindAllStringSubmatch(string(readme), -1)
	if len(links) == 0 {
		t.Fatal("no relative link found in README.md: the test reads nothing")
	}
	for _, l := range links {
		if _, err := os.Stat(filepath.Join("..", l[1])); err != nil {
			t.Errorf("README.md links to %s: %v", l[1], err)
		}
	}
}

type goBlock struct {
	line       int // of the ```go fence, from 1
	kind, path string
	code       []string
}

var sourceLine = regexp.MustCompile(`^<!-- (file|excerpt): (\S+) -->$`)

// readmeGoBlocks returns the README's ```go blocks with the source line before each.
func readmeGoBlocks(t *testing.T) []goBlock {
	t.Helper()
	f, err := os.Open("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks []goBlock
		cur    *goBlock
		prev   string
		n      int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur != nil && line == "```":
			cur.code = normalise(cur.code)
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code = append(cur.code, line)
		case line == "```go":
			cur = &goBlock{line: n}
			if m := sourceLine.FindStringSubmatch(prev); m != nil {
				cur.kind, cur.path = m[1], m[2]
			}
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("README.md:%d: a ```go block that never ends", cur.line)
	}
	return blocks
}

// normalise turns leading tabs into four spaces each and drops trailing spaces.
func normalise(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		rest := strings.TrimLeft(l, "\t")
		out[i] = strings.TrimRight(strings.Repeat("    ", len(l)-len(rest))+rest, " ")
	}
	return out
}

func equalLines(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// skip is the line of an excerpt that stands for lines left out.
const skip = "// …"

// excerptMissing returns the first line of the first run of code (runs are separated
// by skip lines) that file does not have, in order after the previous run, or "" when
// file has them all.
func excerptMissing(code, file []string) string {
	var runs [][]string
	var run []string
	for _, l := range code {
		if strings.TrimSpace(l) == skip {
			runs, run = append(runs, run), nil
			continue
		}
		run = append(run, l)
	}
	runs = append(runs, run)
	from := 0
	for _, r := range runs {
		if len(r) == 0 {
			continue
		}
		at := find(dedent(r), file, from)
		if at < 0 {
			return strings.TrimSpace(r[0])
		}
		from = at + len(r)
	}
	return ""
}

// find returns where run starts in file at or after from, each window of file dedented
// to its own first line, or -1.
func find(run, file []string, from int) int {
	for i := from; i+len(run) <= len(file); i++ {
		if equalLines(run, dedent(file[i:i+len(run)])) {
			return i
		}
	}
	return -1
}

// dedent removes the indentation of lines' first line from every line that has it.
func dedent(lines []string) []string {
	first := lines[0]
	indent := first[:len(first)-len(strings.TrimLeft(first, " "))]
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = strings.TrimPrefix(l, indent)
	}
	return out
}
