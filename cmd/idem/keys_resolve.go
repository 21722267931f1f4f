package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/admin"
	"github.com/idem-go/idem/idemstore"
)

const keysResolveSynopsis = `--store URL (--scope SCOPE | --token TOKEN) --key KEY
                    (--release | --status CODE [--body TEXT | --body-file PATH] [--header 'Name: value']...) [--json]

Settles a key whose outcome is unknown, or whose operation is unfinished (SPEC §13).
Outcome unknown: its request ran on a route with the policy unknown (its effects
outside the store cannot be deduplicated), its holder died, and since then every
request with the key gets 500 outcome_unknown. Unfinished: its operation stopped after
one of its steps committed (a payments charge recorded pending before the card
processor answered) and nothing has finished it yet; it never expires, and the
completer keeps trying. Settle one only when nothing can finish it (the foreign system
is gone, the operation's code removed). Find out what the request did (at the card
processor, say), then:

  --release    when it did nothing: the record is deleted, and the client's next
               request with the key executes afresh;
  --status     when it did something: every request with the key gets this response
               from now on (as a replay), until the record expires (an unfinished
               one: a TTL from now). --body or --body-file ('-' for stdin) is its
               body; --header adds a stored header (repeatable); Content-Type defaults
               to application/json when a body is given.

The record alone changes: what the operation's committed steps wrote (a pending
charge) is the application's to settle. Only a record whose outcome is unknown, or an
unfinished one whose lease has lapsed (nothing is running it), is changed; any other is
refused (exit 1) and left as it is ('idem keys delete' removes records). 'idem keys
list --state outcome_unknown' and '--state unfinished' find the keys to resolve.`

// maxResolveBody bounds the body an operator gives --body-file, as the middleware's
// default MaxResponseBytes bounds a stored response.
const maxResolveBody = idem.DefaultMaxResponseBytes

func runKeysResolve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newKeysCommand("resolve", keysResolveSynopsis)
	rawKey := c.fs.String("key", "", "the idempotency `key`, as the client sent it in Idempotency-Key (required)")
	release := c.fs.Bool("release", false, "release the key: delete the record, so that the next request executes afresh")
	status := c.fs.Int("status", 0, "complete the key with a response of this HTTP `status` (100-599)")
	body := c.fs.String("body", "", "the response's body `text`")
	bodyFile := c.fs.String("body-file", "", "read the response's body from `PATH` ('-': stdin)")
	var headers headerFlag
	var allowed listFlag
	c.fs.Var(&headers, "header", "a stored response header, `'Name: value'` (repeatable; never a credential such as Authorization or Set-Cookie; a name holding token, auth, key, secret, session, csrf or cookie only with --allow-stored-header)")
	c.fs.Var(&allowed, "allow-stored-header", "a `header` whose name looks like a credential's (X-Auth-Token, Api-Key…) that --header may store nonetheless: it is not one (repeatable; several comma-separated)")
	if code, done := parse(c.fs, args, stdout, stderr); done {
		return code
	}
	u, scope, err := c.target(true)
	key := ""
	if err == nil {
		key, err = parseKey(*rawKey)
	}
	var resp *idem.Response
	if err == nil {
		bodySet := false // --body "" is an empty body, not none
		c.fs.Visit(func(f *flag.Flag) { bodySet = bodySet || f.Name == "body" })
		resp, err = resolveResponse(*release, *status, *body, *bodyFile, headers, allowed.values, bodySet)
	}
	return c.withStore(ctx, stderr, u, scope, err, func(as admin.Store, scope string) int {
		return c.resolve(ctx, as, scope, key, resp, stdout, stderr)
	})
}

// resolveResponse builds the response of --status, --body, --body-file and --header
// (allowed: --allow-stored-header), or nil for --release; errors name the flags, and
// never show a header's value.
func resolveResponse(release bool, status int, body, bodyFile string, headers headerFlag, allowed []string, bodySet bool) (*idem.Response, error) {
	switch {
	case release && (status != 0 || bodySet || bodyFile != "" || len(headers) > 0):
		return nil, errors.New("--release excludes --status, --body, --body-file and --header")
	case release:
		return nil, nil
	case status == 0:
		return nil, errors.New("--release or --status is required")
	case status < 100 || status > 599:
		return nil, fmt.Errorf("--status %d: want an HTTP status, 100 to 599", status)
	case bodySet && bodyFile != "":
		return nil, errors.New("--body and --body-file exclude each other")
	}
	header, err := headers.headers("--header")
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(header)) {
		if err := admin.StoredHeaderError(name, allowed...); err != nil {
			return nil, fmt.Errorf("--header: %w", err)
		}
	}
	resp := &idem.Response{Status: status, Header: header, Body: []byte(body)}
	if bodyFile != "" {
		b, err := readBodyFile(bodyFile)
		if err != nil {
			return nil, err
		}
		resp.Body = b
	}
	if len(resp.Body) > 0 && resp.Header.Get("Content-Type") == "" {
		resp.Header.Set("Content-Type", "application/json")
	}
	return resp, nil
}

// readBodyFile reads --body-file, '-' for stdin, within maxResolveBody.
func readBodyFile(path string) ([]byte, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--body-file: %v", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxResolveBody+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("--body-file: %v", err)
	case len(b) > maxResolveBody:
		return nil, fmt.Errorf("--body-file: the body is over %d bytes", maxResolveBody)
	}
	return b, nil
}

type resolveJSON struct {
	// Resolved is "released" or "completed".
	Resolved string `json:"resolved"`
	Status   *int   `json:"status"`
}

func (c *keysCommand) resolve(ctx context.Context, as admin.Store, scope, key string, resp *idem.Response, stdout, stderr io.Writer) int {
	stored := resp
	if resp != nil {
		var err error
		if stored, err = c.sealResolution(ctx, as, scope, key, resp); err != nil {
			return failure(stderr, c.fs.Name(), err)
		}
	}
	err := as.RecordResolve(ctx, &admin.RecordResolveParams{Scope: scope, Key: key, Response: stored})
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return failure(stderr, c.fs.Name(), fmt.Errorf("no record of key %q in scope %s", key, showScope(scope)))
	case errors.Is(err, admin.ErrNotOutcomeUnknown):
		return failure(stderr, c.fs.Name(), fmt.Errorf("the outcome of key %q in scope %s is not unknown, nor is its operation unfinished: nothing to resolve ('idem keys get' shows the record; 'idem keys delete' removes it)", key, showScope(scope)))
	case errors.Is(err, admin.ErrLeaseLive):
		return failure(stderr, c.fs.Name(), fmt.Errorf("the unfinished operation of key %q in scope %s is running now (its lease is live): run again once its lease ends", key, showScope(scope)))
	case err != nil:
		return failure(stderr, c.fs.Name(), err)
	}
	out := resolveJSON{Resolved: "released"}
	if resp != nil {
		out = resolveJSON{Resolved: "completed", Status: &resp.Status}
	}
	if c.json {
		return writeJSON(stdout, stderr, c.fs.Name(), out)
	}
	if resp == nil {
		fmt.Fprintf(stdout, "released key %q of scope %s: the next request with it executes afresh\n", key, showScope(scope))
	} else {
		fmt.Fprintf(stdout, "completed key %q of scope %s with %d (%d bytes): every request with it gets this response\n",
			key, showScope(scope), resp.Status, len(resp.Body))
	}
	return exitOK
}

// sealResolution returns resp as the record of (scope, key) must keep it: sealed for
// it (SPEC §19) when it was made under a keyring (its fingerprint is keyed), which
// needs --encryption-key, and as it is otherwise.
func (c *keysCommand) sealResolution(ctx context.Context, as admin.Store, scope, key string, resp *idem.Response) (*idem.Response, error) {
	res, err := as.RecordInspect(ctx, &admin.RecordInspectParams{Scope: scope, Key: key})
	if err != nil || !res.Record.Fingerprint.Keyed() {
		return resp, nil // RecordResolve says what is wrong
	}
	ring, closeKeys, err := c.keys.opener(ctx)
	if err != nil {
		return nil, err
	}
	defer closeKeys()
	if ring == nil {
		return nil, errors.New("the record was made by a process that seals records (SPEC §19): give --encryption-key, so that the response is sealed for it as its own would be")
	}
	return admin.SealResponse(ring, scope, key, res.Record.ID, resp)
}
