package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/seal"
)

const keysSealSynopsis = `begin|end|status --store URL --encryption-key KEY [--handoff D] [--json]

Turns the sealing of a store's records on or off (SPEC §20, docs/security.md), or shows it.

  begin   once every process that serves the store runs with --encryption-key: records the
          begin in the store's state, MAC'd under the store's MAC secret. Processes without
          a key stop claiming within 5 s (503) and refuse to start; processes with one write
          sealed records from the begin + --handoff, and keep replaying those made before in
          clear until they expire. Refused below format level 2 (idem migrate --finalize).
  end     the first step to turn sealing off: processes with a key write in clear again from
          the end + --handoff, and keep opening sealed records; processes without a key may
          then start with --sealing-off. Remove the keys only once the last sealed record
          expired.
  status  the store's sealing state (verified with --encryption-key).`

// toolStore opens the existing store u for a keys subcommand, quietly, once its flags
// parsed without flagErr; ok false with the exit code after reporting flagErr (a usage
// error) or the store's failure.
func toolStore(ctx context.Context, fs *flag.FlagSet, u storeURL, flagErr error, stderr io.Writer) (st *openedStore, code int, ok bool) {
	if flagErr != nil {
		return nil, usageError(stderr, fs, flagErr.Error()), false
	}
	st, err := openStore(ctx, u, newLogger(io.Discard, 0), nil, true)
	if err != nil {
		return nil, failure(stderr, fs.Name(), err), false
	}
	return st, exitOK, true
}

// runKeysSeal runs `idem keys seal begin|end|status`.
func runKeysSeal(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("keys seal", keysSealSynopsis)
	store := storeFlag(fs)
	handoff := fs.Duration("handoff", idem.SealingHandoff, "how long after the change the processes with a key change how they write: "+
		"every process reads the store's state again within 5 s and its claims are bounded within 45 s of a read, "+
		"so a shorter handoff is safe only when no process serves the store")
	asJSON := fs.Bool("json", false, "write JSON on stdout")
	var keys keyURLs
	keys.register(fs)
	action := ""
	if len(args) > 0 && (args[0] == "begin" || args[0] == "end" || args[0] == "status") {
		action, args = args[0], args[1:]
	}
	if code, done := parse(fs, args, stdout, stderr); done {
		return code
	}
	u, err := requiredStore(*store)
	switch {
	case err != nil:
	case action == "":
		err = errors.New("want begin, end or status before the flags")
	case action != "status" && len(keys.urls) == 0:
		err = fmt.Errorf("%s needs --encryption-key: the change is MAC'd under the store's MAC secret, which a key opens", action)
	case *handoff <= 0:
		err = fmt.Errorf("--handoff must be positive, got %v", *handoff)
	}
	st, code, ok := toolStore(ctx, fs, u, err, stderr)
	if !ok {
		return code
	}
	defer st.close()
	var ring *seal.Keyring
	if len(keys.urls) > 0 {
		ks, closeKeys, err := keys.open(ctx)
		if err != nil {
			return failure(stderr, fs.Name(), err)
		}
		defer closeKeys()
		if ring, err = idem.OpenKeyring(ctx, st.store, ks...); err != nil {
			return failure(stderr, fs.Name(), fmt.Errorf("--encryption-key: %w", err))
		}
	}
	change := idem.SealingChange{Handoff: *handoff}
	var state idem.StoreState
	switch action {
	case "begin":
		state, err = idem.BeginSealing(ctx, st.store, ring, change)
	case "end":
		state, err = idem.EndSealing(ctx, st.store, ring, change)
	default:
		state, err = idem.ReadStoreState(ctx, st.store)
	}
	if err != nil {
		return failure(stderr, fs.Name(), err)
	}
	verified := "not verified (no --encryption-key)"
	if ring != nil {
		verified = "verified under the store's MAC secret"
		if _, err := idem.CheckSealing(ctx, st.store, ring, false); err != nil {
			verified = err.Error()
		}
	}
	s := state.Sealing
	if *asJSON {
		out := struct {
			Phase     string     `json:"phase"`
			At        *time.Time `json:"at,omitempty"`
			SealsFrom *time.Time `json:"sealed_from,omitempty"`
			ClearFrom *time.Time `json:"clear_from,omitempty"`
			Handoff   string     `json:"handoff,omitempty"`
			Verified  string     `json:"verified"`
			Mode      string     `json:"mode"`
		}{Phase: string(s.Phase), Verified: verified, Mode: sealingMode(s, ring)}
		if out.Phase == "" {
			out.Phase = "none"
		}
		if !s.At.IsZero() {
			out.At, out.Handoff = &s.At, s.Handoff.String()
			sf := s.SealsFrom()
			out.SealsFrom = &sf
		}
		if s.Phase == idem.SealingEnded {
			cf := s.ClearFrom()
			out.ClearFrom = &cf
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return exitOK
	}
	fmt.Fprintf(stdout, "sealing: %s\nstate: %s\n", s, verified)
	return exitOK
}
