// Command idem runs the reference payments API of the idem module, gives any HTTP API
// idempotency keys as a reverse proxy, and maintains idempotency stores:
//
//	idem payments [--addr 127.0.0.1:8080] [--store URL] [--db URL] [--ttl 24h]
//	              [--lock-timeout 30s] [--processor-latency 0s] [--profile seed|ietf]
//	              [--disable-idempotency]
//	idem processor [--addr 127.0.0.1:8090] [--store URL] [--latency D] [--fail-rate F]
//	              [--lost-reply-rate F]
//	idem migrate  --store URL
//	idem purge    --store URL [--older-than DURATION]
//	idem load     --url URL [--concurrency N] [--duration D | --requests N] ...
//	idem keys     get|list|delete|resolve --store URL ...
//	idem check    --url URL... --body BODY [--header 'Name: value']... [--profile seed|ietf|stripe]
//	              [--as-other 'Name: value']... [--rounds 3] [--between 'COMMAND'] [--json] [--html FILE] ...
//	idem proxy    --upstream URL [--addr 127.0.0.1:8081] [--store URL] [--scope-header H]
//	              [--require-key 'METHOD PATTERN'] [--on-lapse unknown|take_over] ...
//	idem version
//
// Store URLs are sqlite:PATH (or sqlite://PATH), postgres://…, postgresql://…,
// redis://… and rediss://… (one Redis), redis+cluster://… and rediss+cluster://…
// (a Redis Cluster), and redis+sentinel://… and rediss+sentinel://… (the master that
// Redis Sentinels watch); with a Redis store, payments needs --db for its SQL data.
// Every subcommand explains its flags with --help. Every flag can also be set by an
// environment variable, IDEM_<FLAG> (--lock-timeout: IDEM_LOCK_TIMEOUT); the flag wins.
// A bad flag, variable or URL is a one-line error on stderr and exit status 2; a
// failure at run time is exit status 1. idem check exits 1 when a check fails, and 2
// when the endpoint cannot be checked (no answer, or --body not answered 2xx).
// SPEC §N refers to the behaviour contract, docs/spec.md.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // something failed at run time
	exitUsage   = 2 // a bad subcommand, flag or URL
)

const usage = `usage: idem <command> [flags]

commands:
  payments   serve the reference payments API (SPEC §11)
  processor  serve a fake card processor for payments --processor-url (SPEC §13)
  migrate    create or upgrade an idempotency store's schema
  purge      delete expired idempotency records
  load       load and verify the payments API (exactly-once)
  keys       inspect, delete and resolve idempotency records (get, list, delete, resolve)
  check      check an endpoint's Idempotency-Key support from outside (SPEC §18)
  proxy      give an HTTP API in any language idempotency keys, as a reverse proxy (SPEC §17)
  version    print the command's version, commit and Go version

Run 'idem <command> --help' for the flags of a command. Every flag can also be set by
an environment variable, IDEM_ and the flag's name in upper case with _ for -
(IDEM_STORE, IDEM_LOCK_TIMEOUT); the flag wins.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the subcommand named by args[0] until it finishes or ctx ends, and returns
// the process's exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "payments":
		return runPayments(ctx, args[1:], stdout, stderr)
	case "processor":
		return runProcessor(ctx, args[1:], stdout, stderr)
	case "migrate":
		return runMigrate(ctx, args[1:], stdout, stderr)
	case "purge":
		return runPurge(ctx, args[1:], stdout, stderr)
	case "load":
		return runLoad(ctx, args[1:], stdout, stderr)
	case "keys":
		return runKeys(ctx, args[1:], stdout, stderr)
	case "check":
		return runCheck(ctx, args[1:], stdout, stderr)
	case "proxy":
		return runProxy(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		return runVersion(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "idem: unknown command %q\n%s", args[0], usage)
	return exitUsage
}
