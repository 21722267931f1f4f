package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// Results of a verification.
const (
	// ExactlyOnceOK: every logical request has its final answer and the server's
	// objects match them one to one.
	ExactlyOnceOK = "ok"
	// ExactlyOnceFail: at least one discrepancy.
	ExactlyOnceFail = "fail"
	// ExactlyOnceUnresolved: no discrepancy, but some logical requests got no final
	// answer before the retry deadline, so their outcome is unknown.
	ExactlyOnceUnresolved = "unresolved"
	// ExactlyOnceUnchecked: the run sent no keys; only counts are reported.
	ExactlyOnceUnchecked = "unchecked"
)

// Verification is what [Verify] found.
type Verification struct {
	// Result is one of ExactlyOnceOK, ExactlyOnceFail, ExactlyOnceUnresolved and
	// ExactlyOnceUnchecked.
	Result string `json:"exactly_once"`
	// Logical is the number of logical requests (distinct keys) the run sent.
	Logical int `json:"logical_requests"`
	// Created is how many of them were answered 2xx (a charge or an order).
	Created int `json:"created"`
	// OtherFinal counts the logical requests whose final answer was not 2xx, by
	// status and code.
	OtherFinal map[string]int `json:"other_final,omitempty"`
	// Unresolved is how many logical requests got no final answer.
	Unresolved int `json:"unresolved"`
	// Retries is how many requests the resolution sent.
	Retries int `json:"retries"`
	// Objects is how many charges were listed (or orders read).
	Objects int `json:"objects"`
	// Discrepancies describe each violation of exactly-once, one line each.
	Discrepancies []string `json:"discrepancies,omitempty"`
	// Note explains the limits of the check.
	Note string `json:"note,omitempty"`
}

// Line is the verdict as `idem load` prints it: "exactly-once: ok", or
// "exactly-once: FAIL: <the first discrepancy>" and how many more there are.
func (v *Verification) Line() string {
	switch v.Result {
	case ExactlyOnceFail:
		s := "exactly-once: FAIL: " + v.Discrepancies[0]
		if n := len(v.Discrepancies) - 1; n > 0 {
			s += fmt.Sprintf(" (and %d more)", n)
		}
		return s
	case ExactlyOnceUnresolved:
		return fmt.Sprintf("exactly-once: UNRESOLVED: %d of %d logical requests got no final answer; the others match", v.Unresolved, v.Logical)
	case ExactlyOnceUnchecked:
		return "exactly-once: not checked: " + v.Note
	}
	return "exactly-once: ok"
}

// Verify resolves the logical requests of res that have no final answer (same key and
// body, retried on connection errors, 409 request_in_progress honouring Retry-After,
// 429 and 5xx, until res.Config.RetryDeadline), then lists the server's objects and
// matches them against the answers ([Match]). For charges, which can be listed, it
// lists them again res.Config.Settle later and reports every charge that appeared in
// between ([Late]). It stores the verification in res.Summary.Verification too. An
// error means the server's objects could not be read.
//
// The promises it checks, each of which a test breaks with a fake server:
//   - every final answer of a key agrees with its first (status, error code and
//     object id): a replay answers what the first answer did;
//   - a key has at most one object, whether or not it got a final answer;
//   - a key answered 2xx has the object it was answered, and a key answered with an
//     error has none;
//   - every charge belongs to a key this run sent (charges only: orders cannot be
//     listed);
//   - no charge appears after the first listing (charges only).
func Verify(ctx context.Context, res *Result) (*Verification, error) {
	cfg := &res.Config
	v := &Verification{Logical: len(res.ops), OtherFinal: map[string]int{}}
	if !cfg.NoKey {
		v.Retries = resolve(ctx, cfg, res.ops)
	}
	outcomes := make([]Outcome, len(res.ops))
	for i, o := range res.ops {
		outcomes[i] = o.outcome()
		switch oc := outcomes[i]; {
		case oc.Final == 0:
			v.Unresolved++
		case oc.Final >= 200 && oc.Final < 300:
			v.Created++
		default:
			v.OtherFinal[strings.TrimSpace(fmt.Sprintf("%d %s", oc.Final, oc.Code))]++
		}
	}
	var objects []Object
	var err error
	listed := cfg.Endpoint != EndpointOrders
	if listed {
		objects, err = listCharges(ctx, cfg)
	} else {
		objects, err = readOrders(ctx, cfg, outcomes)
	}
	if err != nil {
		return nil, err
	}
	if cfg.UnkeyedAPI {
		objects = keysFromAnswers(objects, outcomes)
	}
	v.Objects = len(objects)
	switch {
	case cfg.NoKey:
		v.Result = ExactlyOnceUnchecked
		v.Note = fmt.Sprintf("exactly-once cannot be checked without keys; %d requests answered 2xx, %d %s found", v.Created, v.Objects, objectNoun(cfg))
	default:
		v.Discrepancies = Match(outcomes, objects, listed, objectNoun(cfg))
		if listed {
			sleep(ctx, cfg.Settle)
			again, err := listCharges(ctx, cfg)
			if err != nil {
				return nil, err
			}
			if cfg.UnkeyedAPI {
				again = keysFromAnswers(again, outcomes)
			}
			v.Discrepancies = appendNew(v.Discrepancies, Late(objects, again, objectNoun(cfg)))
			v.Discrepancies = appendNew(v.Discrepancies, Match(outcomes, again, listed, objectNoun(cfg)))
		}
		switch {
		case len(v.Discrepancies) > 0:
			v.Result = ExactlyOnceFail
		case v.Unresolved > 0:
			v.Result = ExactlyOnceUnresolved
		default:
			v.Result = ExactlyOnceOK
		}
		if !listed {
			v.Note = "orders cannot be listed: each 201'd order was read with GET /v1/orders/{id}; an order without a 201'd key would go unseen"
		}
	}
	res.Summary.Verification = v
	return v, nil
}

func objectNoun(cfg *Config) string {
	if cfg.Endpoint == EndpointOrders {
		return "orders"
	}
	return "charges"
}

// Outcome is what the client learnt about one logical request.
type Outcome struct {
	// Key is its idempotency key.
	Key string
	// Final is the status of its first final answer, 0 when it has none.
	Final int
	// Code is the error code of that answer, if any.
	Code string
	// ID is the object id that answer carried (2xx answers).
	ID string
	// IDs are the distinct object ids its 2xx answers carried, in order.
	IDs []string
	// Later counts the final answers that contradict the first: another status, error
	// code or object id.
	Later map[Reply]int
}

// Reply is one final answer as the verifier compares them.
type Reply struct {
	// Status is the HTTP status.
	Status int
	// Code is the error code of an error answer.
	Code string
	// ID is the object id of a 2xx answer.
	ID string
}

// String renders r as "201 (ch_1)", "201 without an id" or "409 key_reused".
func (r Reply) String() string {
	switch {
	case ok2xx(r.Status) && r.ID != "":
		return fmt.Sprintf("%d (%s)", r.Status, r.ID)
	case ok2xx(r.Status):
		return fmt.Sprintf("%d without an id", r.Status)
	}
	return strings.TrimSpace(fmt.Sprintf("%d %s", r.Status, r.Code))
}

func (o *op) outcome() Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	return Outcome{Key: o.key, Final: o.first.Status, Code: o.first.Code, ID: o.first.ID,
		IDs: slices.Clone(o.ids), Later: maps.Clone(o.later)}
}

// first returns the outcome's first final answer.
func (oc *Outcome) first() Reply { return Reply{Status: oc.Final, Code: oc.Code, ID: oc.ID} }

// Object is a charge or an order the server has, with the key that created it ("" when
// none).
type Object struct {
	ID  string
	Key string
}

// keysFromAnswers gives each object without a key the key of the logical request
// whose 2xx answers named it (Config.UnkeyedAPI); an object that no answer named keeps
// none.
func keysFromAnswers(objects []Object, outcomes []Outcome) []Object {
	byID := map[string]string{}
	for _, oc := range outcomes {
		for _, id := range oc.IDs {
			byID[id] = oc.Key
		}
	}
	out := slices.Clone(objects)
	for i, ob := range out {
		if ob.Key == "" {
			out[i].Key = byID[ob.ID]
		}
	}
	return out
}

// Match compares the outcomes of keyed logical requests with the objects the server
// has (noun names them: "charges" or "orders"), and returns one line per discrepancy,
// in a stable order:
//   - a final answer of a key contradicts its first (status, code or object id);
//   - a key answered 2xx without an object id;
//   - a key has more than one object, resolved or not;
//   - a key answered 2xx has no object, or an object other than the one answered;
//   - a key answered with an error has an object;
//   - (when listed, i.e. objects are all the principal's) an object without a key, or
//     of a key this run never sent.
//
// A key without a final answer and with one object is no discrepancy: its fate is
// unknown, and Verify reports it as unresolved.
func Match(outcomes []Outcome, objects []Object, listed bool, noun string) []string {
	var out []string
	one := strings.TrimSuffix(noun, "s")
	byKey := map[string][]string{}
	for _, ob := range objects {
		byKey[ob.Key] = append(byKey[ob.Key], ob.ID)
	}
	known := map[string]bool{}
	for _, oc := range outcomes {
		known[oc.Key] = true
	}
	sorted := slices.Clone(outcomes)
	slices.SortFunc(sorted, func(a, b Outcome) int { return strings.Compare(a.Key, b.Key) })
	for _, oc := range sorted {
		first := oc.first()
		for _, r := range slices.SortedFunc(maps.Keys(oc.Later), compareReplies) {
			out = append(out, fmt.Sprintf("key %s: first answered %s, later %s (%s)", oc.Key, first, r, times(oc.Later[r])))
		}
		if ok2xx(oc.Final) && oc.ID == "" {
			out = append(out, fmt.Sprintf("key %s: answered %s", oc.Key, first))
		}
		got := byKey[oc.Key]
		switch {
		case len(got) > 1 && oc.Final == 0:
			out = append(out, fmt.Sprintf("key %s, without a final answer, has %d %s (%s)", oc.Key, len(got), noun, strings.Join(got, ", ")))
		case len(got) > 1:
			out = append(out, fmt.Sprintf("key %s has %d %s (%s)", oc.Key, len(got), noun, strings.Join(got, ", ")))
		case oc.Final == 0:
			// Unresolved: its object may or may not exist.
		case ok2xx(oc.Final) && len(got) == 0:
			out = append(out, fmt.Sprintf("key %s got %s but has no %s", oc.Key, first, one))
		case ok2xx(oc.Final) && oc.ID != "" && got[0] != oc.ID:
			out = append(out, fmt.Sprintf("key %s got %s but its %s is %s", oc.Key, oc.ID, one, got[0]))
		case !ok2xx(oc.Final) && len(got) == 1:
			out = append(out, fmt.Sprintf("key %s was answered %s but has 1 %s (%s)", oc.Key, first, one, got[0]))
		}
	}
	if !listed {
		return out
	}
	for _, k := range slices.Sorted(maps.Keys(byKey)) {
		switch {
		case k == "":
			out = append(out, fmt.Sprintf("%s without an idempotency key (%s)", quantity(len(byKey[k]), noun), strings.Join(byKey[k], ", ")))
		case !known[k]:
			out = append(out, fmt.Sprintf("key %s, never sent by this run, has %s (%s)", k, quantity(len(byKey[k]), noun), strings.Join(byKey[k], ", ")))
		}
	}
	return out
}

// Late returns one line per object in after that before did not have: an object
// made after the first listing, by an execution that ended after every logical
// request had its answer.
func Late(before, after []Object, noun string) []string {
	seen := map[string]bool{}
	for _, ob := range before {
		seen[ob.ID] = true
	}
	var out []string
	for _, ob := range after {
		if seen[ob.ID] {
			continue
		}
		key := "no key"
		if ob.Key != "" {
			key = "key " + ob.Key
		}
		out = append(out, fmt.Sprintf("%s %s (%s) appeared after the first listing", strings.TrimSuffix(noun, "s"), ob.ID, key))
	}
	return out
}

// appendNew appends the lines of add that dst does not hold yet.
func appendNew(dst, add []string) []string {
	have := make(map[string]bool, len(dst))
	for _, l := range dst {
		have[l] = true
	}
	for _, l := range add {
		if !have[l] {
			have[l] = true
			dst = append(dst, l)
		}
	}
	return dst
}

func compareReplies(a, b Reply) int {
	if a.Status != b.Status {
		return a.Status - b.Status
	}
	if c := strings.Compare(a.Code, b.Code); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// times renders "1 time" or "20 times".
func times(n int) string {
	if n == 1 {
		return "1 time"
	}
	return fmt.Sprintf("%d times", n)
}

// quantity renders "1 charge" or "2 charges".
func quantity(n int, noun string) string {
	if n == 1 {
		return "1 " + strings.TrimSuffix(noun, "s")
	}
	return fmt.Sprintf("%d %s", n, noun)
}

// resolve retries, concurrently, each logical request without a final answer until it
// has one or the retry deadline passes, and returns how many requests it sent.
func resolve(ctx context.Context, cfg *Config, ops []*op) int {
	var pending []*op
	for _, o := range ops {
		if !o.resolved() {
			pending = append(pending, o)
		}
	}
	if len(pending) == 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.RetryDeadline)
	defer cancel()
	r := &runner{cfg: *cfg}
	endpoint := cfg.Endpoint
	if endpoint == EndpointReplay || endpoint == EndpointGet {
		endpoint = EndpointCharges
	}
	work := make(chan *op)
	var mu sync.Mutex
	sent := 0
	var wg sync.WaitGroup
	for range min(cfg.Concurrency, len(pending)) {
		wg.Go(func() {
			for o := range work {
				n := resolveOne(ctx, r, endpoint, o)
				mu.Lock()
				sent += n
				mu.Unlock()
			}
		})
	}
	for _, o := range pending {
		work <- o
	}
	close(work)
	wg.Wait()
	return sent
}

func resolveOne(ctx context.Context, r *runner, endpoint Endpoint, o *op) int {
	n := 0
	if o.resolved() {
		return 0
	}
	o.mu.Lock()
	wait := o.lastRA
	o.mu.Unlock()
	for attempt := 1; ctx.Err() == nil; attempt++ {
		if wait > 0 {
			sleep(ctx, wait)
			if ctx.Err() != nil {
				break
			}
		}
		a := r.send(ctx, endpoint, o)
		if a.status == 0 && ctx.Err() != nil {
			break
		}
		n++
		o.record(a)
		if a.final() {
			break
		}
		wait = backoff(a, attempt)
	}
	return n
}

// backoff is the wait before retry attempt+1: Retry-After when the server sent one
// (capped at 5 s), else exponential from 50 ms to 1 s with full jitter.
func backoff(a answer, attempt int) time.Duration {
	if a.retryAfter > 0 {
		return min(a.retryAfter, 5*time.Second)
	}
	d := 50 * time.Millisecond << min(attempt, 5)
	return jitter(min(d, time.Second))
}

type chargeList struct {
	Data []struct {
		ID             string  `json:"id"`
		IdempotencyKey *string `json:"idempotency_key"`
	} `json:"data"`
	HasMore bool `json:"has_more"`
}

// listCharges reads every charge of the run's principal, 1000 at a time.
func listCharges(ctx context.Context, cfg *Config) ([]Object, error) {
	var out []Object
	after := ""
	for {
		u := cfg.URL + "/v1/charges?limit=1000"
		if after != "" {
			u += "&starting_after=" + url.QueryEscape(after)
		}
		var page chargeList
		if err := getJSON(ctx, cfg, u, &page); err != nil {
			return nil, fmt.Errorf("listing charges: %w", err)
		}
		for _, c := range page.Data {
			ob := Object{ID: c.ID}
			if c.IdempotencyKey != nil {
				ob.Key = *c.IdempotencyKey
			}
			out = append(out, ob)
		}
		if !page.HasMore || len(page.Data) == 0 {
			return out, nil
		}
		after = page.Data[len(page.Data)-1].ID
	}
}

// readOrders reads, with GET /v1/orders/{id}, every order a 2xx answer named: the API
// cannot list orders. An order that is gone is left out.
func readOrders(ctx context.Context, cfg *Config, outcomes []Outcome) ([]Object, error) {
	var ids []string
	for _, oc := range outcomes {
		ids = append(ids, oc.IDs...)
	}
	objects := make([]Object, len(ids))
	found := make([]bool, len(ids))
	work := make(chan int)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range min(cfg.Concurrency, max(len(ids), 1)) {
		wg.Go(func() {
			for i := range work {
				var o struct {
					ID             string  `json:"id"`
					IdempotencyKey *string `json:"idempotency_key"`
				}
				err := getJSON(ctx, cfg, cfg.URL+"/v1/orders/"+url.PathEscape(ids[i]), &o)
				if errors.Is(err, errNotFound) {
					continue
				}
				if err != nil {
					select {
					case errc <- fmt.Errorf("reading order %s: %w", ids[i], err):
					default:
					}
					continue
				}
				objects[i].ID, found[i] = o.ID, true
				if o.IdempotencyKey != nil {
					objects[i].Key = *o.IdempotencyKey
				}
			}
		})
	}
	for i := range ids {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		return nil, err
	default:
	}
	var out []Object
	for i, ok := range found {
		if ok {
			out = append(out, objects[i])
		}
	}
	return out, nil
}

var errNotFound = errors.New("404 not found")

// getJSON GETs u and decodes its 200 body into v, retrying 5xx and connection errors
// for up to the retry deadline.
func getJSON(ctx context.Context, cfg *Config, u string, v any) error {
	deadline := time.Now().Add(cfg.RetryDeadline)
	for attempt := 1; ; attempt++ {
		status, body, err := get(ctx, cfg, u)
		switch {
		case err == nil && status == http.StatusOK:
			return json.Unmarshal(body, v)
		case err == nil && status == http.StatusNotFound:
			return errNotFound
		case err == nil && status < 500:
			return fmt.Errorf("GET %s: %d %s", u, status, strings.TrimSpace(string(body)))
		case time.Now().After(deadline) || ctx.Err() != nil:
			if err == nil {
				err = fmt.Errorf("GET %s: %d", u, status)
			}
			return err
		}
		sleep(ctx, backoff(answer{}, attempt))
	}
}

func get(ctx context.Context, cfg *Config, u string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+cfg.Token)
	resp, err := cfg.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}
