package check

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
)

// Checks returns every check, in the order [Run] runs them.
func Checks() []*Check {
	return []*Check{
		ReplayCheck, ConcurrencyCheck, SpreadDuplicatesCheck, DistinctKeysCheck, ChangedBodyCheck,
		OtherRequestCheck, ErrorsNotStoredCheck, After5xxCheck, BadKeysCheck, KeylessCheck,
		PerPrincipalCheck, PatchCheck, SafeMethodsCheck, RestartCheck,
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
	Doc:  "a retry with the same key and body gets the first answer again: the same status, body bytes and stored headers (" + strings.Join(replayedHeaders, ", ") + "), on every instance",
	rule: rules("§5.4 (the same status, body bytes and stored headers); IETF draft 2.6 (a retry gets the result of the completed request)", "", ""),
	run:  runReplay,
}

// replayedHeaders are the headers of a first answer that its replays must carry.
var replayedHeaders = []string{"Content-Type", "Location"}

func runReplay(ctx context.Context, e *env) Result {
	first := e.fixture
	ev := []*Exchange{first}
	var retries []*Exchange
	for i := range e.urls {
		label := "retry: the same key and body"
		if len(e.urls) > 1 {
			label += fmt.Sprintf(", on instance %d", i+1)
		}
		xs := e.sendUntilFinal(ctx, request{label: label, body: e.body, keys: []string{e.fixtureKey}, instance: i})
		ev = append(ev, xs...)
		retries = append(retries, xs[len(xs)-1])
	}
	e.setReplays(retries[0])
	where := func(i int) string {
		if len(e.urls) > 1 {
			return fmt.Sprintf(" on instance %d", i+1)
		}
		return ""
	}
	// A replay is recognised by its content, whatever its status; what is not one
	// either ran again or was refused.
	for i, retry := range retries {
		switch {
		case retry.Response == nil:
			return fail(ev, "no-answer", "the retry%s got %s", where(i), retry.describe())
		case carries(first, retry):
		case retry.ok():
			return fail(ev, "ran-twice", "the retry%s got another resource (%s, first %s): the request ran twice", where(i), identity(retry), identity(first))
		default:
			return fail(ev, "status-differs", "the retry%s got %s where the first request got %s", where(i), retry.describe(), first.describe())
		}
	}
	// Then what a replay of the first answer must carry, on each instance.
	with409 := false
	for i, retry := range retries {
		if !bytes.Equal(retry.Response.raw, first.Response.raw) {
			return fail(ev, "body-differs", "the retry%s got the same resource (%s) with another body: %s", where(i), identity(first), e.diffAt(first.Response.raw, retry.Response.raw))
		}
		for _, h := range replayedHeaders {
			if got, want := retry.Response.Header.Get(h), first.Response.Header.Get(h); got != want {
				return fail(ev, strings.ToLower(h)+"-differs", "the retry%s got %s %q where the first answer had %q", where(i), h, got, want)
			}
		}
		switch s := retry.status(); {
		case s == first.status():
		case s == http.StatusConflict:
			with409 = true
		default:
			return fail(ev, "status-differs", "the retry%s got the first answer's body and headers with %d where the first request got %d: a replay keeps the status", where(i), s, first.status())
		}
	}
	marker := "no " + HeaderReplayed + " header"
	if retries[0].replayed() {
		marker = HeaderReplayed + ": true"
	}
	each := ""
	if len(e.urls) > 1 {
		each = fmt.Sprintf(" on each of %d instances", len(e.urls))
	}
	if with409 {
		return warn(ev, "replayed with 409%s: the first answer's body and %s again, but 409, not %d (%s): clients take a 409 for a failure, and must read the body to find the resource", each, strings.Join(replayedHeaders, ", "), first.status(), marker)
	}
	return pass(ev, "%d again%s, the same body and %s (%s)", retries[0].status(), each, strings.Join(replayedHeaders, ", "), marker)
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
	var rounds []roundResult
	for round := range e.cfg.Rounds {
		rounds = append(rounds, e.concurrencyRound(ctx, round+1))
	}
	return e.judgeRounds(rounds, func(roundsText, where string) string {
		return fmt.Sprintf("%s of %d at once%s, one resource each", roundsText, e.cfg.Concurrency, where)
	})
}

// judgeRounds is the verdict of rounds of duplicates: a failure when a round made
// more than one resource (naming how many rounds did) or failed otherwise, a warning
// when one warned, else a pass that says what (given the rounds, "3 rounds", and where
// they went, " across 2 instances") and what the last round's answers were.
func (e *env) judgeRounds(rounds []roundResult, what func(roundsText, where string) string) Result {
	var ev []*Exchange
	for _, rr := range rounds {
		ev = append(ev, rr.exchanges...)
	}
	dup := 0
	var worst *roundResult
	for i := range rounds {
		rr := &rounds[i]
		if rr.status == StatusFail && worst == nil {
			worst = rr
		}
		if rr.duplicated {
			dup++
		}
	}
	total := len(rounds)
	roundsText := fmt.Sprintf("%d rounds", total)
	if total == 1 {
		roundsText = "1 round"
	}
	where := ""
	if len(e.urls) > 1 {
		where = fmt.Sprintf(" across %d instances", len(e.urls))
	}
	if worst != nil {
		// A failure's evidence is the failed rounds' exchanges, the first failed
		// round's first: the text report shows the first few.
		ev = slices.Clone(worst.exchanges)
		for _, rr := range rounds {
			if rr.status == StatusFail && rr.round != worst.round {
				ev = append(ev, rr.exchanges...)
			}
		}
	}
	switch {
	case dup > 0:
		return fail(ev, "duplicates-ran", "%d of %s ran duplicates; round %d: %s", dup, roundsText, worst.round, worst.summary)
	case worst != nil:
		return fail(ev, worst.cause, "round %d of %d: %s", worst.round, total, worst.summary)
	}
	for _, rr := range rounds {
		if rr.status == StatusWarn {
			return warn(ev, "round %d of %d: %s", rr.round, total, rr.summary)
		}
	}
	return pass(ev, "%s (round %d: %s)", what(roundsText, where), total, rounds[total-1].tally)
}

// roundResult is what one burst of the concurrency check found.
type roundResult struct {
	round      int
	status     Status
	cause      string // of a failure
	summary    string
	duplicated bool   // the burst made more than one resource
	tally      string // the burst's answers
	exchanges  []*Exchange
}

// concurrencyRound sends Concurrency duplicates of a fresh key at once, spread over
// the instances, then the key once more, and judges the answers.
func (e *env) concurrencyRound(ctx context.Context, round int) roundResult {
	n := e.cfg.Concurrency
	key := client.NewKey()
	rs := make([]request, n)
	for i := range rs {
		rs[i] = request{label: fmt.Sprintf("round %d: duplicate %d of %d, sent at once", round, i+1, n), body: e.body, keys: []string{key}, instance: i % len(e.urls)}
	}
	burst := e.burst(ctx, rs)
	after := e.sendUntilFinal(ctx, request{label: fmt.Sprintf("round %d: afterwards, the same key and body again", round), body: e.body, keys: []string{key}, instance: (round - 1) % len(e.urls)})
	return e.judgeDuplicates(ctx, round, fmt.Sprintf("%d requests at once", n), burst, after)
}

// judgeDuplicates judges dups, the answers to requests of one fresh key (what says
// what they were: "16 requests at once"), and after, those of the key sent once more
// afterwards: one resource, the others in flight or its replays (an answer of any
// status that names a resource is a replay of it, or another resource).
func (e *env) judgeDuplicates(ctx context.Context, round int, what string, dups, after []*Exchange) roundResult {
	rr := roundResult{round: round, exchanges: append(slices.Clone(dups), after...)}
	var resources []string // identities of the resources the answers name, distinct, in order
	var wrong []*Exchange  // neither a resource nor in flight
	noRetryAfter, burstOK := 0, 0
	for _, x := range dups {
		switch {
		case x.ok() || namesResource(x):
			if x.ok() {
				burstOK++
			}
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
	last := after[len(after)-1]
	lastFinal := last.ok() || namesResource(last)
	afterNew := lastFinal && !slices.Contains(resources, identity(last))
	tally := tallyAnswers(dups, len(e.urls) > 1)
	rr.tally = tally
	set := func(s Status, format string, args ...any) roundResult {
		rr.status, rr.summary = s, fmt.Sprintf(format, args...)
		return rr
	}
	failed := func(cause, format string, args ...any) roundResult {
		rr.cause = cause
		return set(StatusFail, format, args...)
	}
	// What the request afterwards got says something of this check only where a
	// completed key is replayed at all; where none is, the replay check has said so,
	// and a duplicate that came after the first request completed got what every
	// retry gets there.
	afterJudged := true
	if afterNew || !lastFinal || len(wrong) > 0 {
		afterJudged, _ = e.knowReplays(ctx)
	}
	late := 0
	if !afterJudged {
		wrong = slices.DeleteFunc(wrong, func(x *Exchange) bool {
			if x.describe() == e.noReplay {
				late++
				return true
			}
			return false
		})
	}
	switch {
	case len(resources) > 1:
		rr.duplicated = true
		more := ""
		if afterNew {
			more = ", and the request afterwards made one more"
		}
		return failed("duplicates-ran", "%s made %d resources (%s)%s: the duplicates ran more than once; answers: %s",
			what, len(resources), list(resources, 3), more, tally)
	case len(wrong) > 0:
		return failed("unexpected-answer", "%s got %s: a duplicate gets the one resource (2xx) or an in-flight answer (%s); answers: %s",
			wrong[0].Label, wrong[0].describe(), e.cfg.Profile.inFlightText(), tally)
	case afterNew && len(resources) == 1 && afterJudged:
		return failed("key-forgot-answer", "the %s made one resource (%s), but the same key afterwards made another (%s): the key did not keep its answer; answers: %s",
			what, resources[0], identity(last), tally)
	case len(resources) == 0 && !lastFinal && afterJudged:
		return failed("never-ran", "no request with the key got a 2xx answer (afterwards: %s); answers: %s", last.describe(), tally)
	case len(resources) == 0 && !lastFinal:
		return set(StatusWarn, "none of the %s got a 2xx answer (%s), and afterwards the key got %s, as every retry of a completed key does here (see replay): concurrency was not observed", what, tally, last.describe())
	case burstOK == 0 && len(resources) == 0:
		return set(StatusWarn, "none of the %s ran (%s); the key ran afterwards (%s): concurrency was not observed", what, tally, identity(last))
	case noRetryAfter > 0 && e.cfg.Profile == ProfileSeed:
		return set(StatusWarn, "one resource (%s), but %d in-flight 409s had no Retry-After (§5.2); answers: %s", resources[0], noRetryAfter, tally)
	}
	if afterNew || late > 0 {
		return set(StatusPass, "one resource (%s): %s (the duplicates that came after it completed, and the request afterwards, got what every retry of a completed key gets here: see replay)", resources[0], tally)
	}
	return set(StatusPass, "one resource (%s): %s", resources[0], tally)
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
	x := e.send(ctx, request{label: "the same key with --body-alt", body: e.bodyAlt, keys: []string{e.fixtureKey}})
	ev := []*Exchange{e.fixture, x}
	switch {
	case x.Response == nil:
		return fail(ev, "no-answer", "the changed body got %s", x.describe())
	case carries(e.fixture, x):
		return fail(ev, "changed-body-replayed", "the changed body got the first answer (%d, %s): the change was silently ignored", x.status(), identity(x))
	case x.ok():
		return fail(ev, "changed-body-ran", "the changed body ran under the used key (%d, another resource %s)", x.status(), identity(x))
	case x.Response.Code == idem.CodeRequestInProgress:
		return fail(ev, "in-flight-after-completion", "the changed body got %s, long after the first request completed; want %d", x.describe(), want)
	case x.status() != want && !refusal(x.status()):
		return fail(ev, "not-refused", "the changed body got %s, not a refusal; want %d in profile %s", x.describe(), want, e.cfg.Profile)
	}
	refused := x.describe()
	if x.status() != want {
		refused = fmt.Sprintf("refused, with %s, where profile %s answers %d%s", x.describe(), e.cfg.Profile, want, e.cfg.Profile.otherProfile(x.status()))
	}
	// Whether the refusal kept the record shows only where a completed key is
	// replayed at all.
	if replays, probe := e.knowReplays(ctx); !replays {
		return skip(append(ev, probe...), "%s; whether the refusal kept the key's record cannot be told: %s", refused, e.noReplayReason())
	}
	again := e.sendUntilFinal(ctx, request{label: "then the first body again", body: e.body, keys: []string{e.fixtureKey}})
	ev = append(ev, again...)
	last := again[len(again)-1]
	if !carries(e.fixture, last) {
		return fail(ev, "record-changed", "refused with %s, but then the first body got %s, not its first answer, which a retry got before the refusal: the refusal changed the key's record", x.describe(), last.describe())
	}
	if x.status() != want {
		return warn(ev, "%s; the first body still gets its first answer", refused)
	}
	return pass(ev, "%s; the first body still gets its first answer", x.describe())
}

// refusal reports whether status refuses a request: a 4xx, but 408 and 429, which
// ask for the request again.
func refusal(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
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

// OtherRequestCheck: a used key sent to another method, path or query is never
// answered with the first response.
var OtherRequestCheck = &Check{
	Name: "other-request",
	Doc:  "a used key sent with another method, path or query is refused or runs as a new request, never answered with the first response",
	rule: rules("§4 (the fingerprint covers the method and the path; a used key with another fingerprint is 409 key_reused); the seed (method + path + body); Stripe (a key is compared with the endpoint it was first used on)", "", ""),
	run:  runOtherRequest,
}

// otherRequests are the requests of the other-request check: the fixture's key with
// another method, path and query.
func (e *env) otherRequests() []request {
	method, body := http.MethodDelete, []byte(nil)
	if e.cfg.Method == http.MethodDelete {
		method, body = http.MethodPost, e.body
	}
	u, _ := url.Parse(e.cfg.URL)
	path := *u
	path.Path = strings.TrimSuffix(u.Path, "/") + "/idem-check"
	path.RawPath = ""
	query := *u
	q := u.Query()
	q.Set("idem-check", "other")
	query.RawQuery = q.Encode()
	keys := []string{e.fixtureKey}
	return []request{
		{label: "the used key with another method (" + method + ")", method: method, body: body, keys: keys, variant: "method"},
		{label: "the used key with another path (" + path.Path + ")", body: e.body, keys: keys, url: path.String(), variant: "path"},
		{label: "the used key with another query (idem-check=other added)", body: e.body, keys: keys, url: query.String(), variant: "query"},
	}
}

func runOtherRequest(ctx context.Context, e *env) Result {
	ev := []*Exchange{e.fixture}
	var fails, notes, causes []string
	var decided []*Exchange // the answers the failures name
	for _, r := range e.otherRequests() {
		xs := e.sendUntilFinal(ctx, r)
		ev = append(ev, xs...)
		x := xs[len(xs)-1]
		what := strings.TrimPrefix(r.label, "the used key with ")
		switch {
		case untellable(e.fixture, x):
			notes = append(notes, fmt.Sprintf("%s: %d, the first answer's bytes without an id or a replay marker (whether it ran cannot be told)", what, x.status()))
		case carries(e.fixture, x):
			fails = append(fails, fmt.Sprintf("%s got the first answer (%d, %s)", what, x.status(), identity(x)))
			causes, decided = append(causes, r.variant+"-replayed"), append(decided, x)
		case x.ok() && x.replayed():
			fails = append(fails, fmt.Sprintf("%s got a replay (%d, %s: true)", what, x.status(), HeaderReplayed))
			causes, decided = append(causes, r.variant+"-replayed"), append(decided, x)
		case x.ok():
			notes = append(notes, fmt.Sprintf("%s ran as a new request (%d)", what, x.status()))
		default:
			notes = append(notes, fmt.Sprintf("%s %s", what, x.describe()))
		}
	}
	switch {
	case len(fails) > 0:
		return failMany(append([]*Exchange{e.fixture}, decided...), causes, "%s: the key is not bound to the method, path and query", strings.Join(fails, "; "))
	case slices.ContainsFunc(notes, func(n string) bool { return strings.Contains(n, "cannot be told") }):
		return warn(ev, "%s", strings.Join(notes, "; "))
	}
	if replays, probe := e.knowReplays(ctx); !replays {
		return skip(append(ev, probe...), "never the first answer (%s), which proves nothing: %s", strings.Join(notes, "; "), e.noReplayReason())
	}
	return pass(ev, "never the first answer: %s", strings.Join(notes, "; "))
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
		return fail(ev, "no-answer", "--body-invalid got %s", bad.describe())
	case bad.ok():
		return warn(ev, "--body-invalid was accepted (%d): give a body the endpoint rejects", bad.status())
	case idem.DefaultStorePolicy(bad.status()):
		return skip(ev, "--body-invalid got %s, a final outcome that may be stored (§6): give a body the endpoint rejects with 400 or 422", bad.describe())
	}
	again := e.sendUntilFinal(ctx, request{label: "then --body with the same key", body: e.body, keys: []string{key}})
	ev = append(ev, again...)
	good := again[len(again)-1]
	if good.ok() {
		if replays, probe := e.knowReplays(ctx); !replays {
			return skip(append(ev, probe...), "--body-invalid %s, then --body %d with the same key, which proves nothing: %s", bad.describe(), good.status(), e.noReplayReason())
		}
		return pass(ev, "--body-invalid %s, then --body %d with the same key", bad.describe(), good.status())
	}
	switch {
	case good.Response != nil && good.status() == bad.status() && bytes.Equal(good.Response.raw, bad.Response.raw):
		return fail(ev, "rejection-replayed", "the key replays its rejection (%s) to a valid body: the rejected request was stored", bad.describe())
	case good.Response != nil && good.status() != bad.status() && (reuseAnswer(good) || good.status() == e.cfg.Profile.keyReusedStatus()):
		return fail(ev, "key-bound-to-rejection", "--body-invalid got %s, then --body got %s with the same key: the key stays bound to the rejected body", bad.describe(), good.describe())
	}
	return fail(ev, "valid-body-refused", "--body-invalid got %s, then --body got %s with the same key; want 2xx", bad.describe(), good.describe())
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
	x := e.send(ctx, request{label: "another principal (--as-other): the same key and body", body: e.body, keys: []string{e.fixtureKey}, other: true})
	ev := []*Exchange{e.fixture, x}
	s := x.status()
	switch {
	case x.Response == nil:
		return fail(ev, "no-answer", "the other principal's request got %s", x.describe())
	case untellable(e.fixture, x):
		// An empty body, or one without an id, is the same for every execution.
		return warn(ev, "the other principal's answer is the first principal's, byte for byte, without an id or a replay marker: whether it ran cannot be told")
	case leaks(e.fixture, x) && x.ok():
		return fail(ev, "shared-across-principals", "the other principal got the first principal's response (%s): keys are not scoped per principal", identity(e.fixture))
	case leaks(e.fixture, x):
		// A refusal that carries the first principal's response leaks it all the same.
		return fail(ev, "shared-across-principals", "the other principal got the first principal's response (%s) in its %d answer: keys are not scoped per principal", identity(e.fixture), x.status())
	case x.ok() && x.replayed():
		return fail(ev, "replay-to-other-principal", "the other principal's first use of the key got a replay (%s: true)", HeaderReplayed)
	case x.ok():
		if replays, probe := e.knowReplays(ctx); !replays {
			return skip(append(ev, probe...), "the other principal's request ran (%d, %s), which proves nothing: %s", s, identity(x), e.noReplayReason())
		}
		return pass(ev, "the other principal's request ran as its own (%d, %s)", s, identity(x))
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return warn(ev, "the other principal was refused (%s): do the --as-other headers authenticate?", x.describe())
	case s >= 400 && s < 500:
		return warn(ev, "the other principal's first use of the key was refused (%s): keys are shared across principals (nothing leaked)", x.describe())
	}
	return fail(ev, "server-error", "the other principal's request got %s", x.describe())
}

// SafeMethodsCheck: GET ignores the key.
var SafeMethodsCheck = &Check{
	Name: "safe-methods",
	Doc:  "a GET of the URL with a key is answered as one without: the key is ignored, nothing is replayed, and after a write the keyed GET sees it as the unkeyed one does (no cache)",
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
			return fail([]*Exchange{plain, x}, "get-differs", "%s got %s, without a key %s: a GET must ignore the key", x.Label, x.describe(), plain.describe())
		case x.replayed():
			return fail(ev, "get-replayed", "%s was answered as a replay (%s: true)", x.Label, HeaderReplayed)
		}
	}
	write := e.send(ctx, request{label: "a write: --body with a fresh key", body: e.body, keys: []string{client.NewKey()}})
	ev = append(ev, write)
	plain2 := e.send(ctx, request{label: "after the write: GET without a key", method: http.MethodGet})
	keyed2 := e.send(ctx, request{label: "after the write: GET with the first GET's key", method: http.MethodGet, keys: []string{key}})
	ev = append(ev, plain2, keyed2)
	switch {
	case plain2.Response == nil || keyed2.Response == nil:
		return fail(ev, "no-answer", "after the write, a GET got %s", cmp.Or(plain2.Error, keyed2.Error))
	case !bytes.Equal(plain2.Response.raw, plain.Response.raw) && bytes.Equal(keyed2.Response.raw, keyed.Response.raw):
		return fail(ev, "get-cached", "after a write the GET with a used key got its first body again (%d, %d bytes) where the GET without a key got another (%d, %d bytes): keyed GETs are answered from a cache",
			keyed2.status(), len(keyed2.Response.raw), plain2.status(), len(plain2.Response.raw))
	case keyed2.status() != plain2.status():
		return fail([]*Exchange{plain2, keyed2}, "get-differs", "after the write, the GET with a used key got %s, without a key %s", keyed2.describe(), plain2.describe())
	case bytes.Equal(plain2.Response.raw, plain.Response.raw):
		return pass(ev, "GET %d with and without a key (the write did not change the GET's body, so a cache could not be told)", plain.status())
	}
	return pass(ev, "GET %d with and without a key, and a keyed GET sees a write", plain.status())
}

// tallyAnswers counts answers by what they were, in the order of their statuses:
// "1 × 201, 15 × 409 request_in_progress", replays apart; byInstance gives one tally
// per instance, in the instances' order ("instance 1: 1 × 201, 7 × 409; instance 2:
// 8 × 409").
func tallyAnswers(xs []*Exchange, byInstance bool) string {
	if !byInstance {
		return tally(xs)
	}
	var instances []int
	by := map[int][]*Exchange{}
	for _, x := range xs {
		if by[x.Instance] == nil {
			instances = append(instances, x.Instance)
		}
		by[x.Instance] = append(by[x.Instance], x)
	}
	slices.Sort(instances)
	parts := make([]string, len(instances))
	for i, n := range instances {
		parts[i] = fmt.Sprintf("instance %d: %s", n, tally(by[n]))
	}
	return strings.Join(parts, "; ")
}

// tally counts answers by what they were, in the order of their descriptions.
func tally(xs []*Exchange) string {
	var order []string
	count := map[string]int{}
	for _, x := range xs {
		d := x.describe()
		if !x.ok() && namesResource(x) {
			d = fmt.Sprintf("%d (%s)", x.status(), identity(x)) // a resource's answer
		}
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

// diffAt describes where two bodies first differ: with IncludeBodies a few bytes
// around, else their lengths and hashes.
func (e *env) diffAt(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	if !e.cfg.IncludeBodies {
		return fmt.Sprintf("from byte %d (%d bytes sha256:%s, then %d bytes sha256:%s; --include-bodies shows them)", i, len(a), bodyHash(a), len(b), bodyHash(b))
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

// fail is a failure for one cause, a short stable word naming it (see
// [Result.Causes]).
func fail(ev []*Exchange, cause, format string, args ...any) Result {
	return failMany(ev, []string{cause}, format, args...)
}

// failMany is a failure for several causes.
func failMany(ev []*Exchange, causes []string, format string, args ...any) Result {
	r := result(StatusFail, ev, format, args...)
	r.Causes = causes
	return r
}

func skip(ev []*Exchange, format string, args ...any) Result {
	return result(StatusSkip, ev, format, args...)
}
