package load

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
)

// maxDiscrepancyLines bounds how many discrepancies WriteText prints.
const maxDiscrepancyLines = 20

// WriteText writes the summary for a person: throughput, latency percentiles, counts
// per status (and per error code of the 409s), then the verification, ending with the
// "exactly-once: …" line.
func (s *Summary) WriteText(w io.Writer) {
	keyed := "with Idempotency-Key"
	if !s.Keyed {
		keyed = "without keys"
	}
	fmt.Fprintf(w, "endpoint     %s (%s), %d workers, %.1fs\n", s.Endpoint, keyed, s.Concurrency, s.ElapsedSecs)
	fmt.Fprintf(w, "requests     %d (%d errors), %.1f req/s\n", s.Requests, s.Errors, s.Throughput)
	fmt.Fprintf(w, "latency      p50 %.3fms  p90 %.3fms  p99 %.3fms  max %.3fms\n", s.P50, s.P90, s.P99, s.Max)
	fmt.Fprintf(w, "status       %s\n", counts(s.Status))
	if len(s.ConflictCodes) > 0 {
		fmt.Fprintf(w, "409 codes    %s\n", counts(s.ConflictCodes))
	}
	if s.Replayed > 0 {
		fmt.Fprintf(w, "replayed     %d (Idempotent-Replayed: true)\n", s.Replayed)
	}
	v := s.Verification
	if v == nil {
		return
	}
	fmt.Fprintf(w, "logical      %d requests: %d created, %d unresolved", v.Logical, v.Created, v.Unresolved)
	if len(v.OtherFinal) > 0 {
		other := map[string]int64{}
		for k, n := range v.OtherFinal {
			other[k] = int64(n)
		}
		fmt.Fprintf(w, ", other final answers: %s", counts(other))
	}
	fmt.Fprintf(w, " (%d retries to resolve)\n", v.Retries)
	noun := "charges"
	if s.Endpoint == string(EndpointOrders) {
		noun = "orders"
	}
	fmt.Fprintf(w, "%-12s %d found\n", noun, v.Objects)
	if v.Note != "" && v.Result != ExactlyOnceUnchecked {
		fmt.Fprintf(w, "note         %s\n", v.Note)
	}
	for i, d := range v.Discrepancies {
		if i == maxDiscrepancyLines {
			fmt.Fprintf(w, "  … and %d more\n", len(v.Discrepancies)-i)
			break
		}
		fmt.Fprintf(w, "  %s\n", d)
	}
	fmt.Fprintln(w, v.Line())
}

// WriteJSON writes the summary as indented JSON, one top-level figure per line.
func (s *Summary) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// counts renders a count map as "201=1203 409=12", keys in order.
func counts[N int | int64](m map[string]N) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := ""
	for i, k := range keys {
		if i > 0 {
			out += "  "
		}
		out += k + "=" + strconv.FormatInt(int64(m[k]), 10)
	}
	return out
}
