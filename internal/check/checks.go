package check

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
)

// Checks returns every check, in the order [Run] runs them.
func Checks() []*Check {
	return []*Check{
		ReplayCheck, ConcurrencyCheck, ChangedBodyCheck, ErrorsNotStoredCheck,
		BadKeysCheck, PerPrincipalCheck, SafeMethodsCheck,
	}
}

// rules returns a check's rule per profile: seed's text, and ietf's and stripe's
// where they differ ("" for seed's).
func rules(seed, ietf, stripe string) func(Profile) string {
	return func(p Profile) string {
		switch {
		case p == ProfileIETF && ietf != "":
			return ietf
		case p == ProfileStripe && stripe != "":
			return stripe
		}
		return seed
	}
}

// ReplayCheck: a retry of a completed request gets its answer again, byte for byte.
var ReplayCheck = &Check{
	Name: "replay",
	Doc:  "a retry with the same key and body gets the first answer again: the same status, Content-Type and body",
	rule: rules("§5.4 (the same status, body bytes and stored headers); IETF draft 2.6 (a retry gets the result of the completed request)", "", ""),
	run:  runReplay,
}

func runReplay(ctx context.Context, e *env) Result {
	first := e.fixture
	xs := e.sendUntilFinal(ctx, request{label: "retry: the same key and body", body: e.cfg.Body, keys: []string{e.fixtureKey}})
	retry := xs[len(xs)-1]
	ev := append([]*Exchange{first}, xs...)
	switch {
	case retry.Response == nil:
		return fail(ev, "the retry got %s", retry.describe())
	case retry.ok() && !sameResource(first, retry):
		r := fail(ev, "the retry got another resource (%s, first %s): the request ran twice", identity(retry), identity(first))
		r.Created = 1
		return r
	case retry.status() != first.status():
		return fail(ev, "the retry got %s where the first request got %s", retry.describe(), first.describe())
	case !bytes.Equal(retry.Response.raw, first.Response.raw):
		return fail(ev, "the retry got the same resource (%s) with another body: %s", identity(first), diffAt(first.Response.raw, retry.Response.raw))
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if got, want := retry.Response.Header.Get(h), first.Response.Header.Get(h); got != want {
			return fail(ev, "the retry got %s %q where the first answer had %q", h, got, want)
		}
	}
	marker := "no " + HeaderReplayed + " header"
	if retry.replayed() {
		marker = HeaderReplayed + ": true"
	}
	return pass(ev, "%d again, the same body (%s)", retry.status(), marker)
}

// ConcurrencyCheck: duplicates of one key sent at once create one resource.
var ConcurrencyCheck = &Check{
	Name: "concurrent-duplicates",
	Doc:  "duplicates of one key sent at once create one resource; the others get an in-flight answer (409) or its replay",
	rule: rules("§5.1 (one claim wins), §5.2 (409 request_in_progress with Retry-After)",
		"§5.1, §5.2; IETF draft 2.6 and 2.7 (a concurrent duplicate gets 409)",
		"§5.1; Stripe (a concurrent duplicate gets 409, or 429)"),
	run: runConcurrency,
}

func runConcurrency(ctx context.Context, e *env) Result {
	n := e.cfg.Concurrency
	key := client.NewKey()
	burst := make([]*Exchange, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			burst[i] = e.send(ctx, request{label: fmt.Sprintf("duplicate %d of %d, sent at once", i+1, n), body: e.cfg.Body, keys: []string{key}})
		})
	}
	close(start)
	wg.Wait()
	after := e.sendUntilFinal(ctx, request{label: "afterwards: the same key and body again", body: e.cfg.Body, keys: []string{key}})
	ev := append(burst, after...)

	var resources []string // identities of the 2xx answers, distinct, in order
	var wrong []*Exchange  // neither 2xx nor in flight
	noRetryAfter, burstOK := 0, 0
	note := func(x *Exchange) {
		switch {
		case x.ok():
			if id := identity(x); !slices.Contains(resources, id) {
				resources = append(resources, id)
			}
		case e.inFlightDuplicate(x):
			if x.status() == http.StatusConflict && !x.retryAfter() {
				noRetryAfter++
			}
		default:
			wrong = append(wrong, x)
		}
	}
	for _, x := range burst {
		if x.ok() {
			burstOK++
		}
		note(x)
	}
	for _, x := range after {
		note(x)
	}
	tally := tallyAnswers(burst)
	switch {
	case len(resources) > 1:
		r := fail(ev, "%d requests at once made %d resources (%s): the duplicates ran more than once; answers: %s",
			n, len(resources), list(resources, 3), tally)
		r.Created = len(resources)
		return r
	case len(wrong) > 0:
		r := fail(ev, "%s got %s: a duplicate gets the one resource (2xx) or an in-flight answer (%s); answers: %s",
			wrong[0].Label, wrong[0].describe(), e.cfg.Profile.inFlightText(), tally)
		r.Created = len(resources)
		return r
	case len(resources) == 0:
		return fail(ev, "no request with the key got a 2xx answer; answers: %s", tally)
	case burstOK == 0:
		r := warn(ev, "none of the %d requests at once ran (%s); the key ran afterwards (%s): concurrency was not observed", n, tally, resources[0])
		r.Created = 1
		return r
	case noRetryAfter > 0 && e.cfg.Profile == ProfileSeed:
		r := warn(ev, "one resource (%s), but %d in-flight 409s had no Retry-After (§5.2); answers: %s", resources[0], noRetryAfter, tally)
		r.Created = 1
		return r
	}
	r := pass(ev, "%d at once, one resource (%s): %s", n, resources[0], tally)
	r.Created = 1
	return r
}

// inFlightDuplicate reports whether x is a right answer to a duplicate whose first
// request is still running: an in-flight status of the profile without an error code
// that says something else (key_reused, response_not_stored, outcome_unknown).
func (e *env) inFlightDuplicate(x *Exchange) bool {
	if x.Response == nil || !e.cfg.Profile.inFlight(x.status()) {
		return false
	}
	switch x.Response.Code {
	case idem.CodeKeyReused, idem.CodeResponseNotStored, idem.CodeOutcomeUnknown:
		return false
	}
	return true
}

// inFlightText names the in-flight answers of the profile.
func (p Profile) inFlightText() string {
	switch p {
	case ProfileSeed:
		return "409 with Retry-After, 429 or 503"
	case ProfileStripe:
		return "409 or 429"
	}
	return "409, 429 or 503"
}

// ChangedBodyCheck: a used key with another body is refused and keeps its record.
var ChangedBodyCheck = &Check{
	Name: "changed-body",
	Doc:  "the same key with another body is refused (409 seed, 422 IETF, 400 Stripe), never answered with the first response, and keeps it",
	rule: rules("§5.5 (seed: 409 key_reused, the record untouched)",
		"§5.5 (profile ietf: 422 key_reused); IETF draft 2.2 and 2.7 (422)",
		"§5.5; Stripe (400 idempotency_error)"),
	run: runChangedBody,
}

func runChangedBody(ctx context.Context, e *env) Result {
	want := e.cfg.Profile.keyReusedStatus()
	x := e.send(ctx, request{label: "the same key with --body-alt", body: e.cfg.BodyAlt, keys: []string{e.fixtureKey}})
	ev := []*Exchange{e.fixture, x}
	switch {
	case x.Response == nil:
		return fail(ev, "the changed body got %s", x.describe())
	case x.ok() && sameResource(e.fixture, x):
		return fail(ev, "the changed body got the first answer (%d, %s): the change was silently ignored", x.status(), identity(x))
	case x.ok():
		r := fail(ev, "the changed body ran under the used key (%d, another resource %s)", x.status(), identity(x))
		r.Created = 1
		return r
	case x.Response.Code == idem.CodeRequestInProgress:
		return fail(ev, "the changed body got %s, long after the first request completed; want %d", x.describe(), want)
	case x.status() != want:
		return fail(ev, "the changed body got %s; want %d in profile %s%s", x.describe(), want, e.cfg.Profile, e.cfg.Profile.otherProfile(x.status()))
	}
	again := e.sendUntilFinal(ctx, request{label: "then the first body again", body: e.cfg.Body, keys: []string{e.fixtureKey}})
	ev = append(ev, again...)
	last := again[len(again)-1]
	if !sameResource(e.fixture, last) {
		r := fail(ev, "refused with %s, but then the first body got %s, not its first answer: the refusal changed the key's record", x.describe(), last.describe())
		if last.ok() {
			r.Created = 1
		}
		return r
	}
	return pass(ev, "%s; the first body still gets its first answer", x.describe())
}

// otherProfile names the profile whose changed-body status is status, as a hint.
func (p Profile) otherProfile(status int) string {
	for _, q := range []Profile{ProfileSeed, ProfileIETF, ProfileStripe} {
		if q != p && q.keyReusedStatus() == status {
			return fmt.Sprintf(" (%d is profile %s's answer: --profile %s)", status, q, q)
		}
	}
	return ""
}

// ErrorsNotStoredCheck: a rejected request frees its key.
var ErrorsNotStoredCheck = &Check{
	Name: "errors-not-stored",
	Doc:  "a rejected body (400, 422) is not stored: the same key then succeeds with a valid body",
	rule: rules("§6 (400, 422 and the like free the key); IETF draft 2.7 (the client corrects the request and retries)", "", ""),
	run:  runErrorsNotStored,
}

func runErrorsNotStored(ctx context.Context, e *env) Result {
	if e.cfg.BodyInvalid == nil {
		return skip(nil, "no --body-invalid, and --body is not a JSON object to derive {} from")
	}
	key := client.NewKey()
	bad := e.send(ctx, request{label: "--body-invalid with a fresh key", body: e.cfg.BodyInvalid, keys: []string{key}})
	ev := []*Exchange{bad}
	switch {
	case bad.Response == nil:
		return fail(ev, "--body-invalid got %s", bad.describe())
	case bad.ok():
		r := warn(ev, "--body-invalid was accepted (%d): give a body the endpoint rejects", bad.status())
		r.Created = 1
		return r
	case idem.DefaultStorePolicy(bad.status()):
		return skip(ev, "--body-invalid got %s, a final outcome that may be stored (§6): give a body the endpoint rejects with 400 or 422", bad.describe())
	}
	again := e.sendUntilFinal(ctx, request{label: "then --body with the same key", body: e.cfg.Body, keys: []string{key}})
	ev = append(ev, again...)
	good := again[len(again)-1]
	switch {
	case good.ok():
		r := pass(ev, "--body-invalid %s, then --body %d with the same key", bad.describe(), good.status())
		r.Created = 1
		return r
	case good.Response != nil && good.status() == bad.status() && bytes.Equal(good.Response.raw, bad.Response.raw):
		return fail(ev, "the key replays its rejection (%s) to a valid body: the rejected request was stored", bad.describe())
	case good.Response != nil && (good.Response.Code == idem.CodeKeyReused || good.status() == e.cfg.Profile.keyReusedStatus() && good.status() != bad.status()):
		return fail(ev, "--body-invalid got %s, then --body got %s with the same key: the key stays bound to the rejected body", bad.describe(), good.describe())
	}
	return fail(ev, "--body-invalid got %s, then --body got %s with the same key; want 2xx", bad.describe(), good.describe())
}

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
	name string
	keys []string
}

// keyCases are the keys the bad-keys check sends in profile p.
func keyCases(p Profile) []keyCase {
	long := strings.Repeat(strings.ReplaceAll(client.NewKey(), "-", ""), 8)[:256]
	cases := []keyCase{
		{"missing", nil},
		{"empty", []string{""}},
		{"256 characters", []string{long}},
	}
	if p != ProfileStripe {
		cases = append(cases,
			keyCase{"a list", []string{client.NewKey() + ", " + client.NewKey()}},
			keyCase{"two fields", []string{client.NewKey(), client.NewKey()}})
	}
	return cases
}

func runBadKeys(ctx context.Context, e *env) Result {
	var ev []*Exchange
	var fails, warns, oks, names []string
	created := 0
	optional := false
	for _, c := range keyCases(e.cfg.Profile) {
		x := e.send(ctx, request{label: "key " + c.name, body: e.cfg.Body, keys: c.keys})
		ev = append(ev, x)
		s := x.status()
		if x.ok() {
			created++
		}
		switch {
		case s == http.StatusBadRequest:
			oks = append(oks, fmt.Sprintf("%s %s", c.name, x.describe()))
			names = append(names, c.name)
		case c.keys == nil && is2xx(s):
			optional = true
			warns = append(warns, fmt.Sprintf("missing %d (keys are optional)", s))
		case is2xx(s) && optional:
			warns = append(warns, fmt.Sprintf("%s %d (accepted: keys are optional)", c.name, s))
		case is2xx(s):
			fails = append(fails, fmt.Sprintf("%s %d (accepted, but keys are required)", c.name, s))
		case s >= 400 && s < 500:
			warns = append(warns, fmt.Sprintf("%s %s (400 expected)", c.name, x.describe()))
		default:
			fails = append(fails, fmt.Sprintf("%s %s", c.name, x.describe()))
		}
	}
	var r Result
	switch {
	case len(fails) > 0:
		r = fail(ev, "%s", strings.Join(append(append(fails, warns...), oks...), "; "))
	case len(warns) > 0:
		r = warn(ev, "%s", strings.Join(append(warns, oks...), "; "))
	default:
		r = pass(ev, "400 for each: %s", strings.Join(names, ", "))
	}
	r.Created = created
	return r
}

// PerPrincipalCheck: one principal's key never replays another's response.
var PerPrincipalCheck = &Check{
	Name: "per-principal",
	Doc:  "keys are scoped per principal: another principal's request with a used key never gets the first principal's response",
	rule: rules("§3 (a record is identified by (scope, key); nothing of one principal is replayed to another); IETF draft Security Considerations (a composite key with the client's identity)", "", ""),
	run:  runPerPrincipal,
}

func runPerPrincipal(ctx context.Context, e *env) Result {
	if len(e.cfg.Other) == 0 {
		return skip(nil, "no --as-other: give a second principal's headers to check")
	}
	x := e.send(ctx, request{label: "another principal (--as-other): the same key and body", body: e.cfg.Body, keys: []string{e.fixtureKey}, other: true})
	ev := []*Exchange{e.fixture, x}
	s := x.status()
	switch {
	case x.Response == nil:
		return fail(ev, "the other principal's request got %s", x.describe())
	case x.ok() && sameResource(e.fixture, x) && resourceID(x.Response.raw) == "" && !x.replayed():
		// An empty body, or one without an id, is the same for every execution.
		return warn(ev, "the other principal's answer is the first principal's, byte for byte, without an id or a replay marker: whether it ran cannot be told")
	case x.ok() && sameResource(e.fixture, x):
		return fail(ev, "the other principal got the first principal's response (%s): keys are not scoped per principal", identity(x))
	case x.ok() && x.replayed():
		r := fail(ev, "the other principal's first use of the key got a replay (%s: true)", HeaderReplayed)
		r.Created = 1
		return r
	case x.ok():
		r := pass(ev, "the other principal's request ran as its own (%d, %s)", s, identity(x))
		r.Created = 1
		return r
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return warn(ev, "the other principal was refused (%s): do the --as-other headers authenticate?", x.describe())
	case s >= 400 && s < 500:
		return warn(ev, "the other principal's first use of the key was refused (%s): keys are shared across principals (nothing leaked)", x.describe())
	}
	return fail(ev, "the other principal's request got %s", x.describe())
}

// SafeMethodsCheck: GET ignores the key.
var SafeMethodsCheck = &Check{
	Name: "safe-methods",
	Doc:  "a GET of the URL with a key is answered as one without: the key is ignored, nothing is replayed",
	rule: rules("§2 (GET, HEAD, OPTIONS pass through; a key is ignored); IETF draft 1 (the key is for non-idempotent methods)", "", ""),
	run:  runSafeMethods,
}

func runSafeMethods(ctx context.Context, e *env) Result {
	plain := e.send(ctx, request{label: "GET without a key", method: http.MethodGet})
	ev := []*Exchange{plain}
	switch s := plain.status(); {
	case plain.Response == nil:
		return skip(ev, "GET of the URL got %s", plain.describe())
	case s == http.StatusNotFound || s == http.StatusMethodNotAllowed || s == http.StatusNotImplemented:
		return skip(ev, "GET is not served at the URL (%d)", s)
	}
	key := client.NewKey()
	keyed := e.send(ctx, request{label: "GET with a fresh key", method: http.MethodGet, keys: []string{key}})
	again := e.send(ctx, request{label: "GET with the same key again", method: http.MethodGet, keys: []string{key}})
	ev = append(ev, keyed, again)
	for _, x := range []*Exchange{keyed, again} {
		switch {
		case x.status() != plain.status():
			return fail(ev, "%s got %s, without a key %s: a GET must ignore the key", x.Label, x.describe(), plain.describe())
		case x.replayed():
			return fail(ev, "%s was answered as a replay (%s: true)", x.Label, HeaderReplayed)
		}
	}
	note := ""
	if !bytes.Equal(plain.Response.raw, keyed.Response.raw) {
		note = " (the bodies differ: the data may have changed between them)"
	}
	return pass(ev, "GET %d with and without a key%s", plain.status(), note)
}

// sendUntilFinal sends r, and sends it again while the answer says that the key's
// first request is still running (request_in_progress, or an in-flight status with
// Retry-After), waiting Retry-After (between 50 ms and 1 s) in between, for at most
// the request timeout. It returns every exchange, the final one last.
func (e *env) sendUntilFinal(ctx context.Context, r request) []*Exchange {
	deadline := time.Now().Add(e.cfg.Timeout)
	label := r.label
	var xs []*Exchange
	for attempt := 2; ; attempt++ {
		x := e.send(ctx, r)
		xs = append(xs, x)
		if !e.inFlightRetry(x) || time.Now().After(deadline) {
			return xs
		}
		t := time.NewTimer(retryWait(x))
		select {
		case <-ctx.Done():
			t.Stop()
			return xs
		case <-t.C:
		}
		r.label = fmt.Sprintf("%s (attempt %d, after an in-flight answer)", label, attempt)
	}
}

// inFlightRetry reports whether x asks for the same request later: 409
// request_in_progress, or an in-flight status with Retry-After and no other code.
func (e *env) inFlightRetry(x *Exchange) bool {
	if x.Response == nil {
		return false
	}
	if x.Response.Code == idem.CodeRequestInProgress {
		return true
	}
	return x.Response.Code == "" && x.retryAfter() && e.cfg.Profile.inFlight(x.status())
}

// retryWait is the wait Retry-After asks for, between 50 ms and 1 s.
func retryWait(x *Exchange) time.Duration {
	var secs int
	if _, err := fmt.Sscanf(x.Response.Header.Get("Retry-After"), "%d", &secs); err == nil {
		return min(max(time.Duration(secs)*time.Second, 50*time.Millisecond), time.Second)
	}
	return 100 * time.Millisecond
}

// tallyAnswers counts answers by what they were, in the order of their statuses:
// "1 × 201, 15 × 409 request_in_progress", replays apart.
func tallyAnswers(xs []*Exchange) string {
	var order []string
	count := map[string]int{}
	for _, x := range xs {
		d := x.describe()
		if x.ok() && x.replayed() {
			d += " replayed"
		}
		if count[d] == 0 {
			order = append(order, d)
		}
		count[d]++
	}
	slices.Sort(order)
	parts := make([]string, len(order))
	for i, d := range order {
		parts[i] = fmt.Sprintf("%d × %s", count[d], d)
	}
	return strings.Join(parts, ", ")
}

// diffAt describes where two bodies first differ, with a few bytes around.
func diffAt(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	around := func(s []byte) string {
		from, to := max(i-16, 0), min(i+24, len(s))
		out := oneLine(string(s[from:to]))
		if from > 0 {
			out = "…" + out
		}
		if to < len(s) {
			out += "…"
		}
		return out
	}
	return fmt.Sprintf("from byte %d, first %s, then %s", i, around(a), around(b))
}

// list joins the first n of s, and says how many more there are.
func list(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(s[:n], ", "), len(s)-n)
}

func result(s Status, ev []*Exchange, format string, args ...any) Result {
	return Result{Status: s, Summary: fmt.Sprintf(format, args...), Evidence: ev}
}

func pass(ev []*Exchange, format string, args ...any) Result {
	return result(StatusPass, ev, format, args...)
}

func warn(ev []*Exchange, format string, args ...any) Result {
	return result(StatusWarn, ev, format, args...)
}

func fail(ev []*Exchange, format string, args ...any) Result {
	return result(StatusFail, ev, format, args...)
}

func skip(ev []*Exchange, format string, args ...any) Result {
	return result(StatusSkip, ev, format, args...)
}
