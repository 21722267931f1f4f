// Package check is `idem check`: a black-box conformance checker of one HTTP
// endpoint's Idempotency-Key support (SPEC §18). It needs nothing but the endpoint's
// URL, a body it accepts and the headers it needs; it knows nothing of the server's
// language or store.
//
// It works as go vet's analyzers do: each [Check] is a small named value with a doc
// line, the rule it comes from (a §N of docs/spec.md, the seed's rule, the IETF
// draft's section or Stripe's documented behaviour) and a run function that sends its
// requests and returns pass, warn, fail or skip with the evidence that decided it, the
// requests and the answers. [Run] runs them one after another and returns a [Report],
// which prints as a table a person scans in five seconds ([Report.WriteText]), as JSON
// for machines ([Report.WriteJSON]) and as a self-contained HTML page whose every check
// shows its evidence in a collapsible block ([Report.WriteHTML]).
//
// Every key the checker sends is a fresh UUID v4. Duplicates go in real bursts (see
// [Config.Rounds]): every connection is opened first and the requests' last bytes are
// written together. It creates only the resources its checks need (the first
// request's, one per round of duplicates, one after a rejected body, one for the
// write of the safe-methods check, one with a second principal, one with
// [Config.Between]; more when the endpoint runs duplicates) and the report says how
// many it created. A check that cannot judge is skipped with its reason, never passed.
package check
