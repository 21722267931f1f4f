package matrix

import (
	"fmt"
	"strings"
)

// Outcome is what a combination of options does, as the suite asserts it.
type Outcome int

const (
	// None: the combination does not exist (the store has no such helper).
	None Outcome = iota
	// ExactlyOnce: one effect; every answer is the first execution's response
	// (replays marked, byte for byte) or an in-flight 409; no error logged.
	ExactlyOnce
	// Refused: building it panics, naming the option and what to use instead.
	Refused
	// Loud: the first request and every duplicate get no 2xx and no replay, and an
	// error naming the route (or method) is logged.
	Loud
)

// Mark is how the document shows an outcome.
func (o Outcome) Mark() string {
	switch o {
	case ExactlyOnce:
		return "✓ exactly once"
	case Refused:
		return "✗ refused when built"
	case Loud:
		return "! fails loudly"
	}
	if m, ok := proxyMarks[o]; ok {
		return m
	}
	return "—"
}

func (o Outcome) String() string {
	switch o {
	case ExactlyOnce:
		return "exactly once"
	case Refused:
		return "refused at construction"
	case Loud:
		return "loud on the first request"
	}
	if m, ok := proxyNames[o]; ok {
		return m
	}
	return "none"
}

// Store is the store axis: where the records live and, for the HTTP cells, where the
// handler's writes go.
type Store string

// The stores.
const (
	SQLite        Store = "SQLite"
	Postgres      Store = "PostgreSQL (pgx)"
	PostgresSQL   Store = "PostgreSQL (database/sql)"
	RedisSQLite   Store = "Redis + backstop on SQLite"
	RedisPostgres Store = "Redis + backstop on PostgreSQL"
	Memory        Store = "memory"
)

// Stores are the stores of the HTTP cells, in the document's order.
var Stores = []Store{SQLite, Postgres, PostgresSQL, RedisSQLite, RedisPostgres, Memory}

// Route is the route-kind axis.
type Route string

// The route kinds.
const (
	Lease          Route = "lease"
	ClaimInHandler Route = "ClaimInHandler"
)

// Routes are the route kinds, in the document's order.
var Routes = []Route{Lease, ClaimInHandler}

// Helper is the helper axis: how the handler writes its effect and its response.
type Helper string

// The helpers: a store's two SPEC §7 helpers, and the two misuses.
const (
	// Respond: the store's Respond form, which takes the response the function returns.
	Respond Helper = "respond"
	// InTx: the store's lease form; the handler writes its response inside it.
	InTx Helper = "intx"
	// Direct: the handler writes with the database directly, then writes its response.
	Direct Helper = "direct"
	// Late: the lease form with the response written after it returned.
	Late Helper = "late"
)

// Helpers are the helpers, in the document's order.
var Helpers = []Helper{Respond, InTx, Direct, Late}

// Mount is the mounting axis: where the middleware goes.
type Mount string

// The mountings.
const (
	OneRoute Mount = "one net/http route"
	WholeMux Mount = "a whole ServeMux"
	Chi      Mount = "a chi router (r.Use)"
	Gin      Mount = "a gin engine"
)

// Mounts are the mountings, in the document's order.
var Mounts = []Mount{OneRoute, WholeMux, Chi, Gin}

// HelperAPI names the helper's API on a store ("" when the store has none).
func HelperAPI(s Store, h Helper) string {
	var respond, inTx string
	switch s {
	case SQLite, Postgres:
		respond, inTx = "store.Respond", "store.InTx"
	case PostgresSQL:
		respond, inTx = "store.RespondSQL", "store.InSQLTx"
	case RedisSQLite, RedisPostgres:
		respond, inTx = "backstop.Respond", "backstop.InTx"
	}
	switch h {
	case Respond:
		return respond
	case InTx:
		return inTx
	case Direct:
		return "the database directly, then the response"
	case Late:
		if inTx == "" {
			return ""
		}
		return inTx + ", the response after it"
	}
	return ""
}

// hasTransactions reports whether the store has a SPEC §7 Respond that claims in the
// handler's transaction (Capabilities.Transactions).
func hasTransactions(s Store) bool { return s == SQLite || s == Postgres || s == PostgresSQL }

// Expect is the outcome of an HTTP cell, with why. The mounting changes none.
func Expect(s Store, r Route, h Helper, _ Mount) (Outcome, string) {
	if HelperAPI(s, h) == "" {
		return None, "the store has no such helper"
	}
	if r == ClaimInHandler && !hasTransactions(s) {
		return Refused, "ClaimInHandler needs a store that claims in the handler's transaction"
	}
	switch h {
	case Late:
		return Loud, "500: the transaction is refused before it commits a response not written yet, idem.ErrNoResponse"
	case Direct:
		if r == ClaimInHandler {
			return Loud, "500: the writes do not commit with the key's record, and a retry would run them again"
		}
		return ExactlyOnce, "for duplicates; a crash between the write and the completion runs it again: use a helper"
	}
	return ExactlyOnce, ""
}

// Core is an axis of its own: an adapter of the core API on a store.
type Core struct {
	Adapter string
	Store   Store
	Outcome Outcome
}

// CoreStores are the stores of the core cells ("Redis" alone: no database of the
// application's).
var CoreStores = []Store{SQLite, Postgres, PostgresSQL, "Redis", Memory}

// The core adapters.
const (
	Do         = "idem.Do"
	DoTx       = "idem.DoTx (the store's InTx)"
	Consumer   = "consume.Processor (the store's InTx)"
	GRPCUnary  = "grpcidem unary"
	GRPCTx     = "grpcidem unary with grpcidem.InTx"
	GRPCStream = "grpcidem streaming, with a key"
)

// CoreAdapters are the core adapters, in the document's order.
var CoreAdapters = []string{Do, DoTx, Consumer, GRPCUnary, GRPCTx, GRPCStream}

// ExpectCore is the outcome of a core cell.
func ExpectCore(adapter string, s Store) Outcome {
	switch adapter {
	case Do, GRPCUnary:
		return ExactlyOnce
	case GRPCStream:
		return Loud
	}
	// DoTx, the consumer and grpcidem.InTx need the store's InTx.
	if hasTransactions(s) {
		return ExactlyOnce
	}
	return None
}

// Document is docs/combinations.md, generated from Expect, ExpectCore and the proxy's
// outcomes.
func Document() string {
	var b strings.Builder
	b.WriteString(`# Supported combinations

<!-- Generated by internal/matrix (go test -run TestCombinationsDocument -update in that
directory) from the table the configuration-matrix suite asserts; do not edit. -->

Every combination of store × route kind × helper × mounting keeps exactly-once, is
refused when it is built, or fails loudly on its first request (SPEC §16). The
configuration-matrix suite (` + "`internal/matrix`" + `, run by the README's test command) sends
each cell a sequential retry and 16 concurrent duplicates of one key and asserts the
outcome below:

- **✓ exactly once**: one effect; every answer is the first execution's response
  (replays marked ` + "`Idempotent-Replayed: true`" + `, byte for byte) or an in-flight 409; no
  error is logged.
- **✗ refused when built**: building the route panics, naming the option and what to
  use instead.
- **! fails loudly**: on the first request and every duplicate; no answer is a success
  (HTTP: a 5xx; gRPC: FAILED_PRECONDITION), none says it was replayed, and an error
  naming the route (or method) and the fix is logged.
- **—**: the combination does not exist.

The route kinds are the lease route (` + "`mw.Handler`, `mw.Route(idem.RouteOptions{})`" + `) and
` + "`RouteOptions{ClaimInHandler: true}`" + `. The mountings (one net/http route, a whole
ServeMux, a chi router with ` + "`r.Use`" + `, a gin engine wrapped whole) change no
outcome: every row holds for each of them. A ClaimInHandler route that holds is run in
both its regimes: as new keys find it, and after retries have made it read each key
before its handler (SPEC §7), where every request of the cell must be such a read.

`)
	b.WriteString("## HTTP\n\n| store | helper | lease route | ClaimInHandler |\n|---|---|---|---|\n")
	for _, s := range Stores {
		for _, h := range Helpers {
			api := HelperAPI(s, h)
			if api == "" {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s |", s, api)
			for _, r := range Routes {
				o, why := Expect(s, r, h, OneRoute)
				cell := o.Mark()
				if why != "" && o != ExactlyOnce || why != "" && h == Direct {
					cell += " (" + why + ")"
				}
				fmt.Fprintf(&b, " %s |", cell)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("\n## Functions, consumers and gRPC\n\n| adapter |")
	for _, s := range CoreStores {
		fmt.Fprintf(&b, " %s |", s)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(CoreStores)) + "\n")
	for _, a := range CoreAdapters {
		fmt.Fprintf(&b, "| %s |", a)
		for _, s := range CoreStores {
			fmt.Fprintf(&b, " %s |", ExpectCore(a, s).Mark())
		}
		b.WriteString("\n")
	}
	writeProxyDocument(&b)
	b.WriteString(`
A streaming gRPC call cannot run at most once per key (a stream has no one response to
store): ` + "`grpcidem.StreamServerInterceptor`" + ` refuses one that carries a key, or whose method
requires one, with ` + "`FAILED_PRECONDITION stream_not_supported`" + ` and an error log.
`)
	return b.String()
}
