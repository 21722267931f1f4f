package e2e

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dockerfile is what the test reads of ../Dockerfile.
type dockerfile struct {
	buildOut   string            // the binary's path in the build stage (RUN scripts/build-static OUT)
	copies     map[string]string // the run stage's COPY --from=build: source → destination
	uid, gid   int               // USER of the run stage
	workdir    string
	env        map[string]string
	entrypoint []string
	cmd        []string
}

// readDockerfile parses the few instructions the test relies on. Instructions before
// the last FROM belong to the build stage, those after it to the run stage.
func readDockerfile(t *testing.T) dockerfile {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	d := dockerfile{copies: map[string]string{}, env: map[string]string{}, uid: -1}
	runStage := false
	lines := strings.Split(string(b), "\n")
	for i, line := range lines {
		if strings.HasPrefix(line, "FROM ") {
			runStage = !strings.Contains(line, " AS build")
		}
		instr, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch {
		case instr == "RUN" && strings.HasPrefix(rest, "scripts/build-static "):
			d.buildOut = strings.Fields(rest)[1]
		case !runStage:
		case instr == "COPY":
			f := strings.Fields(rest)
			if !slices.Contains(f, "--from=build") {
				t.Fatalf("Dockerfile:%d: the run stage copies %q from outside the build stage", i+1, rest)
			}
			d.copies[f[len(f)-2]] = f[len(f)-1]
		case instr == "USER":
			u, g, _ := strings.Cut(rest, ":")
			d.uid, _ = strconv.Atoi(u)
			d.gid, _ = strconv.Atoi(g)
		case instr == "WORKDIR":
			d.workdir = rest
		case instr == "ENV":
			k, v, _ := strings.Cut(rest, "=")
			d.env[k] = v
		case instr == "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &d.entrypoint); err != nil {
				t.Fatalf("Dockerfile:%d: ENTRYPOINT: %v", i+1, err)
			}
		case instr == "CMD":
			if err := json.Unmarshal([]byte(rest), &d.cmd); err != nil {
				t.Fatalf("Dockerfile:%d: CMD: %v", i+1, err)
			}
		}
	}
	if d.buildOut == "" || d.uid <= 0 || d.gid <= 0 || d.workdir == "" || len(d.entrypoint) == 0 {
		t.Fatalf("Dockerfile: want RUN scripts/build-static OUT, a non-root USER uid:gid, WORKDIR and ENTRYPOINT; read %+v", d)
	}
	return d
}

// The image's binary, built as the Dockerfile builds it (scripts/build-static), is
// static, and `idem payments` runs from a directory holding only what the run stage
// copies, with only the environment the Dockerfile sets, as the Dockerfile's non-root
// user: it starts on its default SQLite store in the working directory and answers
// /healthz; so does `idem proxy` in front of an upstream. This machine has no Docker
// engine; this is the part of the image that can be checked without one.
func TestDockerImageBinaryRunsAsNonRootWithOnlyItsFiles(t *testing.T) {
	t.Parallel()
	d := readDockerfile(t)

	// The build stage, in a scratch directory standing for its filesystem.
	build := t.TempDir()
	out := filepath.Join(build, d.buildOut)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if bin := idemBinary(t); binStatic {
		// The process tests' binary was built by scripts/build-static too: the same
		// build, not a second one of the whole command.
		copyTree(t, bin, out)
	} else if err := runBuild("scripts/build-static", out); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(build, "out", "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	wantStatic(t, out)

	// The run stage's filesystem: only what it copies, owned as it says.
	root, err := os.MkdirTemp("", "idem-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil { // MkdirTemp makes it 0700
		t.Fatal(err)
	}
	asRoot := os.Getuid() == 0
	for src, dst := range d.copies {
		copyTree(t, filepath.Join(build, src), filepath.Join(root, dst))
	}
	if asRoot {
		// COPY --chown: the data directory belongs to the image's user.
		if err := os.Chown(filepath.Join(root, d.workdir), d.uid, d.gid); err != nil {
			t.Fatal(err)
		}
	}

	args := append(slices.Clone(d.entrypoint[1:]), d.cmd...)
	cmd := exec.Command(filepath.Join(root, d.entrypoint[0]), args...)
	cmd.Dir = filepath.Join(root, d.workdir)
	cmd.Env = []string{}
	for k, v := range d.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// The image listens on 0.0.0.0:8080; here any free loopback port will do.
	cmd.Env = append(cmd.Env, "IDEM_ADDR=127.0.0.1:0")
	if asRoot {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(d.uid), Gid: uint32(d.gid)}}
	} else {
		t.Logf("not root: running as uid %d, not as the image's user %d", os.Getuid(), d.uid)
	}
	addr := startImageProcess(t, cmd)

	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", resp.StatusCode)
	}
	db, err := os.Stat(filepath.Join(cmd.Dir, "idem.db"))
	if err != nil {
		t.Fatalf("the default store is not in the working directory: %v", err)
	}
	if st := db.Sys().(*syscall.Stat_t); asRoot && int(st.Uid) != d.uid {
		t.Fatalf("idem.db belongs to uid %d, want the image's user %d", st.Uid, d.uid)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGTERM: %v", err)
	}

	// The same image runs `idem proxy` (compose.yaml's idem-proxy), on the same store.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer upstream.Close()
	proxyCmd := exec.Command(cmd.Path, append(slices.Clone(d.entrypoint[1:]), "proxy", "--upstream", upstream.URL, "--upstream-health-path", "/")...)
	proxyCmd.Dir, proxyCmd.Env, proxyCmd.SysProcAttr = cmd.Dir, cmd.Env, cmd.SysProcAttr
	addr = startImageProcess(t, proxyCmd)
	resp, err = http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("idem proxy's /healthz: %d", resp.StatusCode)
	}
	if err := proxyCmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := proxyCmd.Wait(); err != nil {
		t.Fatalf("idem proxy after SIGTERM: %v", err)
	}
}

// wantStatic fails unless the ELF file at path needs no interpreter and no shared
// library.
func wantStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("%s is dynamically linked (program header %v)", path, p.Type)
		}
	}
}

// copyTree copies the file or directory src to dst, as COPY does.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	if b, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp %s %s: %v\n%s", src, dst, err, b)
	}
}

// startImageProcess starts cmd and returns the address of its listening line; the
// process is killed at cleanup, and its output logged when the test failed.
func startImageProcess(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	logs := &logBuffer{}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("output:\n%s", logs.String())
		}
	})
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(logs, sc.Text())
			if m := listeningRe.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case listening <- m[1]:
				default:
				}
			}
		}
		close(listening)
	}()
	select {
	case addr, ok := <-listening:
		if !ok {
			t.Fatalf("exited before listening; output:\n%s", logs.String())
		}
		return addr
	case <-time.After(startTimeout):
		t.Fatalf("no listening line within %v; output:\n%s", startTimeout, logs.String())
	}
	return ""
}

var idemVariable = regexp.MustCompile(`\bIDEM_[A-Z_]+\b`)

// composeServices returns the services of compose.yaml by name, each its block of lines.
func composeServices(t *testing.T, compose string) map[string]string {
	t.Helper()
	_, services, ok := strings.Cut(compose, "\nservices:\n")
	if !ok {
		t.Fatal("compose.yaml has no services")
	}
	services, _, _ = strings.Cut(services, "\nvolumes:\n")
	blocks := map[string]string{}
	name := ""
	for _, line := range strings.Split(services, "\n") {
		if m := regexp.MustCompile(`^  ([a-z][a-z0-9-]*):$`).FindStringSubmatch(line); m != nil {
			name = m[1]
			continue
		}
		if name != "" {
			blocks[name] += line + "\n"
		}
	}
	return blocks
}

// Every IDEM_ variable that the Dockerfile sets is a flag's variable of each serving
// subcommand the image runs (idem payments, its CMD, and idem proxy), and every one a
// compose service sets is one of the subcommand that service runs (its command, or
// the image's CMD); the files the services mount exist; and Prometheus scrapes the
// compose services' metrics listeners.
func TestDeployFilesSetOnlyRealFlagsAndScrapeTheMetricsListeners(t *testing.T) {
	t.Parallel()
	help := map[string]string{}
	for _, cmd := range []string{"payments", "proxy"} {
		help[cmd] = mustRunIdem(t, cmd, "--help").stdout
	}
	d := readDockerfile(t)
	dockerfile, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range idemVariable.FindAllString(string(dockerfile), -1) {
		for cmd, h := range help {
			if !strings.Contains(h, "[$"+v+"]") {
				t.Errorf("the Dockerfile sets %s, which is no flag's variable of idem %s", v, cmd)
			}
		}
	}
	compose, err := os.ReadFile("../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	services := composeServices(t, string(compose))
	built := 0
	for name, block := range services {
		if !strings.Contains(block, "    build: .\n") {
			if vars := idemVariable.FindAllString(block, -1); len(vars) > 0 {
				t.Errorf("compose.yaml's %s sets %v but does not run the image", name, vars)
			}
			continue
		}
		built++
		cmd := d.cmd[0]
		if m := regexp.MustCompile(`\n    command: \["([a-z]+)"`).FindStringSubmatch("\n" + block); m != nil {
			cmd = m[1]
		}
		h, ok := help[cmd]
		if !ok {
			t.Errorf("compose.yaml's %s runs idem %s, which this test does not know", name, cmd)
			continue
		}
		for _, v := range idemVariable.FindAllString(block, -1) {
			if !strings.Contains(h, "[$"+v+"]") {
				t.Errorf("compose.yaml's %s sets %s, which is no flag's variable of idem %s", name, v, cmd)
			}
		}
	}
	if built < 3 {
		t.Fatalf("compose.yaml runs the image in %d services, want idem, idem-redis and idem-proxy: %v", built, services)
	}
	for _, mount := range regexp.MustCompile(`- \./([^:\s]+):`).FindAllStringSubmatch(string(compose), -1) {
		if _, err := os.Stat("../" + mount[1]); err != nil {
			t.Errorf("compose.yaml mounts %s: %v", mount[1], err)
		}
	}
	prom, err := os.ReadFile("../deploy/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`targets: \["([a-z-]+):(\d+)"\]`).FindAllStringSubmatch(string(prom), -1) {
		if !strings.Contains(services[m[1]], "IDEM_METRICS_ADDR: 0.0.0.0:"+m[2]) {
			t.Errorf("Prometheus scrapes %s:%s, but compose.yaml has no such service with IDEM_METRICS_ADDR on that port", m[1], m[2])
		}
	}
}
