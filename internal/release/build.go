package release

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// DefaultBuildTimeout bounds one build of a release. Measured for 0.2.0 on the shared
// two-core machine (load 10 to 20): 4 min 32 s with an empty build cache (the modules
// downloaded); 1 min 12 s right after this build's scripts/build-static, whose
// compiled dependencies it shares, as in CI; 5 s with the cache of an earlier build of
// it; nothing once the binary is in the cache.
const DefaultBuildTimeout = 10 * time.Minute

// ErrNoHistory is returned by Build when the repository's history does not hold the
// release's commit (a shallow clone), or when there is no git to read it with.
var ErrNoHistory = errors.New("release: the repository's history does not hold the release's commit (a shallow clone? git fetch --unshallow)")

// Builder builds the idem command of releases. Its zero value builds from the
// repository around the current directory into the user's cache.
type Builder struct {
	// Repo is a directory inside the git repository whose history holds the
	// releases. Defaults to the current directory.
	Repo string
	// CacheDir keeps the binaries, one directory per commit (CacheDir/<commit>/idem).
	// Defaults to idem/release under os.UserCacheDir (~/.cache/idem/release).
	CacheDir string
	// Timeout bounds one build. Defaults to DefaultBuildTimeout.
	Timeout time.Duration
}

// Binary is the idem command of a release.
type Binary struct {
	Release Release
	// Path is the binary's path, in the builder's cache.
	Path string
	// Built is how long this call's build took; 0 when the binary was in the cache.
	Built time.Duration
}

// inProcess serialises builds within the process; the lock file, across processes.
var inProcess sync.Mutex

// Build returns r's binary: from the cache, or built from r's commit and kept there.
// Concurrent calls, in this process or others sharing the cache, build it once.
func (b Builder) Build(ctx context.Context, r Release) (Binary, error) {
	cache, err := b.cacheDir()
	if err != nil {
		return Binary{}, err
	}
	dir := filepath.Join(cache, r.Commit)
	bin := Binary{Release: r, Path: filepath.Join(dir, "idem")}
	if _, err := os.Stat(bin.Path); err == nil {
		return bin, nil
	}
	if err := b.haveCommit(ctx, r); err != nil {
		return Binary{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Binary{}, fmt.Errorf("release: %w", err)
	}
	inProcess.Lock()
	defer inProcess.Unlock()
	unlock, err := lock(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return Binary{}, fmt.Errorf("release: locking the build of %s: %w", r, err)
	}
	defer unlock()
	if _, err := os.Stat(bin.Path); err == nil {
		return bin, nil // another process built it while this one waited
	}
	start := time.Now()
	if err := b.build(ctx, r, bin.Path); err != nil {
		return Binary{}, err
	}
	bin.Built = time.Since(start)
	return bin, nil
}

func (b Builder) cacheDir() (string, error) {
	if b.CacheDir != "" {
		return b.CacheDir, nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("release: no cache directory: %w", err)
	}
	return filepath.Join(dir, "idem", "release"), nil
}

// haveCommit returns ErrNoHistory unless the repository holds r's commit.
func (b Builder) haveCommit(ctx context.Context, r Release) error {
	if _, err := exec.LookPath("git"); err != nil {
		return fmt.Errorf("%w: %v", ErrNoHistory, err)
	}
	if _, err := b.git(ctx, "cat-file", "-e", r.Commit+"^{commit}"); err != nil {
		dir, _ := filepath.Abs(b.repo())
		return fmt.Errorf("%w: %s is not in the git history of %s", ErrNoHistory, r, dir)
	}
	return nil
}

// build checks r's commit out in a temporary worktree and builds its ./cmd/idem to
// out, as scripts/build-static builds the image's binary.
func (b Builder) build(ctx context.Context, r Release, out string) error {
	timeout := b.Timeout
	if timeout == 0 {
		timeout = DefaultBuildTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tmp, err := os.MkdirTemp("", "idem-release-")
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "src")
	// A build killed before its cleanup leaves a registration of a worktree whose
	// directory is gone; the next one uses another directory, and git prunes it.
	if _, err := b.git(ctx, "worktree", "add", "--detach", "--quiet", src, r.Commit); err != nil {
		return fmt.Errorf("release: checking out %s: %w", r, err)
	}
	defer b.git(context.WithoutCancel(ctx), "worktree", "remove", "--force", src) //nolint:errcheck // the temporary directory goes anyway

	partial := out + ".partial"
	ldflags := "-s -w -X main.buildCommit=" + r.Commit + " -X github.com/idem-go/idem.buildRevision=" + r.Commit
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", partial, "./cmd/idem")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	cmd.WaitDelay = 10 * time.Second
	if output, err := cmd.CombinedOutput(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("not done within %v: %w", timeout, err)
		}
		return fmt.Errorf("release: building %s: %v\n%s", r, err, output)
	}
	if err := os.Rename(partial, out); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

func (b Builder) repo() string {
	if b.Repo == "" {
		return "."
	}
	return b.Repo
}

// git runs git in the repository and returns its standard output.
func (b Builder) git(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", b.repo()}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}
