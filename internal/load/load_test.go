package load

import (
	"strings"
	"testing"
	"time"
)

func TestPercentilesAreNearestRankOfTheSamples(t *testing.T) {
	t.Parallel()
	var samples []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	got := percentiles(samples)
	want := Latency{P50: 50, P90: 90, P99: 99, Max: 100}
	if got != want {
		t.Fatalf("percentiles of 1..100ms = %+v, want %+v", got, want)
	}
	if got := percentiles([]time.Duration{1500 * time.Microsecond}); got.P50 != 1.5 || got.P99 != 1.5 || got.Max != 1.5 {
		t.Fatalf("percentiles of one sample = %+v, want all 1.5ms", got)
	}
	if got := percentiles(nil); got != (Latency{}) {
		t.Fatalf("percentiles of no sample = %+v, want zero", got)
	}
}

func TestPercentilesOfASkewedDistribution(t *testing.T) {
	t.Parallel()
	// 990 fast samples and 10 slow ones: p99 is the last fast one, max the slowest.
	var samples []time.Duration
	for range 990 {
		samples = append(samples, time.Millisecond)
	}
	for i := range 10 {
		samples = append(samples, time.Duration(100+i)*time.Millisecond)
	}
	got := percentiles(samples)
	if got.P50 != 1 || got.P90 != 1 || got.P99 != 1 || got.Max != 109 {
		t.Fatalf("percentiles = %+v, want p50=p90=p99=1ms, max 109ms", got)
	}
}

// requireLines fails t unless the discrepancies of fn are exactly want, in order.
func requireLines(t *testing.T, fn string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s =\n%s\nwant\n%s", fn, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// created is the outcome of a key whose first final answer was 201 with id.
func created(key, id string) Outcome {
	return Outcome{Key: key, Final: 201, ID: id, IDs: []string{id}}
}

func TestMatchAcceptsOneChargePerCreatedKey(t *testing.T) {
	t.Parallel()
	outcomes := []Outcome{created("k1", "ch_1"), created("k2", "ch_2"), {Key: "k3", Final: 400, Code: "parameter_invalid"}}
	objects := []Object{{ID: "ch_2", Key: "k2"}, {ID: "ch_1", Key: "k1"}}
	if d := Match(outcomes, objects, true, "charges"); len(d) != 0 {
		t.Fatalf("Match = %q, want no discrepancy", d)
	}
}

func TestMatchDetectsTwoChargesForOneKey(t *testing.T) {
	t.Parallel()
	outcomes := []Outcome{created("k1", "ch_1"), created("k2", "ch_2")}
	objects := []Object{{ID: "ch_1", Key: "k1"}, {ID: "ch_2", Key: "k2"}, {ID: "ch_3", Key: "k1"}}
	d := Match(outcomes, objects, true, "charges")
	want := []string{"key k1 has 2 charges (ch_1, ch_3)"}
	requireLines(t, "Match", d, want)
}

func TestMatchDetectsAMissingCharge(t *testing.T) {
	t.Parallel()
	outcomes := []Outcome{created("k1", "ch_1"), created("k2", "ch_2")}
	objects := []Object{{ID: "ch_1", Key: "k1"}}
	d := Match(outcomes, objects, true, "charges")
	want := []string{"key k2 got 201 (ch_2) but has no charge"}
	requireLines(t, "Match", d, want)
}

func TestMatchDetectsAnUnexpectedCharge(t *testing.T) {
	t.Parallel()
	outcomes := []Outcome{created("k1", "ch_1"), {Key: "k2", Final: 400, Code: "parameter_invalid"}}
	objects := []Object{{ID: "ch_1", Key: "k1"}, {ID: "ch_2", Key: "k2"}, {ID: "ch_3", Key: "k9"}, {ID: "ch_4"}}
	d := Match(outcomes, objects, true, "charges")
	want := []string{
		"key k2 was answered 400 parameter_invalid but has 1 charge (ch_2)",
		"1 charge without an idempotency key (ch_4)",
		"key k9, never sent by this run, has 1 charge (ch_3)",
	}
	requireLines(t, "Match", d, want)
}

func TestMatchDetectsAnswersThatContradictTheFirst(t *testing.T) {
	t.Parallel()
	k1 := created("k1", "ch_1")
	k1.Later = map[Reply]int{{Status: 201, ID: "ch_2"}: 1, {Status: 409, Code: "response_not_stored"}: 3}
	k2 := Outcome{Key: "k2", Final: 409, Code: "key_reused", Later: map[Reply]int{{Status: 201, ID: "ch_3"}: 2}}
	objects := []Object{{ID: "ch_1", Key: "k1"}}
	d := Match([]Outcome{k2, k1}, objects, true, "charges")
	want := []string{
		"key k1: first answered 201 (ch_1), later 201 (ch_2) (1 time)",
		"key k1: first answered 201 (ch_1), later 409 response_not_stored (3 times)",
		"key k2: first answered 409 key_reused, later 201 (ch_3) (2 times)",
	}
	requireLines(t, "Match", d, want)
}

func TestMatchDetectsSeveralChargesOfAnUnresolvedKey(t *testing.T) {
	t.Parallel()
	d := Match([]Outcome{{Key: "k1"}}, []Object{{ID: "ch_1", Key: "k1"}, {ID: "ch_2", Key: "k1"}}, true, "charges")
	if len(d) != 1 || d[0] != "key k1, without a final answer, has 2 charges (ch_1, ch_2)" {
		t.Fatalf("Match = %q, want k1's two charges reported", d)
	}
}

func TestLateReportsObjectsThatAppearedAfterTheFirstListing(t *testing.T) {
	t.Parallel()
	before := []Object{{ID: "ch_1", Key: "k1"}}
	after := []Object{{ID: "ch_3"}, {ID: "ch_2", Key: "k1"}, {ID: "ch_1", Key: "k1"}}
	d := Late(before, after, "charges")
	want := []string{"charge ch_3 (no key) appeared after the first listing", "charge ch_2 (key k1) appeared after the first listing"}
	requireLines(t, "Late", d, want)
}

func TestMatchDetectsAChargeOtherThanTheOneAnswered(t *testing.T) {
	t.Parallel()
	d := Match([]Outcome{created("k1", "ch_1")}, []Object{{ID: "ch_9", Key: "k1"}}, true, "charges")
	if len(d) != 1 || d[0] != "key k1 got ch_1 but its charge is ch_9" {
		t.Fatalf("Match = %q", d)
	}
}

func TestMatchLeavesTheChargeOfAnUnresolvedKeyToTheUnresolvedCount(t *testing.T) {
	t.Parallel()
	d := Match([]Outcome{{Key: "k1"}}, []Object{{ID: "ch_1", Key: "k1"}}, true, "charges")
	if len(d) != 0 {
		t.Fatalf("Match = %q, want none: k1's fate is unknown, not wrong", d)
	}
}

func TestMatchOfReadBackOrdersChecksOnlyTheCreatedKeys(t *testing.T) {
	t.Parallel()
	outcomes := []Outcome{created("k1", "ord_1"), created("k2", "ord_2")}
	// ord_2 was not found; an order of an unknown key cannot be seen without a list.
	objects := []Object{{ID: "ord_1", Key: "k1"}}
	d := Match(outcomes, objects, false, "orders")
	if len(d) != 1 || d[0] != "key k2 got 201 (ord_2) but has no order" {
		t.Fatalf("Match = %q", d)
	}
}

func TestJSONStringReadsCompactMembers(t *testing.T) {
	t.Parallel()
	cases := []struct{ body, member, want string }{
		{`{"id":"ch_1","object":"charge"}`, `"id":`, "ch_1"},
		{`{"error":{"type":"idempotency_error","code":"request_in_progress"}}`, `"code":`, "request_in_progress"},
		{`{"id": "ch_2"}`, `"id":`, "ch_2"},
		{`{"id":12}`, `"id":`, ""},
		{`{"x":"y"}`, `"id":`, ""},
		{`{"id":"unterminated`, `"id":`, ""},
	}
	for _, c := range cases {
		if got := jsonString([]byte(c.body), c.member); got != c.want {
			t.Errorf("jsonString(%s, %s) = %q, want %q", c.body, c.member, got, c.want)
		}
	}
}

func TestAnswersThatAreNotFinal(t *testing.T) {
	t.Parallel()
	notFinal := []answer{{status: 0}, {status: 409, code: "request_in_progress"}, {status: 429}, {status: 503, code: "store_unavailable"}, {status: 500}}
	for _, a := range notFinal {
		if a.final() {
			t.Errorf("%s is final, want a retry", a.describe())
		}
	}
	final := []answer{{status: 201}, {status: 200}, {status: 400, code: "key_required"}, {status: 409, code: "key_reused"}, {status: 409, code: "response_not_stored"}, {status: 402}, {status: 500, code: "outcome_unknown"}}
	for _, a := range final {
		if !a.final() {
			t.Errorf("%s is not final", a.describe())
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	if got := parseRetryAfter("2"); got != 2*time.Second {
		t.Errorf("Retry-After 2 = %v", got)
	}
	if got := parseRetryAfter("soon"); got != 0 {
		t.Errorf("Retry-After soon = %v", got)
	}
	if got := parseRetryAfter(time.Now().Add(-time.Hour).UTC().Format(time.RFC1123)); got != 0 {
		t.Errorf("Retry-After in the past = %v", got)
	}
}
