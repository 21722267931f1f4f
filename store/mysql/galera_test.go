package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/mysqltest"
	"github.com/idem-go/idem/store/mysql"
)

// galeraAPI is one process of an API on one node of the cluster: POST /respond/{key}
// claims its key in the handler's transaction (Respond), POST /lease/{key} claims it
// under a lease and completes it in InTx; both insert one charge.
type galeraAPI struct {
	node  *mysqltest.GaleraNode
	store *mysql.Store
	srv   *httptest.Server
}

func newGaleraAPI(t *testing.T, node *mysqltest.GaleraNode) *galeraAPI {
	t.Helper()
	st, err := mysql.Open(t.Context(), node.DSN, mysql.Config{MaxOpenConns: 8, DisableCleaner: true})
	if err != nil {
		t.Fatalf("%s: %v", node.Name, err)
	}
	t.Cleanup(func() { _ = st.Close() })
	mw := idem.New(idem.Config{Store: st, Scope: func(*http.Request) (string, error) { return "galera", nil }})
	insert := func(ctx context.Context, tx *sql.Tx, r *http.Request) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO charges (`key`, node) VALUES (?, ?)", r.PathValue("key"), node.Name)
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /respond/{key}", mw.Route(idem.RouteOptions{ClaimInHandler: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := st.Respond(w, r, func(ctx context.Context, tx *sql.Tx) (*idem.Response, error) {
			if err := insert(ctx, tx, r); err != nil {
				return nil, err
			}
			return idem.JSONResponse(http.StatusCreated, map[string]string{"node": node.Name})
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})))
	mux.Handle("POST /lease/{key}", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := st.InTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			if err := insert(ctx, tx, r); err != nil {
				return err
			}
			w.WriteHeader(http.StatusCreated)
			_, err := fmt.Fprint(w, node.Name)
			return err
		})
		if err != nil {
			t.Logf("%s: InTx: %v", node.Name, err)
		}
	})))
	a := &galeraAPI{node: node, store: st, srv: httptest.NewServer(mux)}
	t.Cleanup(a.srv.Close)
	return a
}

// post sends a keyed POST and returns its status, or 0 when the request failed.
func (a *galeraAPI) post(ctx context.Context, path, key string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.srv.URL+path+key, strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// certFailures sums the nodes' certification failures and brute-force aborts: the
// races Galera settled at commit.
func certFailures(t *testing.T, apis []*galeraAPI) int {
	t.Helper()
	total := 0
	for _, a := range apis {
		for _, v := range []string{"wsrep_local_cert_failures", "wsrep_local_bf_aborts"} {
			var name string
			var n int
			if err := a.store.DB().QueryRow(`SHOW GLOBAL STATUS LIKE '`+v+`'`).Scan(&name, &n); err == nil {
				total += n
			}
		}
	}
	return total
}

// TestGaleraRunsEachKeyOnceAcrossNodesAndLosesNoCompletedRecord: on a three-node
// MariaDB Galera cluster, every node taking requests, (1) duplicates of one key sent
// to the three nodes at once run once, on a ClaimInHandler route (Respond) and on a
// lease route (InTx), and are answered 201 or 409, never a 5xx: a certification
// failure at commit is a lost race; (2) a node killed with SIGKILL under load loses no
// record whose request was answered 201: each is on the surviving nodes, completed,
// with its one charge.
func TestGaleraRunsEachKeyOnceAcrossNodesAndLosesNoCompletedRecord(t *testing.T) {
	t.Parallel()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 110*time.Second)
	defer cancel()
	nodes := mysqltest.StartGalera(t, 3, 75*time.Second)
	t.Logf("3-node Galera cluster synced in %v", time.Since(start).Round(time.Millisecond))

	first, err := mysql.Open(ctx, nodes[0].DSN, mysql.Config{MaxOpenConns: 2, DisableCleaner: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Migrate(ctx); err != nil {
		t.Fatalf("Migrate on %s: %v", nodes[0].Name, err)
	}
	if _, err := first.DB().ExecContext(ctx, "CREATE TABLE charges (`key` VARCHAR(255) NOT NULL, node VARCHAR(8) NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	_ = first.Close()
	apis := make([]*galeraAPI, len(nodes))
	for i, n := range nodes {
		apis[i] = newGaleraAPI(t, n)
	}
	certBefore := certFailures(t, apis)

	// (1) Duplicates across nodes.
	const keys = 60
	var statuses sync.Map // status → *atomic.Int64
	count := func(status int) {
		v, _ := statuses.LoadOrStore(status, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	var wg sync.WaitGroup
	for i := range keys {
		path := "/respond/"
		if i%2 == 1 {
			path = "/lease/"
		}
		key := fmt.Sprintf("galera-duplicate-%06d", i)
		for _, a := range apis {
			wg.Go(func() { count(a.post(ctx, path, key)) })
		}
	}
	wg.Wait()
	summary := map[int]int64{}
	statuses.Range(func(k, v any) bool { summary[k.(int)] = v.(*atomic.Int64).Load(); return true })
	var runs []int
	if err := apis[0].store.DB().QueryRowContext(ctx, "SELECT count(*), count(DISTINCT `key`) FROM charges WHERE `key` LIKE 'galera-duplicate-%'").
		Scan(new(int), new(int)); err != nil {
		t.Fatal(err)
	}
	rows, err := apis[0].store.DB().QueryContext(ctx, "SELECT count(*) FROM charges WHERE `key` LIKE 'galera-duplicate-%' GROUP BY `key`")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n int
		_ = rows.Scan(&n)
		runs = append(runs, n)
	}
	rows.Close()
	twice := 0
	for _, n := range runs {
		if n != 1 {
			twice++
		}
	}
	certDup := certFailures(t, apis) - certBefore
	t.Logf("duplicates: %d keys × 3 nodes: answers %v; keys run %d, run more than once %d; certification failures and aborts on the nodes %d",
		keys, summary, len(runs), twice, certDup)
	if len(runs) != keys || twice != 0 {
		t.Errorf("%d of %d keys ran, %d more than once; want each exactly once", len(runs), keys, twice)
	}
	for status, n := range summary {
		if status != http.StatusCreated && status != http.StatusConflict {
			t.Errorf("%d answers %d; want only 201 (the execution, or a replay) and 409 (in progress)", n, status)
		}
	}

	// (2) A node killed under load.
	load, stopLoad := context.WithCancel(ctx)
	var (
		mu        sync.Mutex
		completed []string
		answers   = map[string]map[int]int{} // node → status → count
		seq       atomic.Int64
	)
	for w := range 6 {
		wg.Go(func() {
			for load.Err() == nil {
				a := apis[w%len(apis)]
				key := fmt.Sprintf("galera-load-%d-%06d", w, seq.Add(1))
				path := "/respond/"
				if w%2 == 1 {
					path = "/lease/"
				}
				status := a.post(load, path, key)
				mu.Lock()
				if status == http.StatusCreated {
					completed = append(completed, key)
				}
				if answers[a.node.Name] == nil {
					answers[a.node.Name] = map[int]int{}
				}
				answers[a.node.Name][status]++
				mu.Unlock()
			}
		})
	}
	time.Sleep(time.Second)
	nodes[2].Kill()
	mu.Lock()
	killedAt := len(completed)
	mu.Unlock()
	time.Sleep(5 * time.Second)
	stopLoad()
	wg.Wait()

	lost := 0
	for _, key := range completed {
		for _, a := range apis[:2] {
			rec, err := a.store.RecordGet(ctx, &idemstore.GetParams{Scope: "galera", Key: key})
			if err != nil || rec.State != idemstore.StateCompleted || rec.Response.Status != http.StatusCreated {
				lost++
				t.Errorf("%s on %s after the kill: %+v, %v; want its completed 201", key, a.node.Name, rec, err)
				continue
			}
		}
		var n int
		if err := apis[0].store.DB().QueryRowContext(ctx, "SELECT count(*) FROM charges WHERE `key` = ?", key).Scan(&n); err != nil || n != 1 {
			t.Errorf("%s has %d charges (%v), want 1", key, n, err)
		}
	}
	t.Logf("node %s killed under load: %d requests answered 201 (%d before the kill); answers by node %v (0: no answer, "+
		"the killed node's); completed records lost on the surviving nodes: %d; test took %v",
		nodes[2].Name, len(completed), killedAt, answers, lost, time.Since(start).Round(time.Millisecond))
	if len(completed) <= killedAt {
		t.Errorf("no request completed after the kill: the surviving nodes stopped serving")
	}
	for _, node := range nodes[:2] {
		for status, n := range answers[node.Name] {
			if status >= 500 {
				t.Logf("%s answered %d %d times (requests in flight while the cluster reconfigured)", node.Name, n, status)
			}
		}
	}
}
