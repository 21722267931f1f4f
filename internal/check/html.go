package check

import (
	"html/template"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
)

// WriteHTML writes the report as one self-contained HTML page (no script, no file or
// address outside it): the totals, then each check as a collapsible block whose
// summary is its verdict, name and summary line, and whose body holds its doc line,
// its rule and every exchange of its evidence (request and answer, headers and body).
// The blocks of the checks that failed or warned are open, and so are
// the exchanges of a check that has at most four.
func (r *Report) WriteHTML(w io.Writer) error {
	return page.Execute(w, r)
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"upper":   func(s Status) string { return strings.ToUpper(string(s)) },
	"headers": sortedHeaders,
	"open":    func(s Status) bool { return s == StatusFail || s == StatusWarn },
	"body":    pageBody,
}).Parse(pageHTML))

// pageBody renders a body on the page: the body when the report has it (up to 4
// KiB), else its length and hash.
func pageBody(body, sum string, n int) string {
	if body != "" {
		return body
	}
	return shownText("", sum, n)
}

// headerLine is one header field as the page shows it.
type headerLine struct{ Name, Value string }

// sortedHeaders returns the fields of h sorted by name.
func sortedHeaders(h http.Header) []headerLine {
	var out []headerLine
	for _, k := range slices.Sorted(maps.Keys(h)) {
		for _, v := range h[k] {
			out = append(out, headerLine{k, v})
		}
	}
	return out
}

const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}}</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em; padding: 0 1em; color: #1d1d1f; }
h1 { font-size: 1.3em; margin-bottom: .2em; word-break: break-all; }
.meta { color: #555; margin-bottom: 1.5em; }
details { border: 1px solid #ddd; border-radius: 6px; margin: .5em 0; }
details > summary { cursor: pointer; padding: .6em .8em; list-style-position: inside; }
details > div { padding: 0 1em 1em; }
.badge { display: inline-block; width: 3.4em; text-align: center; font-weight: 600; font-size: .8em; border-radius: 4px; padding: .1em 0; margin-right: .6em; color: #fff; }
.pass { background: #1a7f37; } .fail { background: #cf222e; } .warn { background: #bf8700; } .skip { background: #6e7781; }
.name { font-family: ui-monospace, monospace; font-weight: 600; margin-right: .8em; }
.rule { color: #555; }
details.x { border: none; border-top: 1px solid #eee; border-radius: 0; margin: 0; }
details.x > summary { padding: .4em 0; font-size: .95em; }
pre { background: #f6f8fa; padding: .5em .7em; border-radius: 4px; overflow-x: auto; white-space: pre-wrap; word-break: break-all; margin: .3em 0; font-size: .85em; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<div class="meta">{{.Totals}} · started {{.Started.Format "2006-01-02 15:04:05 UTC"}} · {{.Rounds}} rounds of {{.Concurrency}} duplicates at once{{if .Instances}} · instances: {{.URL}}{{range .Instances}}, {{.}}{{end}}{{end}} · polling: {{.Polling}}{{with .Baseline}} · baseline {{.File}}: {{.Summary}}{{end}} · rules cite docs/spec.md (§N) and {{.Draft}}</div>
{{if .Hint}}<p><strong>hint:</strong> {{.Hint}}</p>{{end}}
{{range .Checks}}
<details class="check"{{if open .Status}} open{{end}}><summary><span class="badge {{.Status}}">{{upper .Status}}</span><span class="name">{{.Name}}</span>{{if .Accepted}}(accepted by the baseline) {{end}}{{.Summary}}</summary>
<div>
<p>{{.Doc}}<br><span class="rule">rule: {{.Rule}}</span>{{if .Causes}}<br><span class="rule">causes: {{range $i, $c := .Causes}}{{if $i}}, {{end}}{{$c}}{{end}}</span>{{end}}{{if .Created}}<br><span class="rule">created {{.Created}} resource(s)</span>{{end}}</p>
{{$many := gt (len .Evidence) 4}}{{range .Evidence}}
<details class="x"{{if not $many}} open{{end}}>
<summary>{{.Label}}: {{.Outcome}} <span class="rule">({{if .Instance}}instance {{.Instance}}, {{end}}{{.Elapsed}})</span></summary>
<pre>{{.Request.Method}} {{.Request.URL}}
{{range headers .Request.Header}}{{.Name}}: {{.Value}}
{{end}}{{with body .Request.Body .Request.BodySHA256 .Request.BodyBytes}}
{{.}}{{end}}</pre>
{{if .Response}}<pre>{{.Response.Status}}
{{range headers .Response.Header}}{{.Name}}: {{.Value}}
{{end}}{{with body .Response.Body .Response.BodySHA256 .Response.BodyBytes}}
{{.}}{{end}}{{if .Resource}}
(resource: {{.Resource}}){{end}}</pre>{{else}}<pre>no answer: {{.Error}}</pre>{{end}}
</details>
{{end}}
</div>
</details>
{{end}}
</body>
</html>
`
