package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"

	"github.com/idem-go/idem/internal/secret"
)

// envPrefix starts the environment variable of every flag (SPEC §15): --lock-timeout
// of any subcommand can also be set by IDEM_LOCK_TIMEOUT. A flag on the command line
// wins over its variable; an empty variable counts as unset.
const envPrefix = "IDEM_"

// envName returns the environment variable of the flag named name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// fromEnv marks the value of a flag that was set from its environment variable, so
// that errors about the flag name the variable instead.
type fromEnv struct {
	flag.Value
	variable string
}

// newFlagSet returns a flag set whose parse errors are not printed by the flag package:
// parse prints them as one line. Its usage lists each flag with its variable.
func newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("idem "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "usage: idem %s %s\n\nflags (each can also be set by the environment variable shown; the flag wins):\n", name, synopsis)
		printFlags(out, fs)
	}
	return fs
}

// printFlags lists the flags of fs as flag.PrintDefaults does, with each flag's
// environment variable at the end of its first line.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintf(w, "%s   [$%s]\n", line, envName(f.Name))
		usage = strings.ReplaceAll(usage, "\n", "\n        ")
		switch {
		case f.DefValue == "" || f.DefValue == "0" || f.DefValue == "0s" || f.DefValue == "false":
		case fmt.Sprintf("%T", f.Value) == "*flag.stringValue":
			usage += fmt.Sprintf(" (default %q)", f.DefValue)
		default:
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "        %s\n", usage)
	})
}

// parse parses args into fs, then sets every flag that the command line left unset
// from its environment variable (IDEM_<FLAG>), when that is set and not empty. When it
// returns done, the command must return code: 0 after --help (usage on stdout), 2 after
// a bad flag, a bad variable or a stray argument (one line on stderr).
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, done bool) {
	return parseEnv(fs, args, stdout, stderr, func(fs *flag.FlagSet, environ []string, stderr io.Writer) error {
		warnUnknownEnv(fs, environ, stderr)
		return nil
	})
}

// parseEnv is parse with unknown, a policy for the IDEM_ variables that name no flag
// of fs: its error is a bad variable's (exit 2).
func parseEnv(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, unknown func(*flag.FlagSet, []string, io.Writer) error) (code int, done bool) {
	if c, ok := stdout.(*flagCollector); ok {
		c.add(fs) // commandVariables asks for the flags only
		return exitOK, true
	}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK, true
	case err != nil:
		return usageError(stderr, fs, err.Error()), true
	case fs.NArg() > 0:
		return usageError(stderr, fs, fmt.Sprintf("unexpected argument %q", fs.Arg(0))), true
	}
	if err := setFromEnv(fs, os.LookupEnv); err != nil {
		return usageError(stderr, fs, err.Error()), true
	}
	if err := unknown(fs, os.Environ(), stderr); err != nil {
		return usageError(stderr, fs, err.Error()), true
	}
	return 0, false
}

// testEnvPrefix starts the variables of the repository's tests (IDEM_TEST_POSTGRES_URL),
// which are not any command's.
const testEnvPrefix = envPrefix + "TEST_"

// warnUnknownEnv names on stderr, one line each, the IDEM_ variables of environ that
// name no flag of any idem command (a typo such as IDEM_LOCKTIMEOUT would otherwise be
// ignored without a word), with the variable it most likely meant, of fs first. A
// variable of another command is not named: a shared environment may hold it. Empty
// variables count as unset, as they do for flags.
func warnUnknownEnv(fs *flag.FlagSet, environ []string, stderr io.Writer) {
	own := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { own[envName(f.Name)] = true })
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || strings.HasPrefix(name, testEnvPrefix) || value == "" || own[name] {
			continue
		}
		all := commandVariables()
		if all[name] {
			continue
		}
		line := fmt.Sprintf("%s: %s is not a variable of any idem command; ignored", fs.Name(), name)
		meant := closestVariable(name, own)
		if meant == "" {
			meant = closestVariable(name, all)
		}
		if meant != "" {
			line += " (did you mean " + meant + "?)"
		}
		fmt.Fprintln(stderr, line)
	}
}

// commands are the command lines whose flags commandVariables collects: every command
// that parses flags (TestCommandVariablesCoverEveryCommand keeps the list whole).
var commands = [][]string{{"payments"}, {"processor"}, {"proxy"}, {"migrate"}, {"purge"}, {"load"},
	{"keys", "get"}, {"keys", "list"}, {"keys", "delete"}, {"keys", "resolve"}, {"check"}}

// commandVariables returns the environment variable of every flag of every command,
// collected once by running each command with a flagCollector as its stdout: parse
// hands it the command's flag set and stops before the command does anything.
func commandVariables() map[string]bool {
	collectOnce.Do(func() {
		c := &flagCollector{vars: map[string]bool{}}
		for _, args := range commands {
			run(context.Background(), args, c, io.Discard)
		}
		collected = c.vars
	})
	return collected
}

var (
	collectOnce sync.Once
	collected   map[string]bool
)

// flagCollector is the stdout of a command run by commandVariables.
type flagCollector struct {
	vars map[string]bool
	n    int // flag sets added
}

func (c *flagCollector) Write(p []byte) (int, error) { return len(p), nil }

func (c *flagCollector) add(fs *flag.FlagSet) {
	c.n++
	fs.VisitAll(func(f *flag.Flag) { c.vars[envName(f.Name)] = true })
}

// closestVariable returns the variable of known that name most likely misspells: the
// same letters without the underscores, or one edit away (two for names of eight
// letters or more); "" when none is.
func closestVariable(name string, known map[string]bool) string {
	squash := func(s string) string { return strings.ReplaceAll(strings.TrimPrefix(s, envPrefix), "_", "") }
	n := squash(name)
	best, bestDist := "", 3
	for v := range known {
		d := editDistance(n, squash(v))
		if d == 2 && len(n) < 8 { // two edits make one short name of another (TTL, URL)
			continue
		}
		if d < bestDist || (d == bestDist && v < best) {
			best, bestDist = v, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// setFromEnv sets each flag of fs that was not set on the command line from its
// environment variable, read through lookup.
func setFromEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		variable := envName(f.Name)
		v, ok := lookup(variable)
		if err != nil || onCommandLine[f.Name] || !ok || v == "" {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			// A string never fails to parse, so the value shown is not a password;
			// redact it anyway in case a future flag parses URLs itself.
			err = fmt.Errorf("invalid value %q for %s: %v", redact(v), variable, e)
			return
		}
		f.Value = fromEnv{Value: f.Value, variable: variable}
	})
	return err
}

// usageError prints "idem <command>: msg" as one line and returns exitUsage. Where msg
// names a flag (--store) whose value came from the environment, it names the variable
// (IDEM_STORE) instead, so that the user knows what to fix.
func usageError(stderr io.Writer, fs *flag.FlagSet, msg string) int {
	fs.VisitAll(func(f *flag.Flag) {
		if e, ok := f.Value.(fromEnv); ok {
			msg = replaceFlagName(msg, f.Name, e.variable)
		}
	})
	fmt.Fprintf(stderr, "%s: %s\n", fs.Name(), oneLine(msg))
	return exitUsage
}

// replaceFlagName replaces every "--name" in msg that is not the start of a longer
// flag's name (--store in --store-timeout) with with.
func replaceFlagName(msg, name, with string) string {
	needle := "--" + name
	var b strings.Builder
	for {
		i := strings.Index(msg, needle)
		if i < 0 {
			b.WriteString(msg)
			return b.String()
		}
		end := i + len(needle)
		if end < len(msg) && isFlagNameByte(msg[end]) {
			b.WriteString(msg[:end])
		} else {
			b.WriteString(msg[:i] + with)
		}
		msg = msg[end:]
	}
}

func isFlagNameByte(c byte) bool {
	return c == '-' || c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// failure prints "idem <command>: err" as one line and returns exitFailure.
func failure(stderr io.Writer, command string, err error) int {
	fmt.Fprintf(stderr, "%s: %s\n", command, oneLine(err.Error()))
	return exitFailure
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// checkHTTPURL checks the value of a required http:// or https:// URL flag; errors
// name the flag, show form as the URL wanted, and redact the URL's passwords.
func checkHTTPURL(name, raw, form string) error {
	u, err := url.Parse(raw)
	switch {
	case raw == "":
		return fmt.Errorf("--%s is required", name)
	case err != nil:
		return fmt.Errorf("--%s: %w", name, secret.RedactURLError(err))
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("--%s %q: want %s", name, redact(raw), form)
	}
	return nil
}

// storeFlag registers the required --store flag of migrate, purge and keys.
func storeFlag(fs *flag.FlagSet) *string {
	return fs.String("store", "", "idempotency store `URL` (required): sqlite:PATH, postgres://…, redis://…, redis+cluster://…, redis+sentinel://…?master=NAME")
}

// requiredStore parses the value of a required --store flag; errors name the flag.
func requiredStore(raw string) (storeURL, error) {
	if raw == "" {
		return storeURL{}, errors.New("--store is required")
	}
	u, err := parseStoreURL(raw)
	if err != nil {
		return u, fmt.Errorf("--store: %w", err)
	}
	return u, nil
}

// logFlags are the logging flags of every subcommand that logs.
type logFlags struct {
	format logFormat
	level  slog.Level
}

// register adds --log-format and --log-level to fs.
func (l *logFlags) register(fs *flag.FlagSet) {
	l.format = logText
	fs.Var(&l.format, "log-format", "log lines as `text` (logfmt, no time: the service manager adds it) or json (one object per line, with the time)")
	fs.TextVar(&l.level, "log-level", slog.LevelInfo, "least severe `level` logged: debug (adds a line per request and the stores' own logs), info, warn or error")
}

// logger returns a logger writing to w at level.
func (l *logFlags) logger(w io.Writer, level slog.Level) *slog.Logger {
	if l.format == logJSON {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return newLogger(w, level)
}

// logFormat is the value of --log-format.
type logFormat string

const (
	logText logFormat = "text"
	logJSON logFormat = "json"
)

func (f *logFormat) String() string { return string(*f) }

func (f *logFormat) Set(s string) error {
	switch logFormat(s) {
	case logText, logJSON:
		*f = logFormat(s)
		return nil
	}
	return errors.New("want text or json")
}

// newLogger logs slog text lines without a time, such as
// level=INFO msg="idem payments listening" addr=127.0.0.1:8080 ….
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}
