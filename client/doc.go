// Package client is the client half of idem (SPEC §12): an [http.RoundTripper] that
// adds an Idempotency-Key to POST and PATCH requests and retries them safely, and
// [NewClient], which returns an [*http.Client] using it.
//
// One logical request (one call of RoundTrip) keeps the same key and the same body
// bytes on every attempt, so a retry whose predecessor did execute is a replay on an
// idem server, never a second execution. The [Transport] retries connection errors
// (including a reply lost after the server committed), 409 request_in_progress, 429
// (quota_exceeded only when it asks for no longer than [DefaultMaxRetryAfter]) and 5xx
// other than 501, waiting Retry-After when the server sends it and an
// exponential backoff with full jitter otherwise. Answers are classified by their
// error code in both of idem's error profiles; final answers (key_reused,
// response_not_stored, outcome_unknown, 400, 401, 403, 404, 422, …) are returned at
// once.
//
// Retries are limited by [Transport.MaxAttempts] and by a [Budget], a token bucket
// shared by every request of the client, so that a failing server sees at most a
// bounded fraction of extra load; waiting for a server that refuses connections (a
// restart) or for a key in progress (409 request_in_progress) takes no token and is
// bounded by time instead ([Transport.MaxWait], 60 s by default), so that the default
// client rides out a server restart and still gives up on a dead server within
// MaxWait plus one connection attempt. [Transport.AttemptTimeout] bounds each attempt
// (http.Client.Timeout bounds them all together). The http.Transport underneath silently re-sends a
// request carrying an Idempotency-Key when a reused connection fails; each such
// re-send takes an attempt and a budget token before it happens (through
// Request.GetBody, which net/http calls first), or does not happen, so that
// MaxAttempts 1 sends a POST once and concurrent requests never overdraw the budget.
// Re-sends net/http makes without asking are detected with [net/http/httptrace] and
// counted after the fact (see [Transport]).
//
// [Attempts] reports how many attempts a response took; a failed request returns a
// [*RetryError] ("POST https://… giving up after 3 attempt(s) in 1.2s: …") that names
// the limit that ended the retries, and the setting that raises it, and wraps the
// last cause.
package client
