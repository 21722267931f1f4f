package docs

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The README's Go cannot drift from the API: every ```go block of the README, of the
// library guide and of the foreign-effects guide (goDocuments) is the whole of a Go file of the repository, or
// excerpts of one, and those files are compiled by the README's test command (the example modules by examples/examples_test.go, the
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
	for _, doc := range goDocuments {
		blocks := readmeGoBlocks(t, doc)
		if len(blocks) == 0 {
			t.Fatalf("no ```go block found in %s: the test reads nothing", doc)
		}
		for _, b := range blocks {
			if b.kind == "" {
				t.Errorf("%s:%d: a ```go block without a <!-- file: PATH --> or <!-- excerpt: PATH --> line before it", doc, b.line)
				continue
			}
			if filepath.Ext(b.path) != ".go" {
				t.Errorf("%s:%d: %s is not a Go file", doc, b.line, b.path)
				continue
			}
			src, err := os.ReadFile(filepath.Join("..", b.path))
			if err != nil {
				t.Errorf("%s:%d: %v", doc, b.line, err)
				continue
			}
			file := normalise(strings.Split(strings.TrimRight(string(src), "\n"), "\n"))
			switch b.kind {
			case "file":
				if !equalLines(b.code, file) {
					t.Errorf("%s:%d: the block is not %s as it is: copy the file into %s again", doc, b.line, b.path, doc)
				}
			case "excerpt":
				if missing := excerptMissing(b.code, file); missing != "" {
					t.Errorf("%s:%d: %s has no run of lines starting %q where the block has it (in order, after the previous run): copy it from the file again", doc, b.line, b.path, missing)
				}
			default:
				t.Errorf("%s:%d: unknown source kind %q (want file or excerpt)", doc, b.line, b.kind)
			}
		}
	}
}

// goDocuments are the documents whose ```go blocks are compiled code, as paths from
// the repository's root. Their <!-- file: --> and <!-- excerpt: --> paths are from
// the root too.
var goDocuments = []string{"README.md", "docs/library.md", "docs/foreign-effects.md"}

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

// readmeGoBlocks returns the ```go blocks of doc (a path from the repository's root)
// with the source line before each.
func readmeGoBlocks(t *testing.T, doc string) []goBlock {
	t.Helper()
	f, err := os.Open(filepath.Join("..", doc))
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
		t.Fatalf("%s:%d: a ```go block that never ends", doc, cur.line)
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

// Every relative link of the README and of the documents in docs/ leads to a file, and
// a link to a heading of a Markdown file (path#anchor, or #anchor in the same file)
// leads to a heading that exists, so that moving a section cannot leave a link behind.
func TestDocLinksLeadToFilesAndHeadings(t *testing.T) {
	docs, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, "../README.md")
	link := regexp.MustCompile(`\]\(([^)#:\s]*)(#[^)\s]*)?\)`)
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(withoutCode(string(b)), -1) {
			target, anchor := m[1], strings.TrimPrefix(m[2], "#")
			path := doc
			if target != "" {
				path = filepath.Join(filepath.Dir(doc), target)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s: %v", doc, target, err)
					continue
				}
			}
			if anchor == "" || filepath.Ext(path) != ".md" {
				continue
			}
			md, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !headingAnchors(string(md))[anchor] {
				t.Errorf("%s links to %s#%s: %s has no such heading", doc, target, anchor, path)
			}
		}
	}
}

// fence is a line that opens or closes a fenced code block.
var fence = regexp.MustCompile("(?m)^```")

// withoutCode returns text without its fenced code blocks, whose brackets are code,
// not links.
func withoutCode(text string) string {
	parts := fence.Split(text, -1)
	var b strings.Builder
	for i := 0; i < len(parts); i += 2 {
		b.WriteString(parts[i])
	}
	return b.String()
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown text:
// lower case, spaces as hyphens, punctuation other than hyphens and underscores
// dropped, and -1, -2, … after a repeated one.
func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	for _, line := range strings.Split(withoutCode(text), "\n") {
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		var a strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(title)) {
			switch {
			case r == ' ':
				a.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				a.WriteRune(r)
			}
		}
		s := a.String()
		if n := seen[s]; n > 0 {
			anchors[s+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[s] = true
		}
		seen[s]++
	}
	return anchors
}
