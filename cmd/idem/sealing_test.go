package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/idem-go/idem/seal/cloudkeys"
	"github.com/idem-go/idem/store/storetest"
)

// keyURL is a base64key:// URL of a key made of b.
func keyURL(b byte) string {
	return "base64key://" + base64.URLEncoding.EncodeToString(bytes.Repeat([]byte{b}, 32))
}

// runningPayments runs `idem payments args…` until stop, and returns its base URL.
func runningPayments(t *testing.T, args ...string) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(testenv.Context(t))
	lines, exit := startPayments(ctx, append(args, "--addr", "127.0.0.1:0")...)
	if !lines.Scan() {
		cancel()
		t.Fatalf("idem payments wrote no start line; exit %d", <-exit)
	}
	m := addrAttr.FindStringSubmatch(lines.Text())
	if m == nil {
		cancel()
		t.Fatalf("start line %q", lines.Text())
	}
	rest := restOfLines(lines)
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-exit
			<-rest
		}
	}
	t.Cleanup(stop)
	return "http://" + m[1], stop
}

// cardCharge posts a charge whose customer is a card number, from the principal of a
// live token, and returns the status and body.
func cardCharge(t *testing.T, base, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/charges", strings.NewReader(`{"amount": 2000, "currency": "usd", "customer_id": "`+storetest.Secrets[0]+`"}`))
	req.Header.Set("Authorization", "Bearer "+storetest.Secrets[1])
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// rawFile is the SQLite file at path and its write-ahead log.
func rawFile(t *testing.T, path string) []byte {
	t.Helper()
	var raw []byte
	for _, f := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		raw = append(raw, b...)
	}
	return raw
}

// paymentsFiles returns the path of a new SQLite store and the flags of idem payments
// on it and on an application database beside it.
func paymentsFiles(t *testing.T) (path string, flags []string) {
	dir := t.TempDir()
	path = filepath.Join(dir, "idem.db")
	return path, []string{"--store", "sqlite:" + path, "--db", "sqlite:" + filepath.Join(dir, "app.db")}
}

func TestPaymentsWithAnEncryptionKeyStoresNoCardNumberNorTokenAndRotates(t *testing.T) {
	t.Parallel()
	path, flags := paymentsFiles(t)
	a, b := keyURL(1), keyURL(2)

	base, stop := runningPayments(t, append(flags, "--encryption-key", a)...)
	status, first := cardCharge(t, base, "key-sealed-a")
	if status != http.StatusCreated || !strings.Contains(first, storetest.Secrets[0]) {
		t.Fatalf("charge: %d %s", status, first)
	}
	stop()
	if s := storetest.HoldsSecret(rawFile(t, path), storetest.Secrets...); s != "" {
		t.Fatalf("the store's file holds %q", s)
	}
	if s := storetest.HoldsSecret(rawFile(t, path), "ch_"); s != "" {
		t.Fatalf("the store's file holds the charge's id in clear")
	}

	// "B,A": A's record replays; a new one is sealed under B.
	base, stop = runningPayments(t, append(flags, "--encryption-key", b+","+a)...)
	if status, again := cardCharge(t, base, "key-sealed-a"); status != http.StatusCreated || again != first {
		t.Fatalf("B,A replays A's record as %d %s, want %s", status, again, first)
	}
	_, second := cardCharge(t, base, "key-sealed-b")
	stop()

	// "B" alone: B's record replays, A's fails closed.
	base, _ = runningPayments(t, append(flags, "--encryption-key", b)...)
	if status, again := cardCharge(t, base, "key-sealed-b"); status != http.StatusCreated || again != second {
		t.Errorf("B replays B's record as %d %s, want %s", status, again, second)
	}
	if status, again := cardCharge(t, base, "key-sealed-a"); status != http.StatusInternalServerError || !strings.Contains(again, "record_unreadable") {
		t.Errorf("B alone answers A's record %d %s, want 500 record_unreadable", status, again)
	}
}

func TestServersWarnOnceThatRecordsAreInClearAndSaySoWhenSealed(t *testing.T) {
	t.Parallel()
	srv, _ := countingUpstream(t)
	up := srv.URL
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"payments", []string{"payments"}, clearRecordsWarning},
		{"proxy", []string{"proxy", "--upstream", up}, clearRecordsWarning},
		{"sealed payments", []string{"payments", "--encryption-key", keyURL(1)}, `listening" addr=`},
		{"sealed proxy", []string{"proxy", "--upstream", up, "--encryption-key", keyURL(1)}, `listening" addr=`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(testenv.Context(t))
			defer cancel()
			pr, pw := io.Pipe()
			exit := make(chan int, 1)
			args := append(tc.args, "--addr", "127.0.0.1:0", "--store", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
			go func() { exit <- run(ctx, args, io.Discard, pw); pw.Close() }()
			var logged []string
			lines := bufio.NewScanner(pr)
			for lines.Scan() {
				logged = append(logged, lines.Text())
				if strings.Contains(lines.Text(), "listening") {
					cancel()
				}
			}
			<-exit
			n := 0
			for _, l := range logged {
				if strings.Contains(l, tc.want) {
					n++
				}
				if strings.Contains(l, "AQEBAQEB") {
					t.Errorf("a log line shows the key: %s", l)
				}
			}
			if n != 1 {
				t.Errorf("logged %q; want one line saying %q", logged, tc.want)
			}
			if sealed := strings.Contains(strings.Join(logged, "\n"), "sealed_under=base64key:"); sealed != (tc.want != clearRecordsWarning) {
				t.Errorf("logged %q; the start line says sealed_under: %v", logged, sealed)
			}
		})
	}
}

func TestKeysGetOpensASealedBodyOnlyWithTheKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store := "sqlite:" + filepath.Join(dir, "idem.db")
	base, stop := runningPayments(t, "--store", store, "--db", "sqlite:"+filepath.Join(dir, "app.db"), "--encryption-key", keyURL(1))
	_, first := cardCharge(t, base, "key-sealed-get")
	stop()
	token := "--token=" + storetest.Secrets[1]
	code, stdout, _ := runCmd(t, "keys", "get", "--store", store, token, "--key", "key-sealed-get", "--encryption-key", keyURL(1))
	if code != exitOK || !strings.Contains(stdout, "sealed under key base64key:") || strings.Contains(stdout, storetest.Secrets[0]) {
		t.Errorf("keys get without --body: exit %d\n%s", code, stdout)
	}
	code, stdout, stderr := runCmd(t, "keys", "get", "--store", store, token, "--key", "key-sealed-get", "--body", "--encryption-key", keyURL(1))
	if code != exitOK || !strings.Contains(stdout, first) {
		t.Errorf("keys get --body with the key: exit %d, stderr %q\n%s; want the body %s", code, stderr, stdout, first)
	}
	code, stdout, stderr = runCmd(t, "keys", "get", "--store", store, token, "--key", "key-sealed-get", "--body", "--encryption-key", keyURL(2))
	if code != exitFailure || strings.Contains(stdout, storetest.Secrets[0]) || !strings.Contains(stderr, "configured key") {
		t.Errorf("keys get --body with another key: exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	code, stdout, stderr = runCmd(t, "keys", "get", "--store", store, "--scope", "nobody-knows", "--key", "key-sealed-get", "--body")
	if code != exitFailure || strings.Contains(stdout, storetest.Secrets[0]) {
		t.Errorf("keys get --body of an unkeyed scope: exit %d, stderr %q\n%s", code, stderr, stdout)
	}
}

func TestKeysResolveSealsTheResponseOfASealedRecord(t *testing.T) {
	t.Parallel()
	url := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	mustRun(t, exitOK, "migrate", "--create", "--store", url)
	ctx, st := openFixtureStore(t, url)
	key, _ := cloudkeys.Open(ctx, keyURL(1))
	ring, err := idem.OpenKeyring(ctx, st.store, key)
	if err != nil {
		t.Fatal(err)
	}
	// A record made under the keyring whose holder died under the policy unknown.
	g := idem.NewGuard(idem.GuardConfig{Store: st.store, Seal: ring, Lease: time.Second})
	call := idem.Call{Scope: "s", Key: "key-lost-sealed", OnLapse: idem.LapseUnknown, Fingerprint: idem.FingerprintInput("op", nil)}
	h, _, err := g.Begin(ctx, call)
	if err != nil {
		t.Fatal(err)
	}
	h.SetOutcomeUnknown()
	_ = h.Complete()

	a := []string{"keys", "resolve", "--store", url, "--scope", "s", "--key", "key-lost-sealed", "--status", "201", "--body", `{"pan":"` + storetest.Secrets[0] + `"}`}
	if _, stderr := mustRun(t, exitFailure, a...); !strings.Contains(stderr, "--encryption-key") {
		t.Errorf("resolving a sealed record without a key says %q; want it to ask for --encryption-key", stderr)
	}
	mustRun(t, exitOK, append(a, "--encryption-key", keyURL(1))...)
	raw, err := st.store.RecordGet(ctx, &idemstore.GetParams{Scope: "s", Key: "key-lost-sealed"})
	if err != nil || storetest.HoldsSecret(raw.Response.Body, storetest.Secrets[0]) != "" {
		t.Fatalf("the resolved record holds %q, %v", raw.Response.Body, err)
	}
	_, replay, err := g.Begin(ctx, call)
	if err != nil || replay == nil || string(replay.Body) != `{"pan":"`+storetest.Secrets[0]+`"}` || replay.Header.Get("Content-Type") != "application/json" {
		t.Errorf("a repeat after the resolution: %+v, %v; want the resolved response", replay, err)
	}
}

// idem keys rewrap retires A after the rotation to B: B alone then replays A's record
// (before, it failed closed: A's data key was wrapped under A only), and A opens
// nothing of the store.
func TestKeysRewrapRetiresTheOldKey(t *testing.T) {
	t.Parallel()
	path, flags := paymentsFiles(t)
	a, b := keyURL(1), keyURL(2)
	base, stop := runningPayments(t, append(flags, "--encryption-key", a)...)
	_, first := cardCharge(t, base, "key-sealed-a")
	stop()
	_, stop = runningPayments(t, append(flags, "--encryption-key", b+","+a)...)
	stop()

	code, stdout, stderr := runCmd(t, "keys", "rewrap", "--store", "sqlite:"+path, "--encryption-key", b+","+a)
	if code != exitOK || !strings.Contains(stdout, "2 generation(s) of the MAC secret, 1 record(s); 0 changed") {
		t.Fatalf("keys rewrap: exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	token := "--token=" + storetest.Secrets[1]
	code, stdout, _ = runCmd(t, "keys", "get", "--store", "sqlite:"+path, token, "--key", "key-sealed-a", "--body", "--encryption-key", a)
	if code != exitFailure || strings.Contains(stdout, storetest.Secrets[0]) {
		t.Errorf("keys get --body with the retired key: exit %d\n%s", code, stdout)
	}
	base, _ = runningPayments(t, append(flags, "--encryption-key", b)...)
	if status, again := cardCharge(t, base, "key-sealed-a"); status != http.StatusCreated || again != first {
		t.Errorf("B alone after the rewrap answers A's record %d %s, want the replay of %s", status, again, first)
	}
	if code, stdout, _ := runCmd(t, "keys", "rewrap", "--store", "sqlite:"+path, "--encryption-key", b); code != exitOK || !strings.Contains(stdout, "0 generation(s) of the MAC secret, 0 record(s)") {
		t.Errorf("a second keys rewrap: exit %d\n%s", code, stdout)
	}
}
