package check

import (
	"bytes"
	"encoding/json"
	"html"
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
	start, end := -1, -1
	if json.Valid(body) {
		start, end = firstJSONNumber(body)
	} else if loc := digits.FindIndex(body); loc != nil {
		start, end = loc[0], loc[1]
	}
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
