package idem

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/idem-go/idem/internal/corehooks"
)

// DefaultStorePolicy is SPEC §6's default: it stores 2xx, 3xx and the 4xx that are a
// final outcome of the operation (such as 402 card declined), and releases the key for
// the statuses that mean "nothing happened, you may try again": 400, 401, 403, 404,
// 408, 409, 413, 415, 422, 425, 429 and every 5xx.
func DefaultStorePolicy(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden,
		http.StatusNotFound, http.StatusRequestTimeout, http.StatusConflict,
		http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType,
		http.StatusUnprocessableEntity, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

// DefaultStoredHeaders are the response headers stored with a response and replayed
// (SPEC §6); [Config.StoredHeaders] adds to them.
var DefaultStoredHeaders = []string{
	"Content-Type", "Content-Encoding", "Content-Language", "Content-Disposition",
	"Location", "ETag", "Last-Modified", "Link", "Cache-Control", "Vary",
}

// neverStored are headers that must not be replayed: cookies belong to one response,
// Date is the time of the original response, hop-by-hop headers describe one
// connection, and the idempotency headers are set by the middleware itself.
var neverStored = []string{
	"Set-Cookie", "Date", "Connection", "Keep-Alive", "Proxy-Connection",
	"Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding",
	"Upgrade", "Content-Length", "Idempotency-Key", "Idempotent-Replayed",
}

// credentialHeaders carry credentials, and are never stored (SPEC §19): a replay
// would hand one to whoever retries the key, and the store would keep it in clear for
// the record's life.
var credentialHeaders = []string{
	"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "Set-Cookie2", "X-Api-Key",
	"Www-Authenticate", "Authentication-Info", "Proxy-Authenticate", "Proxy-Authentication-Info",
}

func init() { corehooks.StoredHeaderError = storedHeaderError }

// storedHeaderError says why the response header name may not be stored and
// replayed, or returns nil when it may: a credential (Authorization,
// Proxy-Authorization, Cookie, Set-Cookie, Set-Cookie2, X-Api-Key, WWW-Authenticate,
// Authentication-Info…; SPEC §19), Date, a hop-by-hop header, or one the middleware
// sets itself (SPEC §6). [Config.StoredHeaders] refuses such a header with this
// error; admin.StoredHeaderError (the operator's tools) refuses more.
func storedHeaderError(name string) error {
	c := http.CanonicalHeaderKey(name)
	switch {
	case slices.Contains(credentialHeaders, c):
		return fmt.Errorf("%s carries a credential, which is never stored with a response (SPEC §19): "+
			"the store would keep it, and a replay would hand it to whoever retries the key", c)
	case slices.Contains(neverStored, c):
		return fmt.Errorf("%s is never stored with a response (SPEC §6): it belongs to one response or one connection, "+
			"or the middleware sets it itself", c)
	}
	return nil
}

// storedHeaderSet builds the allow-list from the defaults and extra, panicking on a
// header that must never be stored.
func storedHeaderSet(extra []string) map[string]bool {
	set := make(map[string]bool, len(DefaultStoredHeaders)+len(extra))
	for _, h := range DefaultStoredHeaders {
		set[http.CanonicalHeaderKey(h)] = true
	}
	for _, h := range extra {
		if err := storedHeaderError(h); err != nil {
			panic("idem: Config.StoredHeaders: " + err.Error())
		}
		set[http.CanonicalHeaderKey(h)] = true
	}
	return set
}
