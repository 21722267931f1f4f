package check

import (
	"bytes"
	"encoding/json"
	"html"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
)

// AltBody returns body with one number changed, the changed-body check's second valid
// body when none is given: the first JSON number of a JSON body (never a digit inside
// a string), or the first run of digits of any other body (a form). An integer n
// becomes n-1, or n+1 when n < 2 (so that an amount stays positive); a number with a
// fraction or exponent has its last digit changed. A body without a number is an
// error.
func AltBody(body []byte) ([]byte, error) {
	start, end := numberAt(body)
	if start < 0 {
		return nil, errNoNumber
	}
	changed := changeNumber(string(body[start:end]))
	out := make([]byte, 0, len(body)+1)
	out = append(out, body[:start]...)
	out = append(out, changed...)
	return append(out, body[end:]...), nil
}

var digits = regexp.MustCompile(`[0-9]+`)

// FreshBody returns body with its first number (found as [AltBody] finds it) drawn
// afresh: every digit random, the first of a whole part of several digits from 1 to
// 9, so that the number keeps its count of digits, its sign, its fraction and its
// exponent (2000 becomes one of 1000 to 9999; 7 one of 1 to 9; 0.25 one of 0.00 to
// 0.99). Each run of the checker sends its bodies so, so that no earlier run on the
// same server sent them: a record an earlier run left (a body hashed into a key, an
// empty key kept for ever) answers none of this run's requests. A body without a
// number is returned as it is.
func FreshBody(body []byte) []byte {
	start, end := numberAt(body)
	if start < 0 {
		return body
	}
	num := []byte(string(body[start:end]))
	lead := true                                                      // at the first digit of the whole part
	for i := 0; i < len(num) && num[i] != 'e' && num[i] != 'E'; i++ { // the exponent stays
		switch c := num[i]; {
		case c == '.':
			lead = false
		case c < '0' || c > '9': // a sign
		case lead:
			lead = false
			if several := i+1 < len(num) && '0' <= num[i+1] && num[i+1] <= '9'; several || c != '0' {
				num[i] = byte('1' + rand.IntN(9))
			}
		default:
			num[i] = byte('0' + rand.IntN(10))
		}
	}
	out := make([]byte, 0, len(body))
	out = append(out, body[:start]...)
	out = append(out, num...)
	return append(out, body[end:]...)
}

// numberAt returns the byte range of body's first number as AltBody finds it, or -1,
// -1.
func numberAt(body []byte) (start, end int) {
	if json.Valid(body) {
		return firstJSONNumber(body)
	}
	if loc := digits.FindIndex(body); loc != nil {
		return loc[0], loc[1]
	}
	return -1, -1
}

// firstJSONNumber returns the byte range of the first number token of a valid JSON
// text, or -1, -1.
func firstJSONNumber(body []byte) (start, end int) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil { // io.EOF: no number
			return -1, -1
		}
		if n, ok := tok.(json.Number); ok {
			end := int(dec.InputOffset())
			return end - len(n), end
		}
	}
}

// changeNumber changes a number as AltBody says.
func changeNumber(s string) string {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n >= 2 {
			return strconv.FormatInt(n-1, 10)
		}
		return strconv.FormatInt(n+1, 10)
	}
	b := []byte(s)
	for i := len(b) - 1; i >= 0; i-- {
		if c := b[i]; '0' <= c && c <= '9' {
			b[i] = '0' + (c-'0'+1)%10
			break
		}
	}
	return string(b)
}

// jsonObject reports whether body is a JSON object.
func jsonObject(body []byte) bool {
	var obj map[string]json.RawMessage
	return json.Unmarshal(body, &obj) == nil && obj != nil
}

// summary renders a body in a few words for a one-line description: an HTML page
// by its title and its first text ("Error: Misuse of the idempotency key."), a JSON
// body as it is, any other text by its first line; at most 80 bytes.
func summary(contentType string, body []byte) string {
	s := ""
	switch {
	case json.Valid(body):
		s = oneLine(string(body))
	case strings.Contains(contentType, "html") || looksHTML(body):
		s = htmlSummary(body)
	default:
		s = firstLine(string(body))
	}
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return s
}

var (
	htmlTitle   = regexp.MustCompile(`(?is)<title[^>]*>(.*?)</title>`)
	htmlDropped = regexp.MustCompile(`(?is)<(head|script|style)\b.*?</(head|script|style)\s*>`)
	htmlBreak   = regexp.MustCompile(`(?i)<(br|/p|/div|/h[1-6]|/li|/tr|/pre)\b[^>]*>`)
	htmlTag     = regexp.MustCompile(`(?s)<[^>]*>`)
)

// looksHTML reports whether a body starts as an HTML document or fragment.
func looksHTML(body []byte) bool {
	b := strings.ToLower(strings.TrimSpace(string(body[:min(len(body), 512)])))
	return strings.HasPrefix(b, "<!doctype html") || strings.HasPrefix(b, "<html") || strings.HasPrefix(b, "<head") || strings.HasPrefix(b, "<body") || strings.HasPrefix(b, "<h1")
}

// htmlSummary is an HTML page's title and first line of text, the title alone when
// the text begins with it.
func htmlSummary(body []byte) string {
	title := ""
	if m := htmlTitle.FindSubmatch(body); m != nil {
		title = oneLine(html.UnescapeString(string(m[1])))
	}
	text := htmlDropped.ReplaceAllString(string(body), "")
	text = htmlBreak.ReplaceAllString(text, "\n")
	text = firstLine(html.UnescapeString(htmlTag.ReplaceAllString(text, "\n")))
	switch {
	case text == "":
		return title
	case title == "" || strings.HasPrefix(text, title):
		return text
	}
	return title + ": " + text
}

// firstLine is the first non-blank line of s, its spaces collapsed.
func firstLine(s string) string {
	for l := range strings.SplitSeq(s, "\n") {
		if l = oneLine(strings.ReplaceAll(l, "\u00a0", " ")); l != "" {
			return l
		}
	}
	return ""
}
