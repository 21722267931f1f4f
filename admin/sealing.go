package admin

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/corehooks"
	"github.com/idem-go/idem/seal"
)

// SealResponse returns resp sealed for the record (scope, key, recordID) under k, as
// the core stores a completion under a keyring (SPEC §19): for an operator's tool that
// completes a sealed record (`idem keys resolve`). A response not stored, or whose
// outcome is unknown, has nothing to seal and is returned as it is.
func SealResponse(k *seal.Keyring, scope, key, recordID string, resp *idem.Response) (*idem.Response, error) {
	return corehooks.SealResponse(k, scope, key, recordID, resp)
}

// OpenRecord returns rec with its response and saved step results opened with k, as
// the core opens a record it reads (SPEC §19), for an operator's tool (`idem keys get
// --body`): a copy when anything was sealed, rec itself otherwise. With k nil, a
// sealed record fails. A record that cannot be opened fails with an error matching
// [idem.ErrRecordUnreadable] that names the key it was sealed under; a key manager
// that did not answer, with one wrapping [seal.ErrKeyUnavailable].
func OpenRecord(ctx context.Context, k *seal.Keyring, rec *idemstore.Record) (*idemstore.Record, error) {
	return corehooks.OpenRecord(ctx, k, rec)
}

// IsSealed reports whether rec holds a sealed response or sealed step results.
func IsSealed(rec *idemstore.Record) bool {
	return (rec.Response != nil && seal.Sealed(rec.Response.Body)) || seal.Sealed(rec.Steps)
}

// credentialWords are what a header name that looks like a credential's holds
// (lower case): X-Auth-Token, X-Access-Token, Api-Key, X-Amz-Security-Token,
// X-CSRF-Token, X-Session-Id, a cookie.
var credentialWords = []string{"token", "auth", "key", "secret", "session", "csrf", "cookie"}

// StoredHeaderError says why an operator's tool (`idem proxy --stored-header`, `idem
// keys resolve --header`) must not store and replay the response header name, or
// returns nil when it may: a header the core never stores (a credential such as
// Authorization or Set-Cookie, Date, a hop-by-hop header, one the middleware sets
// itself; SPEC §6, §19), whatever allowed says; or a name that looks like a
// credential's (it holds token, auth, key, secret, session, csrf or cookie, in any
// case), unless allowed names it (compared case-insensitively): a replay would hand
// the credential to whoever retries the key, and the store would keep it for the
// record's life. The error names the header, never a value.
func StoredHeaderError(name string, allowed ...string) error {
	c := http.CanonicalHeaderKey(name)
	if err := corehooks.StoredHeaderError(c); err != nil {
		return err
	}
	lower := strings.ToLower(c)
	for _, w := range credentialWords {
		if !strings.Contains(lower, w) {
			continue
		}
		for _, a := range allowed {
			if strings.EqualFold(a, c) {
				return nil
			}
		}
		return fmt.Errorf("%s looks like a credential's header (its name holds %q), which is not stored with a response "+
			"unless allowed by name (--allow-stored-header %s): the store would keep it, and a replay would hand it to whoever retries the key", c, w, c)
	}
	return nil
}
