package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/idem-go/idem/admin"
)

const keysRewrapSynopsis = `--store URL --encryption-key NEW,RETIRED... [--json]

Retires keys (SPEC §19, docs/security.md "Retire a key"): re-wraps every generation of
the store's MAC secret under the first --encryption-key alone, and re-seals every record
whose response or step results are sealed under another key, each overwritten in place.
Afterwards the keys after the first open nothing current in the store. Run it once every
process seals under the first key (its start line says sealed_under=<its id>), with the
retired keys after it, so that what they wrapped opens. A record that changes meanwhile is
left as it is and counted: run it again. SQLite and PostgreSQL (Redis cannot).`

// runKeysRewrap runs `idem keys rewrap`.
func runKeysRewrap(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("keys rewrap", keysRewrapSynopsis)
	store := storeFlag(fs)
	asJSON := fs.Bool("json", false, "write JSON on stdout")
	var keys keyURLs
	keys.register(fs)
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	u, err := requiredStore(*store)
	if err == nil && len(keys.urls) == 0 {
		err = errors.New("--encryption-key is required: the key to keep first, the retired ones after it")
	}
	st, code, ok := toolStore(ctx, fs, u, err, stderr)
	if !ok {
		return code
	}
	defer st.close()
	ks, closeKeys, err := keys.open(ctx)
	if err != nil {
		return failure(stderr, fs.Name(), err)
	}
	defer closeKeys()
	res, err := admin.Rewrap(ctx, st.store, ks...)
	if err != nil {
		return failure(stderr, fs.Name(), err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			KeptUnder  string `json:"kept_under"`
			Secrets    int    `json:"secrets"`
			Records    int    `json:"records"`
			Changed    int    `json:"changed"`
			Unreadable int    `json:"unreadable"`
		}{ks[0].ID(), res.Secrets, res.Records, res.Changed, res.Unreadable})
		return exitOK
	}
	fmt.Fprintf(stdout, "re-wrapped under %s: %d generation(s) of the MAC secret, %d record(s); %d changed meanwhile (run again); "+
		"%d no key opens (left as they are: they fail closed)\n", ks[0].ID(), res.Secrets, res.Records, res.Changed, res.Unreadable)
	return exitOK
}
