package payments

import (
	"encoding/json"
	"net/http"
)

// apiError is an error of the API itself, written in Stripe's shape:
//
//	{"error": {"type": "invalid_request_error", "code": "...", "message": "...", "param": "amount"}}
type apiError struct {
	status  int
	typ     string // defaults to invalid_request_error (api_error for 5xx)
	code    string
	message string
	param   string
	charge  string // the charge an error is about (a card error), or ""
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	Charge  string `json:"charge,omitempty"`
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	typ := e.typ
	if typ == "" {
		typ = "invalid_request_error"
		if e.status >= 500 {
			typ = "api_error"
		}
	}
	b, _ := json.Marshal(errorBody{Error: errorDetail{Type: typ, Code: e.code, Message: e.message, Param: e.param, Charge: e.charge}})
	if e.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1") // the database or the processor may answer again soon
	}
	writeJSON(w, e.status, b)
}

// writeJSON writes an encoded JSON body with status.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

func errInternal() *apiError {
	return &apiError{status: http.StatusInternalServerError, code: "internal_error", message: "An internal error occurred; retry the request."}
}

// errProcessorUnavailable answers a charge whose card processor did not answer: the
// charge stays pending, and the retry (or the completer) finishes it.
func errProcessorUnavailable(message string) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: "processor_unavailable", message: message}
}

func errUnavailable() *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: "db_unavailable", message: "The database is unavailable; retry the request."}
}

// errOrderDeleted answers the retry of a keyed request whose order has since been
// deleted, when its first answer was recorded before order_keys kept answers.
func errOrderDeleted() *apiError {
	return &apiError{status: http.StatusConflict, code: "order_deleted", message: "The order this idempotency key wrote has since been deleted, and its first answer was not kept; use a new key to create another."}
}

func errNotFound(kind, id string) *apiError {
	return &apiError{status: http.StatusNotFound, code: "resource_missing", message: "No such " + kind + ": '" + id + "'", param: "id"}
}
