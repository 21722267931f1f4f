package check

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/client"
)

// Status is the verdict of one check.
type Status string

// The verdicts. Only StatusFail makes `idem check` exit 1.
const (
	// StatusPass: the endpoint behaved as the rule says.
	StatusPass Status = "pass"
	// StatusWarn: no rule was broken in a way that loses or leaks a result, but the
	// endpoint did something a client should know of (keys are optional, a 409
	// without Retry-After, keys shared across principals).
	StatusWarn Status = "warn"
	// StatusFail: the endpoint broke the rule; the evidence shows how.
	StatusFail Status = "fail"
	// StatusSkip: the check could not be made (GET is not served at the URL, no
	// second principal was given); the summary says why.
	StatusSkip Status = "skip"
)

// Profile says which answers count as right where the rules differ (SPEC §9).
type Profile string

// The profiles.
const (
	// ProfileSeed is idem's default and the design note's: a changed body is 409
	// key_reused, a duplicate in flight 409 request_in_progress with Retry-After.
	ProfileSeed Profile = "seed"
	// ProfileIETF is draft-ietf-httpapi-idempotency-key-header: a changed body is
	// 422, a duplicate in flight 409.
	ProfileIETF Profile = "ietf"
	// ProfileStripe is Stripe's API: a changed body is 400 idempotency_error, a
	// duplicate in flight 409 (or 429).
	ProfileStripe Profile = "stripe"
)

// Draft is the version of the IETF draft whose sections the rules cite.
const Draft = "draft-ietf-httpapi-idempotency-key-header-07"

// ParseProfile parses "seed", "ietf" or "stripe".
func ParseProfile(s string) (Profile, error) {
	switch p := Profile(s); p {
	case ProfileSeed, ProfileIETF, ProfileStripe:
		return p, nil
	}
	return "", fmt.Errorf("unknown profile %q: want seed, ietf or stripe", s)
}

// keyReusedStatus is the status of an answer to a used key with another body.
func (p Profile) keyReusedStatus() int {
	switch p {
	case ProfileIETF:
		return idem.ProfileIETF.Status(idem.CodeKeyReused)
	case ProfileStripe:
		return http.StatusBadRequest
	}
	return idem.ProfileSeed.Status(idem.CodeKeyReused)
}

// inFlight reports whether status answers a duplicate whose first request is still
// running, in profile p: 409 in every profile, 429 too, and 503 but in Stripe's.
func (p Profile) inFlight(status int) bool {
	switch status {
	case http.StatusConflict, http.StatusTooManyRequests:
		return true
	case http.StatusServiceUnavailable:
		return p != ProfileStripe
	}
	return false
}

// Defaults of [Config].
const (
	// DefaultConcurrency is how many duplicates the concurrency check sends at once.
	DefaultConcurrency = 16
	// DefaultRounds is how many bursts the concurrency check sends.
	DefaultRounds = 3
	// DefaultTimeout bounds one request.
	DefaultTimeout = 10 * time.Second
	// DefaultMethod is the method of the endpoint.
	DefaultMethod = http.MethodPost
	// DefaultPollInterval is the first wait before a key in flight is asked again
	// when its answer has no Retry-After; each wait doubles, up to DefaultPollMax.
	DefaultPollInterval = 100 * time.Millisecond
	// DefaultPollMax bounds the wait between two requests of a key in flight, with or
	// without Retry-After.
	DefaultPollMax = 2 * time.Second
	// minPoll is the shortest wait, whatever Retry-After says.
	minPoll = 50 * time.Millisecond
)

// Config says what to check and how.
type Config struct {
	// URL is the endpoint (required): http:// or https://.
	URL string
	// Instances are more URLs of the same endpoint (replicas behind no balancer,
	// another port): the bursts and the retries are spread across URL and them, and
	// every exchange says which one answered.
	Instances []string
	// Method is the endpoint's method. Defaults to [DefaultMethod].
	Method string
	// Header is sent with every request (authentication, Content-Type). A body
	// without a Content-Type header is sent as application/json when it is JSON,
	// else as application/x-www-form-urlencoded.
	Header http.Header
	// Other, when not empty, is a second principal's headers: they replace those of
	// Header with the same names in the per-principal check's request. Without it
	// that check is skipped.
	Other http.Header
	// Body is a body the endpoint accepts (2xx) (required).
	Body []byte
	// BodyAlt is a second valid body, for the changed-body check. Defaults to Body
	// with one number changed ([AltBody]).
	BodyAlt []byte
	// FixedBodies sends Body and BodyAlt as they are. By default each run draws their
	// first numbers afresh ([FreshBody]), so that no earlier run on the same server
	// sent them and a run's verdicts do not depend on the runs before it (a record of
	// a request without a real key, kept by the server, would answer the next run's).
	// Defaults to false.
	FixedBodies bool
	// BodyInvalid is a body the endpoint rejects, for the errors-not-stored check.
	// Nil defaults to {} when Body is a JSON object; otherwise that check is skipped.
	BodyInvalid []byte
	// Body5xx is a body the endpoint fails on with a 5xx, for the after-5xx check.
	// Nil defaults to BodyInvalid, which some endpoints fail on; when neither gets a
	// 5xx, that check is skipped.
	Body5xx []byte
	// PatchBody is a body that a PATCH of the first request's resource (its Location,
	// or URL/id) accepts, for the patch check. Nil defaults to the run's BodyAlt.
	PatchBody []byte
	// KeyHeader is the name of the key's header. Defaults to [client.HeaderKey],
	// Idempotency-Key.
	KeyHeader string
	// Concurrency is how many duplicates of one key the concurrency check sends at
	// once; at least 2. Defaults to [DefaultConcurrency].
	Concurrency int
	// Rounds is how many bursts of duplicates the concurrency check sends, each with
	// a fresh key; at least 1. Defaults to [DefaultRounds].
	Rounds int
	// Between is a shell command (sh -c) that the restart check runs once its first
	// request is written and before its retry: a restart or a kill of the server.
	// Empty skips that check.
	Between string
	// Profile says which answers count as right. Defaults to [ProfileSeed].
	Profile Profile
	// Timeout bounds each request, and the retries of a key in flight; the restart
	// check waits that long for a final answer after Between, so it must exceed the
	// server's lease (past it, that check goes on asking for up to three times as
	// long, only to tell a longer lease from a stuck key). Defaults to
	// [DefaultTimeout].
	Timeout time.Duration
	// PollInterval is the first wait before a key in flight is asked again when its
	// answer carries no Retry-After; each further wait doubles, up to PollMax.
	// Defaults to [DefaultPollInterval].
	PollInterval time.Duration
	// PollMax bounds every wait between two requests of a key in flight: the doubled
	// waits, and Retry-After (which is honoured from 50 ms up to PollMax). Defaults to
	// [DefaultPollMax].
	PollMax time.Duration
	// IncludeBodies puts the request and response bodies (cut at 4 KiB) in the
	// reports. Without it a body is shown by its length and a hash, and a 2xx answer
	// by the resource it names: bodies may carry customers' data. Defaults to false.
	IncludeBodies bool
	// Client sends the requests. Defaults to a client that keeps Concurrency
	// connections, follows no redirect and asks for no compression, with Timeout.
	Client *http.Client
	// Checks are the checks to run, in order. Defaults to [Checks].
	Checks []*Check
}

// setDefaults fills in the defaults and checks the configuration; errors name the
// field.
func (c *Config) setDefaults() error {
	if c.URL == "" {
		return errors.New("URL is required")
	}
	for i, raw := range append([]string{c.URL}, c.Instances...) {
		field := "URL"
		if i > 0 {
			field = fmt.Sprintf("Instances[%d]", i-1)
		}
		u, err := url.Parse(raw)
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", field, err)
		case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
			return fmt.Errorf("%s %q: want http://host/path or https://host/path", field, redactURL(raw))
		}
	}
	if c.Body == nil {
		return errors.New("Body is required: a body the endpoint accepts")
	}
	if c.Method == "" {
		c.Method = DefaultMethod
	}
	c.Method = strings.ToUpper(c.Method)
	if safeMethod(c.Method) {
		return fmt.Errorf("Method %s is safe: keys make unsafe methods (POST, PATCH, PUT, DELETE) safe to retry", c.Method)
	}
	if c.KeyHeader == "" {
		c.KeyHeader = client.HeaderKey
	}
	c.KeyHeader = http.CanonicalHeaderKey(c.KeyHeader)
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 2 {
		return fmt.Errorf("Concurrency must be at least 2 (duplicates), got %d", c.Concurrency)
	}
	if c.Rounds == 0 {
		c.Rounds = DefaultRounds
	}
	if c.Rounds < 1 {
		return fmt.Errorf("Rounds must be at least 1, got %d", c.Rounds)
	}
	if c.Profile == "" {
		c.Profile = ProfileSeed
	}
	if _, err := ParseProfile(string(c.Profile)); err != nil {
		return err
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.PollInterval <= 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.PollMax <= 0 {
		c.PollMax = DefaultPollMax
	}
	if c.PollMax < c.PollInterval {
		return fmt.Errorf("PollMax (%v) is shorter than PollInterval (%v)", c.PollMax, c.PollInterval)
	}
	if c.Header == nil {
		c.Header = http.Header{}
	}
	if c.BodyAlt == nil {
		alt, err := AltBody(c.Body)
		if err != nil {
			return fmt.Errorf("BodyAlt: %w", err)
		}
		c.BodyAlt = alt
	}
	if c.BodyInvalid == nil && jsonObject(c.Body) {
		c.BodyInvalid = []byte("{}")
	}
	if c.Client == nil {
		c.Client = newClient(c.Concurrency, c.Timeout)
	}
	if c.Checks == nil {
		c.Checks = Checks()
	}
	return nil
}

// safeMethod reports whether RFC 9110 calls method safe.
func safeMethod(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// newClient returns the checker's client: concurrency+2 connections kept per host,
// no redirect followed (a 303 to a POST would become a GET), no compression asked
// for (the bodies compared are the bytes the server sent), the environment's proxy.
func newClient(concurrency int, timeout time.Duration) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = concurrency + 2
	t.DisableCompression = true
	return &http.Client{
		Transport:     t,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Check is one conformance check, as go vet's analyzers are: a name, a doc line, its
// rule and a run function.
type Check struct {
	// Name is a short kebab-case name, such as "replay".
	Name string
	// Doc says in one line what the check expects.
	Doc string
	// rule is where the expectation comes from, per profile.
	rule func(Profile) string
	// run sends the check's requests and judges the answers.
	run func(ctx context.Context, e *env) Result
}

// Rule says where the check's expectation comes from in profile p.
func (c *Check) Rule(p Profile) string { return c.rule(p) }

// Result is what one check found.
type Result struct {
	// Status is the verdict.
	Status Status `json:"status"`
	// Summary says in one line what decided it.
	Summary string `json:"summary"`
	// Causes name what made a check fail, each a short stable word such as
	// "ran-twice" or "empty-key-shared-across-bodies": a baseline accepts a failure
	// whose causes it already holds. Empty unless Status is fail.
	Causes []string `json:"causes,omitempty"`
	// Created is how many resources were first named by the check's answers: distinct
	// ids or Locations, not 2xx answers (the fixture that several checks share is
	// counted by the report, not here).
	Created int `json:"created"`
	// Evidence are the requests and answers that decided it, in order.
	Evidence []*Exchange `json:"evidence"`
}

// ErrUnusable is the error of [Run] when the endpoint cannot be checked: it cannot be
// reached, or it does not accept Body with Header.
var ErrUnusable = errors.New("endpoint cannot be checked")

// Run checks the endpoint of cfg and returns the report. It first sends Body with a
// fresh key, the first request of the checks that need a completed key; when that
// request gets no answer, or an answer other than 2xx, it returns an error wrapping
// [ErrUnusable] (and no report): the endpoint cannot be reached, or cfg is wrong. A
// bad cfg is an error too. The checks run one after another; ctx bounds them all.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	altGiven := cfg.BodyAlt != nil
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	e := &env{cfg: &cfg, urls: append([]string{cfg.URL}, cfg.Instances...), body: cfg.Body, bodyAlt: cfg.BodyAlt}
	if !cfg.FixedBodies {
		e.body, e.bodyAlt = runBodies(cfg.Body, cfg.BodyAlt, altGiven)
	}
	if err := e.prepare(ctx); err != nil {
		return nil, err
	}
	rep := &Report{
		URL: redactURL(cfg.URL), Method: cfg.Method, KeyHeader: cfg.KeyHeader, Profile: cfg.Profile,
		Draft: Draft, Concurrency: cfg.Concurrency, Rounds: cfg.Rounds, Started: start.UTC(),
		Polling:       cfg.polling(),
		IncludeBodies: cfg.IncludeBodies,
	}
	for _, u := range cfg.Instances {
		rep.Instances = append(rep.Instances, redactURL(u))
	}
	for _, c := range cfg.Checks {
		before, _ := e.counts()
		began := time.Now()
		// Whether a completed key replays is known before any other check runs, as it
		// is in a full run, where the replay check runs first: a check run alone
		// (--only) gets the verdict it gets in a full run, and the restart check knows
		// it before its command restarts the server.
		var probe []*Exchange
		if c.Name != ReplayCheck.Name && !e.replayKnown {
			_, probe = e.knowReplays(ctx)
		}
		var r Result
		if e.naive != "" {
			r = skip(probe, "not run: the endpoint ran a retry again as a new request (see the hint)")
		} else {
			r = c.run(ctx, e)
			if r.Status != StatusFail {
				r.Evidence = append(r.Evidence, probe...)
			}
		}
		after, _ := e.counts()
		r.Created = after - before
		rep.Checks = append(rep.Checks, CheckReport{Name: c.Name, Doc: c.Doc, Rule: c.Rule(cfg.Profile), Result: r, Duration: Millis(time.Since(began))})
	}
	rep.Hint = e.naive
	rep.Requests = int(e.requests.Load())
	rep.Created, rep.Unidentified = e.counts()
	rep.Duration = Millis(time.Since(start))
	rep.count()
	return rep, nil
}

// runBodies returns a run's Body and BodyAlt (see [Config.FixedBodies]): body with
// its first number drawn afresh, and alt so too when it was given, else the fresh
// body with its first number changed ([AltBody]). The two always differ.
func runBodies(body, alt []byte, altGiven bool) (b, a []byte) {
	b = FreshBody(body)
	if !altGiven {
		if a, err := AltBody(b); err == nil {
			return b, a
		}
		return b, alt
	}
	for range 8 {
		if a = FreshBody(alt); !bytes.Equal(a, b) {
			return b, a
		}
	}
	return b, alt
}

// polling says how a key in flight is asked again, for the report.
func (c *Config) polling() string {
	return fmt.Sprintf("after Retry-After (%v to %v), or without it after %v doubling to %v; at most --timeout (%v)",
		minPoll, c.PollMax, c.PollInterval, c.PollMax, c.Timeout)
}
