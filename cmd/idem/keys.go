package main

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/payments"
	"github.com/idem-go/idem/internal/proxy"
	"github.com/idem-go/idem/seal"
)

const keysUsage = `usage: idem keys <command> --store URL [flags]

Inspects, deletes and resolves idempotency records, on any store (SPEC §15).

commands:
  get      one record: state, times, lease, response status and size (the body with --body)
  list     records by scope and state, a page at a time (SQL stores: Redis cannot list);
           --state unfinished lists the operations stopped after a step, which never
           expire; --state outcome_unknown the keys waiting for resolve
  delete   one key, or every key of a scope (--all): a customer's erasure request
  resolve  a key whose outcome is unknown, or whose operation is unfinished (SPEC §13):
           release it, or complete it with the response the operator found out
  seal     begin, end or show the sealing of the store's records (SPEC §20): idem keys seal
           begin|end|status --store URL --encryption-key KEY
  rewrap   retire keys: the MAC secret and every sealed record re-wrapped under the
           first --encryption-key alone, in place (SQL stores)

A record belongs to a scope: --scope SCOPE, as the application's Config.Scope returns it,
or --token TOKEN for the payments API, whose scope is the hex SHA-256 of the bearer token.
Every flag can also be set by its environment variable (IDEM_STORE, IDEM_SCOPE,
IDEM_TOKEN, …); the flag wins. Run 'idem keys <command> --help' for the flags.
`

// runKeys runs `idem keys <command>`.
func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, keysUsage)
		return exitUsage
	}
	switch args[0] {
	case "get":
		return runKeysGet(ctx, args[1:], stdout, stderr)
	case "list":
		return runKeysList(ctx, args[1:], stdout, stderr)
	case "delete":
		return runKeysDelete(ctx, args[1:], stdout, stderr)
	case "resolve":
		return runKeysResolve(ctx, args[1:], stdout, stderr)
	case "seal":
		return runKeysSeal(ctx, args[1:], stdout, stderr)
	case "rewrap":
		return runKeysRewrap(ctx, args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, keysUsage)
		return exitOK
	}
	fmt.Fprintf(stderr, "idem keys: unknown command %q (want get, list, delete, resolve, seal or rewrap)\n", args[0])
	return exitUsage
}

// keysCommand is what the keys subcommands share: the store, the scope (--scope or
// --token) and --json.
type keysCommand struct {
	fs                  *flag.FlagSet
	store, scope, token string
	json                bool
	step                string // get --step
	// keys open sealed records (get --body, resolve; SPEC §19).
	keys keyURLs
}

func newKeysCommand(name, synopsis string) *keysCommand {
	c := &keysCommand{fs: newFlagSet("keys "+name, synopsis)}
	c.fs.StringVar(&c.store, "store", "", "idempotency store `URL` (required): sqlite:PATH, postgres://…, redis://…, redis+cluster://…, redis+sentinel://…?master=NAME")
	c.fs.StringVar(&c.scope, "scope", "", "the records' `scope`: the principal, as the application's Config.Scope returns it")
	c.fs.StringVar(&c.token, "token", "", "instead of --scope, a payments API bearer `token`, whose scope is its hex SHA-256 (prefer IDEM_TOKEN: a command line is visible to every user of the host)")
	c.fs.BoolVar(&c.json, "json", false, "write JSON on stdout")
	c.keys.register(c.fs)
	return c
}

// target returns the store's URL and the scope; with required, a scope must be given.
// Errors name the flags.
func (c *keysCommand) target(required bool) (storeURL, string, error) {
	u, err := requiredStore(c.store)
	switch {
	case err != nil:
		return u, "", err
	case c.scope != "" && c.token != "":
		return u, "", errors.New("--scope and --token exclude each other")
	case c.scope == idemstore.ReservedScope:
		// The MAC secret and the store's state: deleting or settling them by hand
		// would lose every sealed record, or a finalized level (SPEC §19, §20).
		return u, "", errors.New("--scope names idem's own reserved scope (the MAC secret, the store's state), which idem keys never reads or changes: idem migrate shows the store's state")
	case c.token != "":
		return u, payments.ScopeOfToken(c.token), nil
	case c.scope == "" && required:
		return u, "", errors.New("--scope or --token is required")
	}
	return u, c.scope, nil
}

// withStore reports err, a mistake in the flags, as a usage error; otherwise it opens
// the store at u, runs fn with its admin interface, and closes it.
//
// scope is the scope of --scope or --token: with --token and --encryption-key, the
// payments API's scope keyed as `idem payments --encryption-key` keys it (SPEC §19),
// which the store's MAC secret gives; fn gets it.
func (c *keysCommand) withStore(ctx context.Context, stderr io.Writer, u storeURL, scope string, err error, fn func(as admin.Store, scope string) int) int {
	if err != nil {
		return usageError(stderr, c.fs, err.Error())
	}
	st, as, err := c.open(ctx, u)
	if err != nil {
		return failure(stderr, c.fs.Name(), err)
	}
	defer st.close()
	if c.token != "" && len(c.keys.urls) > 0 {
		keys, closeKeys, err := c.keys.open(ctx)
		if err != nil {
			return failure(stderr, c.fs.Name(), err)
		}
		defer closeKeys()
		ring, err := idem.OpenKeyring(ctx, st.store, keys...)
		if err != nil {
			return failure(stderr, c.fs.Name(), fmt.Errorf("--encryption-key: %w", err))
		}
		// The payments API keys its records' scope while the store's records are
		// sealed (SPEC §20): before sealing began, and once it ended, they are under
		// the plain scope.
		state, err := idem.ReadStoreState(ctx, st.store)
		if err != nil {
			return failure(stderr, c.fs.Name(), err)
		}
		if s := state.Sealing; s.Phase == idem.SealingBegun || s.Phase == idem.SealingEnded && time.Now().Before(s.ClearFrom()) {
			scope = ring.Scope(scope)
		}
	}
	return fn(as, scope)
}

// open opens the store at u and returns its admin interface.
func (c *keysCommand) open(ctx context.Context, u storeURL) (*openedStore, admin.Store, error) {
	st, err := openStore(ctx, u, newLogger(io.Discard, 0), nil, true)
	if err != nil {
		return nil, nil, err
	}
	if _, err := st.check(ctx, u.connTimeout()); err != nil {
		st.close()
		return nil, nil, err
	}
	as, ok := st.store.(admin.Store)
	if !ok {
		st.close()
		return nil, nil, fmt.Errorf("the store at %s offers no admin interface", u)
	}
	return st, as, nil
}

// parseKey reads --key as the middleware reads the header: bare, or an RFC 8941 string.
func parseKey(raw string) (string, error) {
	if raw == "" {
		return "", errors.New("--key is required")
	}
	key, err := idem.ParseKey([]string{raw}, 1)
	if err != nil {
		return "", fmt.Errorf("--key %q: %v", raw, err)
	}
	return key, nil
}

const keysGetSynopsis = `--store URL (--scope SCOPE | --token TOKEN) --key KEY [--step STEP] [--body] [--json]
       idem keys get --store URL --upstream-key KEY [--scope SCOPE] [--body] [--json]

Shows one record: its state, record id, creation and expiry, the lease of an in-flight
record, the stored response's status and size, the fingerprint, the recovery point, and
the key that idem proxy derives from the record for the upstream (SPEC §13, §17), so
that a record can be matched with the upstream's logs; with --step, also the derived
key of the outside call the operation makes at that step (the key a card processor
saw for the step "processor_charge" of idem payments). An expired
record shows until it is deleted. The response's headers and body show only with
--body. The lock token never shows.

--upstream-key finds the record whose derived key that is, from an upstream's log line:
it reads the records (of --scope, or of every scope) a page at a time (SQL stores only:
Redis cannot list its keys).`

func runKeysGet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newKeysCommand("get", keysGetSynopsis)
	rawKey := c.fs.String("key", "", "the idempotency `key`, as the client sent it in Idempotency-Key (required, unless --upstream-key)")
	upstreamKey := c.fs.String("upstream-key", "", "find the record by the `key` idem proxy derived from it for the upstream, instead of --key")
	body := c.fs.Bool("body", false, "also show the stored response's headers and body (of a sealed record: only with --encryption-key)")
	c.fs.StringVar(&c.step, "step", "", "also show the derived key of the outside call made at `step` (SPEC §13), e.g. processor_charge")
	if code, done := parse(c.fs, args, stdout, stderr); done {
		return code
	}
	if *upstreamKey != "" {
		u, scope, err := c.target(false)
		if err == nil && *rawKey != "" {
			err = errors.New("--key and --upstream-key exclude each other")
		}
		return c.withStore(ctx, stderr, u, scope, err, func(as admin.Store, scope string) int {
			found, err := findByUpstreamKey(ctx, as, scope, *upstreamKey)
			if err != nil {
				return failure(stderr, c.fs.Name(), err)
			}
			return c.get(ctx, as, found.Scope, found.Key, *body, stdout, stderr)
		})
	}
	u, scope, err := c.target(true)
	key := ""
	if err == nil {
		key, err = parseKey(*rawKey)
	}
	return c.withStore(ctx, stderr, u, scope, err, func(as admin.Store, scope string) int {
		return c.get(ctx, as, scope, key, *body, stdout, stderr)
	})
}

// findByUpstreamKey pages through the records of scope (every scope when "") for the
// one whose derived upstream key is key.
func findByUpstreamKey(ctx context.Context, as admin.Store, scope, key string) (*admin.Record, error) {
	p := admin.RecordListParams{Scope: scope, Limit: admin.MaxListLimit}
	for {
		res, err := as.RecordList(ctx, &p)
		if err != nil {
			return nil, err
		}
		for _, r := range res.Records {
			if upstreamKeyOf(r) == key {
				return r, nil
			}
		}
		if !res.More || len(res.Records) == 0 {
			return nil, fmt.Errorf("no record whose upstream key is %q", key)
		}
		last := res.Records[len(res.Records)-1]
		p.AfterScope, p.AfterKey = last.Scope, last.Key
	}
}

// upstreamKeyOf is the key idem proxy derives from a record for the upstream.
func upstreamKeyOf(r *admin.Record) string { return r.DerivedKey(proxy.UpstreamKeyStep) }

func (c *keysCommand) get(ctx context.Context, as admin.Store, scope, key string, body bool, stdout, stderr io.Writer) int {
	// The body is read either way: whether it is sealed shows without --body.
	res, err := as.RecordInspect(ctx, &admin.RecordInspectParams{Scope: scope, Key: key, Body: true})
	if errors.Is(err, idemstore.ErrNotFound) {
		return failure(stderr, c.fs.Name(), fmt.Errorf("no record of key %q in scope %s", key, showScope(scope)))
	}
	if err != nil {
		return failure(stderr, c.fs.Name(), err)
	}
	sealed := admin.IsSealed(storeRecord(res.Record))
	keyID := sealedKeyID(res.Record)
	if !body {
		res.Record.Header, res.Record.Body = nil, nil
	}
	if body && sealed {
		ring, closeKeys, err := c.keys.opener(ctx)
		if err != nil {
			return failure(stderr, c.fs.Name(), err)
		}
		defer closeKeys()
		if err := openShown(ctx, ring, res.Record); err != nil {
			return failure(stderr, c.fs.Name(), err)
		}
		sealed = false
	}
	if c.json {
		j := recordJSON(res.Record, res.Now, body)
		if sealed {
			j.SealedUnder = keyID
		}
		if c.step != "" {
			j.DerivedKey = &stepKeyJSON{Step: c.step, Key: res.Record.DerivedKey(c.step)}
		}
		return writeJSON(stdout, stderr, c.fs.Name(), j)
	}
	writeRecord(stdout, res.Record, res.Now, body)
	if c.step != "" {
		fmt.Fprintf(stdout, "derived key   %s (of the outside call at step %q)\n", res.Record.DerivedKey(c.step), c.step)
	}
	if sealed {
		fmt.Fprintf(stdout, "sealed under key %s: its headers, body and steps show with --body --encryption-key\n", keyID)
	}
	return exitOK
}

// sealedKeyID is the id of the key a sealed record says it is sealed under.
func sealedKeyID(r *admin.Record) string {
	if id := seal.KeyIDOf(r.Body); id != "" {
		return id
	}
	return seal.KeyIDOf(r.Steps)
}

const keysListSynopsis = `--store URL [--scope SCOPE | --token TOKEN]
                 [--state in_flight|completed|unfinished|outcome_unknown] [--limit 100] [--after CURSOR] [--json]

Lists records in (scope, key) order, a page at a time: of one scope, or of every scope
without --scope and --token; of one state with --state. --state unfinished lists the
unfinished operations (SPEC §13): in flight after one of their steps committed (a
payments charge recorded pending before the card processor answered), with their
operation, recovery point, age and lease. They never expire: the completer, or the
client's retry, finishes them, or an operator settles them with 'idem keys resolve'.
--state outcome_unknown lists the completed records whose outcome is unknown (a reply
lost after the request was sent, or a holder that died, under the policy unknown, SPEC
§13, §17): the keys that wait for 'idem keys resolve'. Expired records that are not deleted yet are listed too, marked expired. When
more follow, the last line gives the --after cursor of the next page. Response bodies
never show.

SQLite and PostgreSQL can list; Redis cannot (a record's Redis key is a digest of its
scope and key): use get with a known key, or delete --all for a scope.`

func runKeysList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newKeysCommand("list", keysListSynopsis)
	state := c.fs.String("state", "", "list only records in this `state`: in_flight, completed, unfinished (in flight after a step committed: they never expire), or outcome_unknown (completed records whose outcome is unknown)")
	limit := c.fs.Int("limit", admin.DefaultListLimit, "records per page, 1 to 1000")
	after := c.fs.String("after", "", "start after this `cursor`, printed at the end of the previous page")
	if code, done := parse(c.fs, args, stdout, stderr); done {
		return code
	}
	u, scope, err := c.target(false)
	p := admin.RecordListParams{Scope: scope, State: idemstore.State(*state), Limit: *limit}
	switch {
	case err != nil:
	case *state != "" && p.State != idemstore.StateInFlight && p.State != idemstore.StateCompleted && p.State != admin.StateOutcomeUnknown &&
		p.State != admin.StateUnfinished:
		err = fmt.Errorf("--state %q: want in_flight, completed, unfinished or outcome_unknown", *state)
	case *limit < 1 || *limit > admin.MaxListLimit:
		err = fmt.Errorf("--limit must be between 1 and %d, got %d", admin.MaxListLimit, *limit)
	case *after != "":
		if p.AfterScope, p.AfterKey, err = decodeCursor(*after); err != nil {
			err = fmt.Errorf("--after: %v", err)
		}
	}
	return c.withStore(ctx, stderr, u, scope, err, func(as admin.Store, scope string) int {
		p.Scope = scope
		return c.list(ctx, as, &p, stdout, stderr)
	})
}

func (c *keysCommand) list(ctx context.Context, as admin.Store, p *admin.RecordListParams, stdout, stderr io.Writer) int {
	if !as.AdminCapabilities().List {
		_, err := as.RecordList(ctx, p) // says why
		return usageError(stderr, c.fs, err.Error())
	}
	res, err := as.RecordList(ctx, p)
	if err != nil {
		return failure(stderr, c.fs.Name(), err)
	}
	next := ""
	if res.More {
		last := res.Records[len(res.Records)-1]
		next = encodeCursor(last.Scope, last.Key)
	}
	if c.json {
		page := listJSON{Records: []keyRecordJSON{}, Now: res.Now}
		for _, r := range res.Records {
			page.Records = append(page.Records, recordJSON(r, res.Now, false))
		}
		if next != "" {
			page.Next = &next
		}
		return writeJSON(stdout, stderr, c.fs.Name(), page)
	}
	if p.State == admin.StateUnfinished {
		writeUnfinished(stdout, res, next)
	} else {
		writeList(stdout, res, next)
	}
	return exitOK
}

const keysDeleteSynopsis = `--store URL (--scope SCOPE | --token TOKEN) (--key KEY | --all) [--force] [--abandon] [--json]

Deletes one key's record, or with --all every record of the scope (a customer's erasure
request), in batches; other scopes are untouched. The next request with a deleted key
executes afresh.

A record in flight under a live lease is kept unless --force: its request is executing,
and a retry sent after the delete would execute beside it. Forced, the holder cannot
store its response (and its SPEC §7 transaction rolls back), but what it did outside
the store stays done.

An unfinished operation (in flight after one of its steps committed, SPEC §13: a
payments charge recorded pending before the card processor answered) is kept unless
--abandon: deleting it abandons it. Its committed steps stay done (the pending charge
stays pending), a foreign call it made stays made, nothing will finish it, and the key's
next request starts a new operation (its foreign calls carry the same derived keys when
its parameters are the same, so a processor that remembers them answers from the first
call). The command prints what it
abandons. Prefer letting the completer finish it, or 'idem keys resolve'.

Kept records make the command exit 1 after deleting the rest; run it again after their
lease (--lock-timeout of the server) ends, or with the flag it names.`

func runKeysDelete(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newKeysCommand("delete", keysDeleteSynopsis)
	rawKey := c.fs.String("key", "", "the idempotency `key` to delete, as the client sent it")
	all := c.fs.Bool("all", false, "delete every record of the scope instead of one key")
	force := c.fs.Bool("force", false, "delete records in flight under a live lease too")
	abandon := c.fs.Bool("abandon", false, "delete unfinished operations too (in flight after a step committed), abandoning them: printed")
	if code, done := parse(c.fs, args, stdout, stderr); done {
		return code
	}
	u, scope, err := c.target(true)
	key := ""
	switch {
	case err != nil:
	case *all && *rawKey != "":
		err = errors.New("--key and --all exclude each other")
	case !*all && *rawKey == "":
		err = errors.New("--key or --all is required")
	case !*all:
		key, err = parseKey(*rawKey)
	}
	return c.withStore(ctx, stderr, u, scope, err, func(as admin.Store, scope string) int {
		return c.delete(ctx, as, scope, key, *all, deleteFlags{force: *force, abandon: *abandon}, stdout, stderr)
	})
}

// deleteFlags are delete's --force and --abandon.
type deleteFlags struct{ force, abandon bool }

func (c *keysCommand) delete(ctx context.Context, as admin.Store, scope, key string, all bool, f deleteFlags, stdout, stderr io.Writer) int {
	var (
		res       admin.RecordDeleteScopeResult
		abandoned []*admin.Record
		now       time.Time
		err       error
	)
	if f.abandon {
		// What it abandons, read first, so that it can say so.
		if abandoned, now, err = c.unfinishedOf(ctx, as, scope, key, all); err != nil {
			return failure(stderr, c.fs.Name(), err)
		}
	}
	if all {
		r, err := as.RecordDeleteScope(ctx, &admin.RecordDeleteScopeParams{Scope: scope, Force: f.force, Abandon: f.abandon})
		if err != nil {
			deleted := 0
			if r != nil {
				deleted = r.Deleted
			}
			return failure(stderr, c.fs.Name(), fmt.Errorf("after deleting %d records of scope %s: %w", deleted, showScope(scope), err))
		}
		res = *r
	} else {
		err := as.RecordDelete(ctx, &admin.RecordDeleteParams{Scope: scope, Key: key, Force: f.force, Abandon: f.abandon})
		switch {
		case errors.Is(err, idemstore.ErrNotFound):
			return failure(stderr, c.fs.Name(), fmt.Errorf("no record of key %q in scope %s", key, showScope(scope)))
		case errors.Is(err, admin.ErrLeaseLive):
			res.Kept = 1
		case errors.Is(err, admin.ErrUnfinished):
			return failure(stderr, c.fs.Name(), c.refusedUnfinished(ctx, as, scope, key))
		case err != nil:
			return failure(stderr, c.fs.Name(), err)
		default:
			res.Deleted = 1
		}
	}
	if res.Deleted == 0 {
		abandoned = nil
	}
	if !f.force { // those under a live lease were kept
		abandoned = slices.DeleteFunc(abandoned, func(r *admin.Record) bool { return r.LeaseLive(now) })
	}
	if c.json {
		out := deleteJSON{Deleted: res.Deleted, Kept: res.Kept, Unfinished: res.Unfinished}
		for _, r := range abandoned {
			out.Abandoned = append(out.Abandoned, recordJSON(r, now, false))
		}
		if code := writeJSON(stdout, stderr, c.fs.Name(), out); code != exitOK {
			return code
		}
	} else if all || res.Deleted == 1 {
		what := fmt.Sprintf("%d records", res.Deleted)
		if !all {
			what = fmt.Sprintf("key %q", key)
		}
		fmt.Fprintf(stdout, "deleted %s of scope %s\n", what, showScope(scope))
		for _, r := range abandoned {
			fmt.Fprintf(stdout, "abandoned key %q: %s; its committed steps stay done and nothing will finish it: "+
				"the key's next request starts a new operation\n", r.Key, describeUnfinished(r, now))
		}
	}
	var kept []string
	if res.Kept > 0 {
		kept = append(kept, fmt.Sprintf("%d record(s) in flight under a live lease (the request is executing; run again once its lease ends, or add --force)", res.Kept))
	}
	if res.Unfinished > 0 {
		kept = append(kept, fmt.Sprintf("%d unfinished operation(s) ('idem keys list --state unfinished' shows them; let the completer finish them, settle them with 'idem keys resolve', or add --abandon)", res.Unfinished))
	}
	if len(kept) > 0 {
		return failure(stderr, c.fs.Name(), errors.New("kept "+strings.Join(kept, " and ")))
	}
	return exitOK
}

// unfinishedOf reads the unfinished operations that a delete of key (or, with all,
// of the whole scope) would abandon, and the store's time.
func (c *keysCommand) unfinishedOf(ctx context.Context, as admin.Store, scope, key string, all bool) ([]*admin.Record, time.Time, error) {
	if !all {
		res, err := as.RecordInspect(ctx, &admin.RecordInspectParams{Scope: scope, Key: key})
		switch {
		case errors.Is(err, idemstore.ErrNotFound):
			return nil, time.Time{}, nil // the delete says so
		case err != nil:
			return nil, time.Time{}, err
		case !res.Record.Unfinished():
			return nil, res.Now, nil
		}
		return []*admin.Record{res.Record}, res.Now, nil
	}
	if !as.AdminCapabilities().List {
		return nil, time.Time{}, nil // a store that cannot list keeps no recovery points (Redis)
	}
	var out []*admin.Record
	p := &admin.RecordListParams{Scope: scope, State: admin.StateUnfinished, Limit: admin.MaxListLimit}
	for {
		res, err := as.RecordList(ctx, p)
		if err != nil {
			return nil, time.Time{}, err
		}
		out = append(out, res.Records...)
		if !res.More {
			return out, res.Now, nil
		}
		last := res.Records[len(res.Records)-1]
		p.AfterScope, p.AfterKey = last.Scope, last.Key
	}
}

// refusedUnfinished is the error of a delete refused because the record is an
// unfinished operation: what it is, and what to do.
func (c *keysCommand) refusedUnfinished(ctx context.Context, as admin.Store, scope, key string) error {
	what := "an unfinished operation"
	if res, err := as.RecordInspect(ctx, &admin.RecordInspectParams{Scope: scope, Key: key}); err == nil {
		what = describeUnfinished(res.Record, res.Now)
	}
	return fmt.Errorf("kept key %q of scope %s, an unfinished operation: %s; deleting it abandons it: let the completer or the client's retry finish it, "+
		"settle it with 'idem keys resolve', or add --abandon", key, showScope(scope), what)
}

// describeUnfinished says what an unfinished operation's record holds: its operation,
// last committed step, record id and age.
func describeUnfinished(r *admin.Record, now time.Time) string {
	op := "an unnamed operation"
	if r.Operation != "" {
		op = fmt.Sprintf("operation %q", r.Operation)
	}
	return fmt.Sprintf("%s stopped after step %q (record id %s, created %s ago)", op, r.RecoveryPoint, r.ID, age(r, now))
}

// age is how long ago the record was created, rounded.
func age(r *admin.Record, now time.Time) time.Duration {
	d := max(now.Sub(r.CreatedAt), 0)
	if d >= time.Hour {
		return d.Round(time.Minute)
	}
	return d.Round(time.Second)
}

// showScope prints a scope as is when it is printable text, quoted otherwise.
func showScope(scope string) string {
	if scope != "" && strconv.CanBackquote(scope) && !strings.ContainsAny(scope, " `") {
		return scope
	}
	return strconv.Quote(scope)
}

// encodeCursor and decodeCursor turn the last record of a page into the --after of
// the next: base64url of the scope's length (uvarint), the scope and the key.
func encodeCursor(scope, key string) string {
	b := binary.AppendUvarint(nil, uint64(len(scope)))
	return base64.RawURLEncoding.EncodeToString(append(append(b, scope...), key...))
}

func decodeCursor(c string) (scope, key string, err error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return "", "", errors.New("not a cursor printed by idem keys list")
	}
	n, w := binary.Uvarint(b)
	if w <= 0 || n > uint64(len(b)-w) || len(b)-w-int(n) == 0 {
		return "", "", errors.New("not a cursor printed by idem keys list")
	}
	b = b[w:]
	return string(b[:n]), string(b[n:]), nil
}

// keyRecordJSON is a record in the JSON of get and list.
type keyRecordJSON struct {
	Scope             string          `json:"scope"`
	Key               string          `json:"key"`
	RecordID          string          `json:"record_id"`
	State             idemstore.State `json:"state"`
	Expired           bool            `json:"expired"`
	CreatedAt         time.Time       `json:"created_at"`
	ExpiresAt         time.Time       `json:"expires_at"`
	LeaseEnd          *time.Time      `json:"lease_end"`
	LeaseLive         bool            `json:"lease_live"`
	Status            *int            `json:"status"`
	ResponseNotStored bool            `json:"response_not_stored"`
	ResponseBytes     int             `json:"response_bytes"`
	Fingerprint       string          `json:"fingerprint"`
	RecoveryPoint     string          `json:"recovery_point"`
	// UpstreamKey is the key idem proxy derives from the record for the upstream.
	UpstreamKey string `json:"upstream_key"`
	// DerivedKey is the derived key of the step get --step names.
	DerivedKey *stepKeyJSON `json:"derived_key,omitempty"`
	// Unfinished is true for an unfinished operation (SPEC §13), which never expires.
	Unfinished     bool   `json:"unfinished"`
	OutcomeUnknown bool   `json:"outcome_unknown"`
	Operation      string `json:"operation,omitempty"`
	// Steps are the results the record's committed steps saved (get only).
	Steps   json.RawMessage `json:"steps,omitempty"`
	Headers http.Header     `json:"headers,omitempty"`
	// Body is the body when it is UTF-8 text, BodyBase64 otherwise (--body only).
	Body       *string `json:"body,omitempty"`
	BodyBase64 []byte  `json:"body_base64,omitempty"`
	// SealedUnder is the key a sealed record's content is sealed under (SPEC §19),
	// when it was not opened (get without --body).
	SealedUnder string `json:"sealed_under,omitempty"`
}

// stepKeyJSON is the derived key of one step (SPEC §13).
type stepKeyJSON struct {
	Step string `json:"step"`
	Key  string `json:"key"`
}

type listJSON struct {
	Records []keyRecordJSON `json:"records"`
	// Next is the --after cursor of the next page; null on the last page.
	Next *string   `json:"next"`
	Now  time.Time `json:"now"`
}

type deleteJSON struct {
	Deleted int `json:"deleted"`
	Kept    int `json:"kept"`
	// Unfinished is the number of unfinished operations kept (without --abandon).
	Unfinished int `json:"unfinished"`
	// Abandoned are the unfinished operations deleted with --abandon.
	Abandoned []keyRecordJSON `json:"abandoned,omitempty"`
}

func recordJSON(r *admin.Record, now time.Time, body bool) keyRecordJSON {
	j := keyRecordJSON{
		Scope: r.Scope, Key: r.Key, RecordID: r.ID, State: r.State, Expired: r.Expired(now),
		CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt, LeaseLive: r.LeaseLive(now),
		ResponseNotStored: r.NotStored, ResponseBytes: r.BodySize,
		Fingerprint: fingerprint(r.Fingerprint), RecoveryPoint: r.RecoveryPoint, Unfinished: r.Unfinished(),
		OutcomeUnknown: r.OutcomeUnknown, Operation: r.Operation, UpstreamKey: upstreamKeyOf(r),
	}
	if r.OutcomeUnknown {
		j.State = admin.StateOutcomeUnknown // as the text says, and --state names it
	}
	if json.Valid(r.Steps) {
		j.Steps = r.Steps
	}
	if !r.LeaseEnd.IsZero() {
		j.LeaseEnd = &r.LeaseEnd
	}
	if r.State == idemstore.StateCompleted {
		j.Status = &r.Status
	}
	if body && r.State == idemstore.StateCompleted {
		j.Headers = r.Header
		if utf8.Valid(r.Body) {
			s := string(r.Body)
			j.Body = &s
		} else {
			j.BodyBase64 = r.Body
		}
	}
	return j
}

func fingerprint(fp idem.Fingerprint) string { return fmt.Sprintf("v%d:%x", fp.Version, fp.Sum) }

func writeJSON(stdout, stderr io.Writer, command string, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return failure(stderr, command, err)
	}
	return exitOK
}

// writeRecord writes get's text: one "name  value" line per field, then with body the
// stored headers and body as they would be replayed.
func writeRecord(w io.Writer, r *admin.Record, now time.Time, body bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "scope\t%s\n", showScope(r.Scope))
	fmt.Fprintf(tw, "key\t%s\n", r.Key)
	fmt.Fprintf(tw, "state\t%s\n", describeState(r, now))
	fmt.Fprintf(tw, "record id\t%s\n", r.ID)
	fmt.Fprintf(tw, "upstream key\t%s (what idem proxy sends the upstream)\n", upstreamKeyOf(r))
	fmt.Fprintf(tw, "created\t%s\n", showTime(r.CreatedAt, now))
	if r.Unfinished() {
		fmt.Fprintf(tw, "expires\tnot while unfinished (created + TTL: %s); a TTL after its completion\n", showTime(r.ExpiresAt, now))
	} else {
		fmt.Fprintf(tw, "expires\t%s\n", showTime(r.ExpiresAt, now))
	}
	if !r.LeaseEnd.IsZero() {
		fmt.Fprintf(tw, "lease end\t%s\n", showTime(r.LeaseEnd, now))
	}
	switch {
	case r.State != idemstore.StateCompleted:
		fmt.Fprintf(tw, "response\tnone yet\n")
	case r.NotStored:
		fmt.Fprintf(tw, "response\tnot stored (the handler flushed, or the body was over the storage limit): duplicates get 409 response_not_stored\n")
	case r.OutcomeUnknown:
		fmt.Fprintf(tw, "response\toutcome unknown: the operation may or may not have happened: the request was sent and its reply lost (a reset, a timeout, a gateway's 502 or 504: idem proxy's warning with this key's hash says which), or its holder died (the policy unknown); requests get 500 outcome_unknown until 'idem keys resolve'\n")
	default:
		fmt.Fprintf(tw, "response\t%d, %d bytes\n", r.Status, r.BodySize)
	}
	fmt.Fprintf(tw, "fingerprint\t%s\n", fingerprint(r.Fingerprint))
	if r.Operation != "" {
		fmt.Fprintf(tw, "operation\t%s\n", r.Operation)
	}
	if r.RecoveryPoint != "" {
		fmt.Fprintf(tw, "recovery point\t%s\n", r.RecoveryPoint)
	}
	switch {
	case seal.Sealed(r.Steps):
		fmt.Fprintf(tw, "steps\tsealed\n")
	case len(r.Steps) > 0:
		fmt.Fprintf(tw, "steps\t%s\n", r.Steps)
	}
	tw.Flush()
	if !body || r.State != idemstore.StateCompleted || r.NotStored || r.OutcomeUnknown {
		return
	}
	fmt.Fprintln(w)
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range r.Header {
			if !yield(k) {
				return
			}
		}
	})
	for _, k := range names {
		for _, v := range r.Header[k] {
			fmt.Fprintf(w, "%s: %s\n", k, v)
		}
	}
	fmt.Fprintln(w)
	w.Write(r.Body)
	if len(r.Body) > 0 && r.Body[len(r.Body)-1] != '\n' {
		fmt.Fprintln(w)
	}
}

// describeState says what a request with the record's key would meet now.
func describeState(r *admin.Record, now time.Time) string {
	switch {
	case r.Unfinished() && r.LeaseLive(now):
		return string(r.State) + " (unfinished, lease live: its operation is running or being resumed; it never expires until it completes)"
	case r.Unfinished():
		return string(r.State) + fmt.Sprintf(" (unfinished: its operation stopped after step %q and waits for the completer or the next request "+
			"with this key to resume it; it never expires until it completes or 'idem keys resolve' settles it)", r.RecoveryPoint)
	case r.Expired(now):
		return string(r.State) + " (expired: the next request with this key executes afresh)"
	case r.OutcomeUnknown:
		return "outcome_unknown (completed: requests get 500 outcome_unknown until 'idem keys resolve')"
	case r.LeaseLive(now):
		return string(r.State) + " (lease live: its request is executing; duplicates get 409 request_in_progress)"
	case r.State == idemstore.StateInFlight:
		return string(r.State) + " (lease lapsed: the next request with this key takes it over)"
	}
	return string(r.State)
}

// showTime is t in RFC 3339 and how far it is from now.
func showTime(t, now time.Time) string {
	d := t.Sub(now)
	unit := time.Second
	if d >= time.Hour || d <= -time.Hour {
		unit = time.Minute
	}
	switch {
	case d >= 0:
		return fmt.Sprintf("%s (in %v)", t.UTC().Format(time.RFC3339Nano), d.Round(unit))
	default:
		return fmt.Sprintf("%s (%v ago)", t.UTC().Format(time.RFC3339Nano), (-d).Round(unit))
	}
}

// writeUnfinished writes list's text for --state unfinished: a table of the
// operations, with their recovery point, age and lease, then the next page's cursor.
func writeUnfinished(w io.Writer, res *admin.RecordListResult, next string) {
	writeTable(w, res, next, "no unfinished operations", "SCOPE\tKEY\tOPERATION\tRECOVERY POINT\tAGE\tLEASE\tRECORD ID",
		func(r *admin.Record) string {
			lease := "lapsed (waits for the completer or a retry)"
			if r.LeaseLive(res.Now) {
				lease = fmt.Sprintf("live, %v left", r.LeaseEnd.Sub(res.Now).Round(time.Second))
			}
			op := r.Operation
			if op == "" {
				op = "-"
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%v\t%s\t%s", showScope(r.Scope), r.Key, op, r.RecoveryPoint, age(r, res.Now), lease, r.ID)
		})
}

// writeList writes list's text: a table, then the next page's cursor when more follow.
func writeList(w io.Writer, res *admin.RecordListResult, next string) {
	writeTable(w, res, next, "no records", "SCOPE\tKEY\tSTATE\tSTATUS\tBYTES\tCREATED\tEXPIRES", func(r *admin.Record) string {
		state := string(r.State)
		if r.OutcomeUnknown {
			state = string(admin.StateOutcomeUnknown)
		}
		switch {
		case r.Unfinished() && !r.LeaseLive(res.Now):
			state += " (unfinished, lapsed)"
		case r.Unfinished():
			state += " (unfinished)"
		case r.Expired(res.Now):
			state += " (expired)"
		case r.State == idemstore.StateInFlight && !r.LeaseLive(res.Now):
			state += " (lapsed)"
		}
		status := "-"
		switch {
		case r.NotStored:
			status = "not stored"
		case r.OutcomeUnknown:
			status = "500 (unknown)"
		case r.State == idemstore.StateCompleted:
			status = strconv.Itoa(r.Status)
		}
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s\t%s", showScope(r.Scope), r.Key, state, status, r.BodySize,
			r.CreatedAt.UTC().Format(time.RFC3339), r.ExpiresAt.UTC().Format(time.RFC3339))
	})
}

// writeTable writes a page of records as a table of header and one row per record
// (none when there are none), then the next page's cursor when more follow.
func writeTable(w io.Writer, res *admin.RecordListResult, next, none, header string, row func(*admin.Record) string) {
	if len(res.Records) == 0 {
		fmt.Fprintln(w, none)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range res.Records {
		fmt.Fprintln(tw, row(r))
	}
	tw.Flush()
	if next != "" {
		fmt.Fprintf(w, "more: --after %s\n", next)
	}
}
