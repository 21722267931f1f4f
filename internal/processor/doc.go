// Package processor is a fake card processor (`idem processor`, SPEC §10): a separate
// HTTP service with its own database, itself protected by idem, for the payments API
// to charge through (SPEC §13) and for tests to break.
//
//   - POST /v1/processor/charges {"amount", "currency"} (Idempotency-Key required) →
//     201 {"id": "pch_…", "object": "processor_charge", "amount", "currency",
//     "idempotency_key", "created"}; the charge and the completion of its idempotency
//     record commit in one transaction (SPEC §7), so a retry with the same key is
//     answered the same charge, never a second one.
//   - GET /v1/processor/charges?limit=N&starting_after=ID → {"object": "list",
//     "data", "has_more"}: every charge it made, newest first (limit 1–1000, default
//     100).
//   - GET /healthz → 200 when the database answers, 503 otherwise.
//
// Faults, for tests and demonstrations: [Config.Latency] spends time on each charge,
// [Config.FailRate] answers a share of charges 503 before doing anything, and
// [Config.LostReplyRate] commits a share of charges and then drops the connection
// without answering, so that the caller cannot know the charge happened.
//
// Choices where the SPEC is silent: the processor has no authentication (every caller
// is one merchant, [Scope]); it takes JSON bodies only, refusing unknown members; a
// charge's id is "pch_" and 26 random base-32 characters.
package processor
