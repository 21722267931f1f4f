package proxy

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// Forward authentication (SPEC §17, "who is asking"), the convention of nginx
// auth_request, Traefik ForwardAuth and Envoy ext_authz: before a keyed request is
// claimed, replayed or its body buffered, its credentials (Config.AuthHeaders) go to
// the auth endpoint in a GET, with X-Forwarded-Method, -Uri, -Host, -Proto and -For
// saying what the request is. A 2xx answer names the principal in
// Config.AuthPrincipalHeader, which becomes the scope (hashed, as a scope header's value
// is); any other answer goes back to the client as it is (its status, its body and the
// header fields of authAnswerHeaders), nothing claimed or replayed. An auth endpoint
// that cannot be reached, does not answer within Config.AuthTimeout, or answers 2xx
// without a principal gets the client 503 auth_unavailable with Retry-After: never a
// replay, never a forward.

// authAnswerHeaders are the header fields of an auth endpoint's refusal that reach the
// client: what it needs to authenticate (WWW-Authenticate, a login page's Location and
// cookie), to read the body, and to come back.
var authAnswerHeaders = []string{"Content-Type", "Content-Language", "WWW-Authenticate", "Location", "Set-Cookie", "Retry-After", "Cache-Control"}

// maxAuthBody bounds the body of an auth endpoint's refusal passed to the client.
const maxAuthBody = 64 << 10

// authenticator asks the auth endpoint about keyed requests.
type authenticator struct {
	url       string
	headers   []string // canonical
	principal string   // canonical
	timeout   time.Duration
	client    *http.Client
}

func newAuthenticator(c Config) *authenticator {
	if c.AuthURL == nil {
		return nil
	}
	a := &authenticator{url: c.AuthURL.String(), timeout: withDefault(c.AuthTimeout, DefaultAuthTimeout)}
	a.principal, _ = headerName("", c.AuthPrincipalHeader, DefaultAuthPrincipalHeader)
	names := c.AuthHeaders
	if names == nil {
		names = DefaultAuthHeaders()
	}
	for _, n := range names {
		n, _ = headerName("", n, "")
		a.headers = append(a.headers, n)
	}
	tr := c.AuthTransport
	if tr == nil {
		tr = &http.Transport{
			DialContext:         (&net.Dialer{Timeout: a.timeout, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout: a.timeout,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     DefaultUpstreamIdleTimeout,
			ForceAttemptHTTP2:   true,
		}
	}
	// A redirect (to a login page) is an answer for the client, not one to follow.
	a.client = &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return a
}

type principalKey struct{}

// authorize asks the auth endpoint about r. It returns r carrying the principal, or
// nil once it answered the client itself (a refusal, or the endpoint unavailable).
func (p *Proxy) authorize(w http.ResponseWriter, r *http.Request) *http.Request {
	a := p.auth
	ctx, cancel := context.WithTimeout(r.Context(), a.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url, nil)
	if err != nil {
		p.authUnavailable(w, r, err)
		return nil
	}
	for _, name := range a.headers {
		if v, ok := r.Header[name]; ok {
			req.Header[name] = v
		}
	}
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	req.Header.Set("X-Forwarded-Method", r.Method)
	req.Header.Set("X-Forwarded-Uri", r.URL.RequestURI())
	req.Header.Set("X-Forwarded-Host", r.Host)
	req.Header.Set("X-Forwarded-Proto", proto)
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		req.Header.Set("X-Forwarded-For", host)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		if r.Context().Err() == nil {
			p.authUnavailable(w, r, err)
		}
		return nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAuthBody+1))
	if err != nil {
		p.authUnavailable(w, r, err)
		return nil
	}
	if resp.StatusCode/100 == 2 {
		principal := strings.TrimSpace(resp.Header.Get(a.principal))
		if principal == "" {
			p.logger.ErrorContext(r.Context(), "idem proxy: the auth endpoint (--auth-url) allowed a request without naming its principal in --auth-principal-header; answering 503",
				"auth_principal_header", a.principal, "status", resp.StatusCode)
			p.writeAuthUnavailable(w, r)
			return nil
		}
		return r.WithContext(context.WithValue(r.Context(), principalKey{}, principal))
	}
	// A refusal: the client gets it as the auth endpoint wrote it.
	for _, name := range authAnswerHeaders {
		if v := resp.Header.Values(name); len(v) > 0 {
			w.Header()[http.CanonicalHeaderKey(name)] = v
		}
	}
	if len(body) > maxAuthBody {
		body = nil // not to be cut in the middle: the status and the headers say enough
		w.Header().Del("Content-Type")
	}
	if p.hooks.AuthRefused != nil {
		p.hooks.AuthRefused(p.Route(r), resp.StatusCode)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, bytes.NewReader(body))
	return nil
}

// authUnavailable logs an auth endpoint that failed and answers 503.
func (p *Proxy) authUnavailable(w http.ResponseWriter, r *http.Request, err error) {
	p.logger.WarnContext(r.Context(), "idem proxy: the auth endpoint (--auth-url) could not be asked; answering 503 auth_unavailable",
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err), slog.Duration("auth_timeout", p.auth.timeout))
	p.writeAuthUnavailable(w, r)
}

func (p *Proxy) writeAuthUnavailable(w http.ResponseWriter, r *http.Request) {
	if p.hooks.AuthRefused != nil {
		p.hooks.AuthRefused(p.Route(r), http.StatusServiceUnavailable)
	}
	w.Header().Set("Retry-After", "1")
	idem.WriteProblem(w, r, p.profile, &idem.Problem{Status: http.StatusServiceUnavailable, Code: CodeAuthUnavailable, Type: "api_error",
		Detail: "The authentication service could not be asked; retry later. Nothing was executed or replayed."})
}

// credentialSchemes are the HTTP authentication schemes (the IANA registry, and the
// Token and ApiKey schemes in common use) in their registered spelling: a scope
// header's scheme is written so, whatever its case, and a credential that is a scheme
// alone carries no token.
var credentialSchemes = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{"Basic", "Bearer", "Digest", "DPoP", "GNAP", "HOBA", "Mutual", "Negotiate", "NTLM", "OAuth",
		"PrivateToken", "SCRAM-SHA-1", "SCRAM-SHA-256", "vapid", "Concealed", "Token", "ApiKey", "AWS4-HMAC-SHA256"} {
		m[strings.ToLower(s)] = s
	}
	return m
}()

// normalizeCredential is a scope header's value as the scope is made of it: without
// surrounding white space, its inner runs of white space one space, and its
// authentication scheme in its registered spelling ("bearer  sk_1" is "Bearer sk_1"),
// so that one credential is one principal however a client spells it. It reports false
// for a credential that is a scheme alone ("Bearer"): no principal.
func normalizeCredential(v string) (string, bool) {
	fields := strings.Fields(v)
	if len(fields) == 0 {
		return "", false
	}
	scheme, known := credentialSchemes[strings.ToLower(fields[0])]
	if known {
		if len(fields) == 1 {
			return "", false
		}
		fields[0] = scheme
	}
	return strings.Join(fields, " "), true
}
