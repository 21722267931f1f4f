package payments

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
)

type scopeKey struct{}

// authenticate accepts "Authorization: Bearer <token>" and puts the principal's scope,
// the hex SHA-256 of the token, in the request's context (demo mode: every distinct
// token is a distinct principal, SPEC §11). Anything else is 401.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope, err := bearerScope(r.Header.Values("Authorization"))
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem"`)
			writeAPIError(w, &apiError{status: http.StatusUnauthorized, code: "api_key_invalid", message: err.Error()})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), scopeKey{}, scope)))
	})
}

// bearerScope returns the scope of the one bearer token in values.
func bearerScope(values []string) (string, error) {
	if len(values) == 0 {
		return "", errors.New("You did not provide an API key. Provide it as 'Authorization: Bearer <token>'.")
	}
	if len(values) > 1 {
		return "", errors.New("Provide exactly one Authorization header.")
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || !validToken(token) {
		return "", errors.New("Invalid Authorization header: expected 'Bearer <token>'.")
	}
	return ScopeOfToken(token), nil
}

// ScopeOfToken is the scope of the principal that authenticates with the bearer token:
// its hex SHA-256, so that no store ever holds a token. `idem keys --token` finds a
// principal's records with it.
func ScopeOfToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// validToken accepts a non-empty run of visible ASCII (RFC 6750's b64token and more).
func validToken(t string) bool {
	if t == "" {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return false
		}
	}
	return true
}

// scopeOf is the middleware's Config.Scope: the scope authenticate put in the context.
func scopeOf(r *http.Request) (string, error) {
	if s, ok := r.Context().Value(scopeKey{}).(string); ok && s != "" {
		return s, nil
	}
	return "", errors.New("payments: request not authenticated")
}
