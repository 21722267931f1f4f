package check

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
)

// BadKeysCheck: a missing or malformed key is refused, or keys are optional.
var BadKeysCheck = &Check{
	Name: "bad-keys",
	Doc:  "a missing, empty, too long (256 characters) or malformed key is refused with 400, or keys are reported as optional",
	rule: rules("§2, §3 (400 key_required, key_invalid: one field, 1 to 255 visible characters without \" , \\); IETF draft 2.1 and 2.7",
		"", "Stripe (keys optional, at most 255 characters)"),
	run: runBadKeys,
}

// keyCase is one request of the bad-keys check.
type keyCase struct {
	name string // in summaries: "256 characters"
	slug string // in causes: "256-characters"
	keys []string
}

// keyCases are the keys the bad-keys check sends in profile p.
func keyCases(p Profile) []keyCase {
	long := strings.Repeat(strings.ReplaceAll(client.NewKey(), "-", ""), 8)[:256]
	cases := []keyCase{
		{"missing", "missing", nil},
		{"empty", "empty", []string{""}},
		{"256 characters", "256-characters", []string{long}},
	}
	if p != ProfileStripe {
		cases = append(cases,
			keyCase{"a list", "list", []string{client.NewKey() + ", " + client.NewKey()}},
			keyCase{"two fields", "two-fields", []string{client.NewKey(), client.NewKey()}})
	}
	return cases
}

// keyRequired reports whether x, the answer to a request without a key, refuses it
// for want of one: 400, 428 Precondition Required, or the code key_required.
func keyRequired(x *Exchange) bool {
	s := x.status()
	return s == http.StatusBadRequest || s == http.StatusPreconditionRequired || x.Response != nil && x.Response.Code == idem.CodeKeyRequired
}

func runBadKeys(ctx context.Context, e *env) Result {
	var ev, failEv []*Exchange
	var accepted, fails, warns, oks, names, causes []string
	// What the request without a key said of keys: required (400), optional (2xx),
	// or neither (another answer, such as a record shared by keyless requests
	// answering 409 or 422: the keyless check tells).
	const (
		unknown = iota
		required
		optional
	)
	keys, missing := unknown, (*Exchange)(nil)
	e.keyless = map[string]*Exchange{}
	for _, c := range keyCases(e.cfg.Profile) {
		x := e.send(ctx, request{label: "key " + c.name, body: e.body, keys: c.keys})
		ev = append(ev, x)
		if c.slug == "missing" || c.slug == "empty" {
			e.keyless[c.slug] = x
		}
		s := x.status()
		switch {
		case c.keys == nil && keyRequired(x):
			keys, missing = required, x
			if s == http.StatusBadRequest {
				oks, names = append(oks, "missing "+x.describe()), append(names, c.name)
			} else {
				warns = append(warns, fmt.Sprintf("missing %s (400 expected)", x.describe()))
			}
		case c.keys == nil && is2xx(s):
			keys = optional
			warns = append(warns, fmt.Sprintf("missing %d (keys are optional)", s))
		case c.keys == nil:
			warns = append(warns, fmt.Sprintf("missing %s (neither 2xx nor 400 key_required: see keyless)", x.describe()))
		case s == http.StatusBadRequest:
			oks, names = append(oks, fmt.Sprintf("%s %s", c.name, x.describe())), append(names, c.name)
		case is2xx(s) && keys == optional:
			warns = append(warns, fmt.Sprintf("%s %d (accepted: keys are optional)", c.name, s))
		case is2xx(s) && keys == unknown:
			warns = append(warns, fmt.Sprintf("%s %d (accepted; whether keys are required cannot be told: a request without one got %s)", c.name, s, ev[0].describe()))
		case is2xx(s):
			accepted = append(accepted, fmt.Sprintf("%s %d", c.name, s))
			causes, failEv = append(causes, c.slug+"-accepted"), append(failEv, x)
		case takenAsKey(x) && keys == required:
			// Refused as a reuse, not as a bad key: an earlier request's record under
			// that key answered it (the empty key, the same in every run, of a run
			// before this one), so the key was taken as it is.
			accepted = append(accepted, fmt.Sprintf("%s %s (taken as a key, whose record answered it)", c.name, x.describe()))
			causes, failEv = append(causes, c.slug+"-accepted"), append(failEv, x)
		case s >= 400 && s < 500:
			warns = append(warns, fmt.Sprintf("%s %s (400 expected)", c.name, x.describe()))
		default:
			fails = append(fails, fmt.Sprintf("%s %s", c.name, x.describe()))
			causes, failEv = append(causes, c.slug+"-server-error"), append(failEv, x)
		}
	}
	if len(accepted) > 0 {
		fails = append(fails, fmt.Sprintf("%s: accepted, but keys are required (a request without one got %s)", strings.Join(accepted, ", "), missing.describe()))
		failEv = append([]*Exchange{missing}, failEv...)
	}
	switch {
	case len(fails) > 0:
		return failMany(failEv, causes, "%s", strings.Join(fails, "; "))
	case len(warns) > 0:
		return warn(ev, "%s", strings.Join(append(warns, oks...), "; "))
	}
	return pass(ev, "400 for each: %s", strings.Join(names, ", "))
}

// takenAsKey reports whether x, the answer to a request with a bad key, refuses it
// as a key's record would, not as a bad key: 409, or the code key_reused or
// request_in_progress.
func takenAsKey(x *Exchange) bool {
	if x.Response == nil {
		return false
	}
	switch x.Response.Code {
	case idem.CodeKeyReused, idem.CodeRequestInProgress:
		return true
	}
	return x.status() == http.StatusConflict
}

// KeylessCheck: requests without a key, or with an empty one, never share a record.
var KeylessCheck = &Check{
	Name: "keyless",
	Doc:  "requests without a key, or with an empty one, never share one record: two such requests with different bodies, or of two principals, are never answered with one resource or as a reuse",
	rule: rules("§3 (a missing key is 400 key_required, an empty one 400 key_invalid; a request without a key never touches a record); IETF draft 2.1 (the key is a non-empty string)", "", ""),
	run:  runKeyless,
}

// keylessForm is one way of sending no real key.
type keylessForm struct {
	name string // "missing", "empty": the key form, which causes name
	what string // in labels and summaries
	keys []string
}

var keylessForms = []keylessForm{
	{"missing", "without a key", nil},
	{"empty", "with an empty key", []string{""}},
}

func runKeyless(ctx context.Context, e *env) Result {
	var ev, failEv []*Exchange
	var fails, warns, notes, causes []string
	for _, f := range keylessForms {
		first := e.keyless[f.name] // the bad-keys check's, when it ran
		if first == nil {
			first = e.send(ctx, request{label: "--body " + f.what, body: e.body, keys: f.keys})
		}
		ev = append(ev, first)
		// A replay to the first request is the record of an earlier one: of this run,
		// or of a run before it on the same server. The requests below find the same
		// defect in every run; the replay is its cause only where they do not.
		replayed := ""
		if first.ok() && first.replayed() {
			replayed = fmt.Sprintf("a request %s got a replay (%d, %s, %s: true): the %s key is taken as one real key, whose record answers every request that sends it", f.what, first.status(), identity(first), HeaderReplayed, f.name)
		}
		formFails, formCauses := len(fails), len(causes)
		if keyRequired(first) || first.Response != nil && first.Response.Code == idem.CodeKeyInvalid {
			notes = append(notes, fmt.Sprintf("%s: refused, %s", f.what, first.describe()))
			continue
		}
		type probe struct {
			differ string // what differs from the first request: "requests" when nothing does
			req    request
		}
		// The same request again: a server that takes the key form for one real key
		// answers it from the first one's record, whatever it hashes into the key (the
		// body, the principal), and keeps that record for the next run too.
		probes := []probe{
			{"requests", request{label: "--body " + f.what + " again, the same request", body: e.body, keys: f.keys}},
			{"bodies", request{label: "--body-alt " + f.what, body: e.bodyAlt, keys: f.keys}},
		}
		if len(e.cfg.Other) > 0 {
			probes = append(probes, probe{"principals", request{label: "--body " + f.what + ", as the other principal (--as-other)", body: e.body, keys: f.keys, other: true}})
		}
		ran := 0
		if first.ok() {
			ran++
		}
		for _, p := range probes {
			x := e.send(ctx, p.req)
			ev = append(ev, x)
			if x.ok() {
				ran++
			}
			verdict, says := judgeKeyless(first, x, f, p.differ)
			switch verdict {
			case StatusFail:
				fails = append(fails, says)
				causes = append(causes, f.name+"-key-shared-across-"+p.differ)
				failEv = append(failEv, first, x)
			case StatusWarn:
				warns = append(warns, says)
			}
		}
		if replayed != "" {
			fails = slices.Insert(fails, formFails, replayed)
			failEv = append(failEv, first)
			if len(causes) == formCauses {
				causes = append(causes, f.name+"-key-replayed")
			}
		}
		if ran > 0 {
			notes = append(notes, fmt.Sprintf("%s: %d of %d ran, each as itself", f.what, ran, len(probes)+1))
		}
		if len(e.cfg.Other) == 0 {
			notes = append(notes, fmt.Sprintf("%s: principals not compared (no --as-other)", f.what))
		}
	}
	switch {
	case len(fails) > 0:
		return failMany(dedupe(failEv), causes, "%s", strings.Join(fails, "; "))
	case len(warns) > 0:
		return warn(ev, "%s", strings.Join(warns, "; "))
	}
	return pass(ev, "%s", strings.Join(notes, "; "))
}

// judgeKeyless judges x, a request sent as first was (in form f) but differing by
// what differ says ("bodies", "principals"): two such requests must never be one
// resource, nor the second refused as a reuse of the first's record.
func judgeKeyless(first, x *Exchange, f keylessForm, differ string) (Status, string) {
	two := fmt.Sprintf("two requests %s from different %s", f.what, differ)
	switch differ {
	case "bodies":
		two = fmt.Sprintf("two requests %s with different bodies", f.what)
	case "requests":
		two = fmt.Sprintf("two identical requests %s", f.what)
	}
	shared := fmt.Sprintf("the %s key is one real key, shared by every request that sends it", f.name)
	if f.name == "missing" {
		shared = "a missing key is taken as one real key, shared by every request without one"
	}
	if differ == "principals" {
		shared += ", across principals"
	}
	s := x.status()
	switch {
	case x.Response == nil:
		return StatusWarn, fmt.Sprintf("%s: the second got %s", two, x.describe())
	case first.ok() && x.ok() && untellable(first, x):
		return StatusWarn, fmt.Sprintf("%s got the same bytes without an id, a Location or a replay marker: whether they share a record cannot be told", two)
	case first.ok() && carries(first, x):
		return StatusFail, fmt.Sprintf("%s got one resource (%s): %s", two, identity(first), shared)
	case x.ok() && x.replayed():
		return StatusFail, fmt.Sprintf("%s: the second got a replay (%d, %s, %s: true): %s", two, s, identity(x), HeaderReplayed, shared)
	case x.ok():
		return StatusPass, ""
	case differ == "principals" && (s == http.StatusUnauthorized || s == http.StatusForbidden):
		return StatusWarn, fmt.Sprintf("the other principal's request %s was refused (%s): do the --as-other headers authenticate?", f.what, x.describe())
	case reuseAnswer(x) && first.ok():
		return StatusFail, fmt.Sprintf("%s: the first ran (%d, %s), the second was answered as a reuse of its record (%s): %s", two, first.status(), identity(first), x.describe(), shared)
	case differ == "principals" && reuseAnswer(x) && reuseAnswer(first):
		// Each principal's request may have met a record of its own, kept from an
		// earlier request (of a run before this one): that is what the identical
		// requests judge, and one record for both principals cannot be told from it.
		return StatusWarn, fmt.Sprintf("%s were both answered as a reuse (%s, %s): whether they share one record, or each principal has its own, cannot be told", two, first.describe(), x.describe())
	case reuseAnswer(x) && reuseAnswer(first) && (x.Response.Code != "" || first.Response.Code != ""):
		return StatusFail, fmt.Sprintf("%s were both answered as a reuse (%s, %s), though neither reused a key: %s", two, first.describe(), x.describe(), shared)
	case first.ok():
		return StatusWarn, fmt.Sprintf("%s: the first ran (%d), the second got %s: whether they share a record cannot be told", two, first.status(), x.describe())
	}
	return StatusWarn, fmt.Sprintf("%s got %s and %s (neither 2xx nor 400 key_required): whether they share a record cannot be told", two, first.describe(), x.describe())
}

// reuseAnswer reports whether x answers as a key's record would a request that does
// not match it, or whose first request is running: a code saying so (key_reused,
// request_in_progress), or 409 or 422.
func reuseAnswer(x *Exchange) bool {
	if x.Response == nil {
		return false
	}
	switch x.Response.Code {
	case idem.CodeKeyReused, idem.CodeRequestInProgress:
		return true
	}
	return x.status() == http.StatusConflict || x.status() == http.StatusUnprocessableEntity
}

// dedupe returns xs without repeats, in order.
func dedupe(xs []*Exchange) []*Exchange {
	var out []*Exchange
	seen := map[*Exchange]bool{}
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
