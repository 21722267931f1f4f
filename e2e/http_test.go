package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// requestTimeout bounds one HTTP exchange with a server.
const requestTimeout = 20 * time.Second

// Content types the tests send.
const (
	contentJSON = "application/json"
	contentForm = "application/x-www-form-urlencoded"
)

// response is an HTTP answer read whole.
type response struct {
	Status  int
	Header  http.Header
	Body    []byte
	Trailer http.Header
	Close   bool // the server closes the connection after it
}

func (r *response) String() string {
	return fmt.Sprintf("%d %s %s", r.Status, r.Header, r.Body)
}

// replayed reports whether the response carries Idempotent-Replayed: true.
func (r *response) replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

// errorCode returns the error code of the body in either profile ("" when absent).
func (r *response) errorCode() string {
	var b struct {
		Code  string `json:"code"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.Body, &b)
	if b.Error.Code != "" {
		return b.Error.Code
	}
	return b.Code
}

// object decodes the body as a JSON object.
func (r *response) object(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("response body is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

// id returns the "id" member of a JSON object body.
func (r *response) id(t testing.TB) string {
	t.Helper()
	id, _ := r.object(t)["id"].(string)
	if id == "" {
		t.Fatalf("response has no id: %s", r)
	}
	return id
}

// client talks to one or more servers as one principal.
type client struct {
	http  *http.Client
	token string
}

// newClient returns a client for the principal named by a fresh bearer token.
func newClient() *client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return &client{http: &http.Client{Transport: tr, Timeout: requestTimeout}, token: "tok_" + randHex(8)}
}

// randHex returns n random bytes in hex.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newKey returns a fresh idempotency key (128 random bits).
func newKey() string { return "key_" + randHex(16) }

// request is one request a test sends.
type request struct {
	method      string
	path        string
	key         string // Idempotency-Key; none when empty
	contentType string
	body        []byte
	chunked     bool        // send the body without Content-Length
	header      http.Header // more header fields
}

// send performs req against base and returns the answer, or the transport's error.
func (c *client) send(ctx context.Context, base string, req request) (*response, error) {
	var body io.Reader
	if req.body != nil {
		body = bytes.NewReader(req.body)
		if req.chunked {
			// Hiding the length makes net/http send the body chunked.
			body = struct{ io.Reader }{body}
		}
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, base+req.path, body)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		hr.Header.Set("Authorization", "Bearer "+c.token)
	}
	if req.key != "" {
		hr.Header.Set("Idempotency-Key", req.key)
	}
	if req.contentType != "" {
		hr.Header.Set("Content-Type", req.contentType)
	}
	for k, v := range req.header {
		hr.Header[k] = v
	}
	res, err := c.http.Do(hr)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	return &response{Status: res.StatusCode, Header: res.Header, Body: b, Trailer: res.Trailer, Close: res.Close}, nil
}

// do sends req and fails the test on a transport error.
func (c *client) do(t testing.TB, base string, req request) *response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	res, err := c.send(ctx, base, req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.method, req.path, err)
	}
	return res
}

// chargeJSON is the design note's charge body with the given amount.
func chargeJSON(amount int) []byte {
	return []byte(fmt.Sprintf(`{"amount": %d, "currency": "usd", "customer_id": "cust_abc123"}`, amount))
}

// postCharge sends POST /v1/charges with a JSON body.
func (c *client) postCharge(t testing.TB, base, key string, body []byte) *response {
	t.Helper()
	return c.do(t, base, request{method: "POST", path: "/v1/charges", key: key, contentType: contentJSON, body: body})
}

// listCharges returns the principal's charges (up to 1000), failing unless 200.
func (c *client) listCharges(t testing.TB, base string) []map[string]any {
	t.Helper()
	res := c.do(t, base, request{method: "GET", path: "/v1/charges?limit=1000"})
	if res.Status != http.StatusOK {
		t.Fatalf("GET /v1/charges: want 200, got %s", res)
	}
	var list struct {
		Object  string           `json:"object"`
		Data    []map[string]any `json:"data"`
		HasMore bool             `json:"has_more"`
	}
	if err := json.Unmarshal(res.Body, &list); err != nil {
		t.Fatalf("GET /v1/charges: %v: %s", err, res.Body)
	}
	if list.Object != "list" || list.HasMore {
		t.Fatalf("GET /v1/charges: want a complete list object, got %s", res.Body)
	}
	return list.Data
}

// want201 fails the test unless res is a 201.
func want201(t testing.TB, what string, res *response) {
	t.Helper()
	if res.Status != http.StatusCreated {
		t.Fatalf("%s: want 201, got %s", what, res)
	}
}

// wantError fails the test unless res has the status and error code.
func wantError(t testing.TB, what string, res *response, status int, code string) {
	t.Helper()
	if res.Status != status || res.errorCode() != code {
		t.Fatalf("%s: want %d %s, got %s", what, status, code, res)
	}
}

// formBody encodes pairs in the given order.
func formBody(pairs ...string) []byte {
	var parts []string
	for i := 0; i+1 < len(pairs); i += 2 {
		parts = append(parts, url.QueryEscape(pairs[i])+"="+url.QueryEscape(pairs[i+1]))
	}
	return []byte(strings.Join(parts, "&"))
}

// waitFor polls cond every interval until it holds or d passes, then fails with what.
func waitFor(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; last: %s", what, d, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func itoa(n int) string { return fmt.Sprint(n) }

// postInBackground posts the charge with key and body on its own goroutine, within
// requestTimeout, and returns the channel its answer arrives on.
func postInBackground(c *client, base, key string, body []byte) <-chan answer {
	got := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		res, err := c.send(ctx, base, request{method: "POST", path: "/v1/charges", key: key, contentType: contentJSON, body: body})
		got <- answer{res, err}
	}()
	return got
}

// pollCreated posts the charge with key and body until it is answered 201, within d,
// and returns that answer; it fails the test with what otherwise.
func pollCreated(t testing.TB, c *client, base, key string, body []byte, d time.Duration, what string) *response {
	t.Helper()
	var created *response
	waitFor(t, d, what, func() (bool, string) {
		res, err := c.send(context.Background(), base, request{method: "POST", path: "/v1/charges", key: key, contentType: contentJSON, body: body})
		if err != nil {
			return false, err.Error()
		}
		created = res
		return res.Status == http.StatusCreated, res.String()
	})
	return created
}

// wantHealthz fails the test unless GET /healthz answers status; when says at what
// moment.
func wantHealthz(t testing.TB, c *client, base string, status int, when string) {
	t.Helper()
	if res := c.do(t, base, request{method: "GET", path: "/healthz"}); res.Status != status {
		t.Fatalf("/healthz %s: want %d, got %s", when, status, res)
	}
}
