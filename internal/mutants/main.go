// Command mutants is the standing mutation check of the configuration-matrix suite
// (issue 28; scripts/mutants runs it): it plants each mutant of a curated list in the
// production code, one at a time, runs the matrix suite alone against it (go test in
// internal/matrix), puts the file back, and prints the score and every survivor.
//
// A mutant is a realistic bug written as an exact text replacement in one file (Go, SQL
// or Lua alike), so that it reaches what a tool working on Go's syntax cannot: the
// stores' statements and scripts. The list (scripts/mutants.txt) says its format. The
// file is restored after each mutant, and on SIGINT or SIGTERM before exiting.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// mutant is one entry of the list.
type mutant struct {
	id, file, why, old, new string
	line                    int // of the entry in the list
}

func main() {
	list := flag.String("list", "scripts/mutants.txt", "the list of mutants")
	run := flag.String("run", "", "run only the mutants whose id matches this regular expression")
	race := flag.Bool("race", false, "run the suite with -race (slower; the README's test command does)")
	timeout := flag.Duration("timeout", 10*time.Minute, "the suite's -timeout for each mutant (a mutant that hangs it is killed)")
	check := flag.Bool("check", false, "only check that every mutant applies to the tree as it is")
	flag.Parse()
	ms, err := parse(*list)
	if err != nil {
		fatal(err)
	}
	if *run != "" {
		re, err := regexp.Compile(*run)
		if err != nil {
			fatal(err)
		}
		ms = filter(ms, re)
	}
	for _, m := range ms {
		if err := m.applies(); err != nil {
			fatal(err)
		}
	}
	if *check {
		fmt.Printf("%d mutants apply\n", len(ms))
		return
	}
	os.Exit(runAll(ms, *race, *timeout))
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mutants:", err)
	os.Exit(2)
}

func filter(ms []mutant, re *regexp.Regexp) []mutant {
	var out []mutant
	for _, m := range ms {
		if re.MatchString(m.id) {
			out = append(out, m)
		}
	}
	return out
}

// parse reads the list: entries of "mutant:", "file:", "why:" lines, then "old:", the
// lines of the text to replace, "new:", the lines that replace it, and "end". Lines
// outside an entry that are empty or start with # are comments.
func parse(path string) ([]mutant, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		ms    []mutant
		cur   *mutant
		part  string // "", "old" or "new"
		old   []string
		repl  []string
		n     int
		seen  = map[string]bool{}
		sc    = bufio.NewScanner(f)
		field = func(line, name string) (string, bool) {
			v, ok := strings.CutPrefix(line, name+":")
			return strings.TrimSpace(v), ok
		}
	)
	for sc.Scan() {
		n++
		line := sc.Text()
		if cur == nil {
			if id, ok := field(line, "mutant"); ok {
				if seen[id] {
					return nil, fmt.Errorf("%s:%d: a second mutant %q", path, n, id)
				}
				seen[id] = true
				cur, part, old, repl = &mutant{id: id, line: n}, "", nil, nil
				continue
			}
			if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "#") {
				continue
			}
			return nil, fmt.Errorf("%s:%d: %q outside an entry", path, n, line)
		}
		switch {
		case part == "" && strings.HasPrefix(line, "file:"):
			cur.file, _ = field(line, "file")
		case part == "" && strings.HasPrefix(line, "why:"):
			cur.why, _ = field(line, "why")
		case line == "old:" && part == "":
			part = "old"
		case line == "new:" && part == "old":
			part = "new"
		case line == "end" && part == "new":
			cur.old, cur.new = strings.Join(old, "\n"), strings.Join(repl, "\n")
			if cur.file == "" || cur.why == "" || cur.old == "" || cur.old == cur.new {
				return nil, fmt.Errorf("%s:%d: mutant %q needs a file, a why and an old text that the new one changes", path, cur.line, cur.id)
			}
			ms = append(ms, *cur)
			cur = nil
		case part == "old":
			old = append(old, line)
		case part == "new":
			repl = append(repl, line)
		default:
			return nil, fmt.Errorf("%s:%d: %q in mutant %q (want file:, why:, old:, new:, end)", path, n, line, cur.id)
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: mutant %q has no end", path, cur.line, cur.id)
	}
	return ms, sc.Err()
}

// applies checks that m's old text is in its file exactly once.
func (m mutant) applies() error {
	b, err := os.ReadFile(m.file)
	if err != nil {
		return fmt.Errorf("mutant %s: %w", m.id, err)
	}
	if c := bytes.Count(b, []byte(m.old)); c != 1 {
		return fmt.Errorf("mutant %s (line %d of the list): its old text is in %s %d times, want once: the code changed, update the entry", m.id, m.line, m.file, c)
	}
	return nil
}

// restorer puts back the file a mutant changed, once, from the signal handler or after
// the run, whichever comes first.
type restorer struct {
	mu   sync.Mutex
	file string
	orig []byte
}

func (r *restorer) set(file string, orig []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.file, r.orig = file, orig
}

func (r *restorer) restore() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.file == "" {
		return nil
	}
	err := os.WriteFile(r.file, r.orig, 0o644)
	r.file, r.orig = "", nil
	return err
}

// verdict is what the suite made of a mutant.
type verdict struct {
	m      mutant
	killed bool
	by     string // the first failing test, or why the run failed
	took   time.Duration
}

func runAll(ms []mutant, race bool, timeout time.Duration) int {
	var r restorer
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		s := <-sig
		cancel()
		if err := r.restore(); err != nil {
			fmt.Fprintln(os.Stderr, "mutants: restoring the tree:", err)
		}
		fmt.Fprintf(os.Stderr, "\nmutants: %v: the tree is restored\n", s)
		os.Exit(130)
	}()
	var vs []verdict
	start := time.Now()
	for i, m := range ms {
		orig, err := os.ReadFile(m.file)
		if err != nil {
			fatal(err)
		}
		r.set(m.file, orig)
		if err := os.WriteFile(m.file, bytes.Replace(orig, []byte(m.old), []byte(m.new), 1), 0o644); err != nil {
			_ = r.restore()
			fatal(err)
		}
		fmt.Printf("[%d/%d] %s (%s): ", i+1, len(ms), m.id, m.file)
		v, suiteErr := suite(ctx, m, race, timeout)
		if err := r.restore(); err != nil {
			fatal(fmt.Errorf("restoring %s: %w", m.file, err))
		}
		if suiteErr != nil && ctx.Err() == nil {
			fatal(suiteErr) // the tree is restored
		}
		if ctx.Err() != nil {
			return 130
		}
		if v.killed {
			fmt.Printf("killed by %s (%s)\n", v.by, v.took.Round(time.Second))
		} else {
			fmt.Printf("SURVIVED (%s)\n", v.took.Round(time.Second))
		}
		vs = append(vs, v)
	}
	killed := 0
	var survivors []verdict
	for _, v := range vs {
		if v.killed {
			killed++
		} else {
			survivors = append(survivors, v)
		}
	}
	fmt.Printf("\nmutation score: %d of %d mutants killed by the matrix suite alone (%.0f%%), in %s\n",
		killed, len(vs), 100*float64(killed)/float64(max(len(vs), 1)), time.Since(start).Round(time.Second))
	for _, v := range survivors {
		fmt.Printf("survivor %s (%s): %s\n", v.m.id, v.m.file, v.m.why)
	}
	if len(survivors) > 0 {
		return 1
	}
	return 0
}

// buildFailed matches go test's report of a package that did not compile: a mutant
// that does not build is a mistake of the list, not a kill.
var buildFailed = regexp.MustCompile(`\[build failed\]|\[setup failed\]`)

var firstFail = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// suite runs the matrix suite against the tree as it is and says whether it failed.
// It returns an error when the run says nothing of the mutant: it does not build, or
// the go command could not run.
func suite(ctx context.Context, m mutant, race bool, timeout time.Duration) (verdict, error) {
	args := []string{"test", "-count=1", "-failfast", "-timeout=" + timeout.String()}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "./...")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join("internal", "matrix")
	cmd.Env = append(os.Environ(), "CI=true", "GOWORK=off", "GOFLAGS=-mod=readonly")
	// Its own process group, killed whole when the run is cancelled: the test binary
	// that go test starts must not outlive an interrupted run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	start := time.Now()
	out, err := cmd.CombinedOutput()
	v := verdict{m: m, took: time.Since(start)}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return v, nil
	case buildFailed.Match(out):
		return v, fmt.Errorf("mutant %s (line %d of the list) does not build: fix the entry\n%s", m.id, m.line, out)
	case !errors.As(err, &exit):
		return v, fmt.Errorf("running the suite: %w", err)
	}
	v.killed, v.by = true, "the suite's failure"
	if f := firstFail.FindAllSubmatch(out, -1); len(f) > 0 {
		v.by = string(f[len(f)-1][1]) // the innermost: the cell
	} else if bytes.Contains(out, []byte("panic: test timed out")) {
		v.by = "the suite's timeout"
	} else if lines := bytes.Split(bytes.TrimSpace(out), []byte("\n")); len(lines) > 0 {
		v.by = "the suite's failure: " + string(lines[0]) // a panic, a failed package init
	}
	return v, nil
}
