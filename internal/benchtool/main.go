// Command benchtool measures what idempotency costs a minimal handler (one INSERT, 201)
// and how the stores behave at scale; scripts/bench runs it and draws its results.
// It is a tool of the repository, not a product:
//
//	benchtool serve   --db URL [--addr 127.0.0.1:0]         # the minimal handler, every path
//	benchtool prepare --url URL --path /respond --keys N     # N keys, each sent once
//	benchtool load    --url URL --path P [--keys N] [--get]  # one measured run (JSON)
//	benchtool minimal --postgres URL [--records 10000000]    # every pair, interleaved (JSON)
//	benchtool ab --previous BIN --current BIN                # two builds of internal/abserve, A/B
//	benchtool fill    --db URL --records N                   # filler records, server-side
//	benchtool scale   --db URL --steps 10000,100000,…        # claim/lookup latency by table size
//	benchtool cleanup --db URL --records N                   # requests while the cleaner deletes
//	benchtool chart   --minimal M --scale S --out chart.svg  # the chart of a scripts/bench run
//	benchtool report  --minimal M --scale S --cleanup C      # its Markdown
//	benchtool wal     [--paths /plain,/respond,…]            # what each WAL record of a request is
//	benchtool holdbodies --url URL --pid PID [--conns 1000]  # RSS of a server holding keyed bodies
//	benchtool mysql   --server DSN [--cleanup 1000000]       # the minimal handler and cleanup on MySQL (Markdown)
//
// Each subcommand has -h.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmds := map[string]func(context.Context, []string) error{
		"serve":      runServe,
		"prepare":    runPrepare,
		"minimal":    runMinimal,
		"ab":         runAB,
		"load":       runLoad,
		"fill":       runFill,
		"scale":      runScale,
		"cleanup":    runCleanup,
		"chart":      runChart,
		"report":     runReport,
		"wal":        runWAL,
		"holdbodies": runHoldBodies,
		"mysql":      runMySQL,
	}
	run, ok := cmds[os.Args[1]]
	if !ok {
		usage()
		os.Exit(2)
	}
	if err := run(ctx, os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "benchtool %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchtool serve|prepare|load|minimal|ab|fill|scale|cleanup|chart|report|wal|holdbodies|mysql [flags] (-h for each)")
}
