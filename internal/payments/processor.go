package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// maxProcessorReply bounds what is read of the processor's answer.
const maxProcessorReply = 64 << 10

// processorClient calls the card processor (`idem processor`, SPEC §10) with an
// http.Client that retries (Config.ProcessorClient: the client package's Transport,
// which retries connection errors, a reply lost after the processor committed among
// them, 409 request_in_progress, 429 and 5xx, with backoff, Retry-After and a budget,
// keeping the Idempotency-Key and the body of one call on every attempt).
type processorClient struct {
	url  string // …/v1/processor/charges
	http *http.Client
}

func newProcessorClient(base string, hc *http.Client) *processorClient {
	return &processorClient{url: strings.TrimRight(base, "/") + "/v1/processor/charges", http: hc}
}

// processorCharge is the processor's answer to a charge.
type processorCharge struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	IdempotencyKey string `json:"idempotency_key"`
}

// errNoProcessorAnswer: the processor did not answer the call with a final answer
// (its retries exhausted, or the request's context ended). Whether it charged is not
// known: only a call with the same key can tell.
var errNoProcessorAnswer = errors.New("payments: the card processor is unavailable")

// processorRefusal is a final refusal of a charge by the processor (a 4xx it does not
// ask to retry): the card was not charged.
type processorRefusal struct {
	status int
	code   string
}

func (e *processorRefusal) Error() string {
	return fmt.Sprintf("payments: the card processor refused the charge: %d %s", e.status, e.code)
}

// charge asks the processor to charge amount in currency under key ("" lets the
// client package's Transport make a fresh key for this call). It returns the processor's charge, a
// *processorRefusal, or an error matching errNoProcessorAnswer.
func (p *processorClient) charge(ctx context.Context, key string, amount int64, currency string) (*processorCharge, error) {
	body := []byte(`{"amount":` + strconv.FormatInt(amount, 10) + `,"currency":` + strconv.Quote(currency) + `}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := p.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errNoProcessorAnswer, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxProcessorReply))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: reading its answer: %v", errNoProcessorAnswer, err)
	case res.StatusCode >= 400 && res.StatusCode < 500:
		var e errorBody
		_ = json.Unmarshal(b, &e)
		return nil, &processorRefusal{status: res.StatusCode, code: e.Error.Code}
	case res.StatusCode == http.StatusCreated:
		var c processorCharge
		if err := json.Unmarshal(b, &c); err != nil || !strings.HasPrefix(c.ID, "pch_") {
			return nil, fmt.Errorf("%w: its 201 is not a processor charge: %.200s", errNoProcessorAnswer, b)
		}
		return &c, nil
	}
	return nil, fmt.Errorf("%w: it answered %d", errNoProcessorAnswer, res.StatusCode)
}
