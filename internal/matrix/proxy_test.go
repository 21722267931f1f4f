package matrix

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/proxy"
)

// upstream is a Go API behind the proxy: POST /v1/charges makes one effect per
// request, counted by the derived key the proxy sends, and answers 201 chunked (no
// Content-Length) or, for stream, an event stream; each answer names its execution.
type upstream struct {
	mu      sync.Mutex
	effects map[string]int
	stream  bool
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key") // derived by the proxy
	u.mu.Lock()
	u.effects[key]++
	u.mu.Unlock()
	id := newID()
	if u.stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		fmt.Fprintf(w, "data: %s\n\n", id)
		http.NewResponseController(w).Flush()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"object":"charge"}`, id)
	http.NewResponseController(w).Flush() // chunked: the proxy must store it whole all the same
}

// total is every effect the upstream made.
func (u *upstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.effects {
		n += c
	}
	return n
}

// TestProxyCombinations runs the proxy's cells (SPEC §17): store × --on-lapse × what
// the upstream answers, the proxy in process in front of a Go upstream.
func TestProxyCombinations(t *testing.T) {
	t.Parallel()
	for _, a := range ProxyAnswers {
		for _, s := range ProxyStores {
			for _, lapse := range ProxyOnLapse {
				want := ProxyOutcomes[a]
				t.Run(fmt.Sprintf("%s on %s, --on-lapse %s, is %s", a, s, lapse, want), func(t *testing.T) {
					t.Parallel()
					runProxyCell(t, a, s, lapse, want)
				})
			}
		}
	}
}

func runProxyCell(t *testing.T, kind string, s Store, lapse string, want Outcome) {
	e := openEnv(t, s)
	up := &upstream{effects: map[string]int{}, stream: kind == ProxyStream}
	upSrv := httptest.NewServer(up)
	t.Cleanup(upSrv.Close)
	u, err := url.Parse(upSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	p, err := proxy.New(proxy.Config{Upstream: u, Idem: idem.Config{Store: e.store},
		TakeOverOnLapse: lapse == "take_over", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	_, _, first, retry, conc := sendDuplicates(t, p)

	switch want {
	case ExactlyOnce:
		if first.status != http.StatusCreated || first.replayed || retry.body != first.body || !retry.replayed {
			t.Fatalf("first %v, retry %v; want 201 and its replay", first, retry)
		}
		wantExactlyOnce(t, "the concurrent duplicates", conc)
		if n := up.total(); n != 2 {
			t.Fatalf("the upstream made %d effects for two keys, want 2", n)
		}
		if strings.Contains(logs.String(), "level=ERROR") {
			t.Fatalf("an error was logged by a combination that holds:\n%s", logs)
		}
	case Released:
		// Every answer that is not an in-flight 409 is an execution of its own.
		executed := 0
		seen := map[string]bool{}
		for _, a := range append([]answer{first, retry}, conc...) {
			switch {
			case a.replayed:
				t.Fatalf("an answer %v says it was replayed: a passed-through response is never stored", a)
			case a.status == http.StatusOK:
				if seen[a.body] {
					t.Fatalf("two answers carry one execution's body %q", a.body)
				}
				seen[a.body] = true
				executed++
			case a.status == http.StatusConflict && a.code == idem.CodeRequestInProgress:
			default:
				t.Fatalf("an answer %v is neither a stream nor 409 request_in_progress", a)
			}
		}
		if first.status != http.StatusOK || retry.status != http.StatusOK {
			t.Fatalf("first %v, retry %v; want each streamed, the retry run again", first, retry)
		}
		if n := up.total(); n != executed {
			t.Fatalf("the upstream made %d effects for %d streamed answers", n, executed)
		}
		if !strings.Contains(logs.String(), "level=WARN") {
			t.Fatalf("no warning says the key was released:\n%s", logs)
		}
	}
}
