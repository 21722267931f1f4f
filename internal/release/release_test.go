package release_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/release"
)

func TestEveryReleaseIsFoundByItsVersionAndItsTag(t *testing.T) {
	for _, r := range release.Releases {
		for _, name := range []string{r.Version, r.Tag()} {
			if got, ok := release.Lookup(name); !ok || got != r {
				t.Errorf("Lookup(%q) = %v, %v; want %v", name, got, ok, r)
			}
		}
		if len(r.Commit) != 40 {
			t.Errorf("%s: the commit is not a full SHA-1: %q", r, r.Commit)
		}
	}
	if _, ok := release.Lookup("9.9.9"); ok {
		t.Error("Lookup found a release that does not exist")
	}
	if got := release.Previous(); got != release.Releases[len(release.Releases)-1] {
		t.Errorf("Previous() = %v, want the latest release", got)
	}
}

// TestTagsThatExistNameTheReleasesCommits keeps the table and the repository's tags
// in step where the tags were fetched (a clean clone may have none).
func TestTagsThatExistNameTheReleasesCommits(t *testing.T) {
	for _, r := range release.Releases {
		out, err := exec.Command("git", "rev-parse", "--verify", "--quiet", r.Tag()+"^{commit}").Output()
		if err != nil {
			t.Logf("no tag %s here", r.Tag())
			continue
		}
		if got := strings.TrimSpace(string(out)); got != r.Commit {
			t.Errorf("tag %s names %s, the table %s", r.Tag(), got, r.Commit)
		}
	}
}

func TestACommitMissingFromTheHistoryIsErrNoHistory(t *testing.T) {
	missing := release.Release{Version: "0.0.0", Commit: strings.Repeat("0", 40)}
	_, err := release.Builder{CacheDir: t.TempDir()}.Build(context.Background(), missing)
	if !errors.Is(err, release.ErrNoHistory) {
		t.Fatalf("Build of a commit that is not in the history: %v, want ErrNoHistory", err)
	}
}

// TestConcurrentBuildsOfAReleaseBuildItOnceAndItRuns builds the previous release into
// an empty cache from three goroutines: one builds, the others wait and take its
// binary, which runs and names the release's commit.
func TestConcurrentBuildsOfAReleaseBuildItOnceAndItRuns(t *testing.T) {
	r := release.Previous()
	b := release.Builder{CacheDir: t.TempDir()}
	bins := make([]release.Binary, 3)
	errs := make([]error, len(bins))
	var wg sync.WaitGroup
	for i := range bins {
		wg.Go(func() { bins[i], errs[i] = b.Build(context.Background(), r) })
	}
	wg.Wait()
	built := 0
	for i, err := range errs {
		if errors.Is(err, release.ErrNoHistory) {
			release.ForTest(t, r) // skips, or fails under CI=true
		}
		if err != nil {
			t.Fatal(err)
		}
		if bins[i].Path != bins[0].Path {
			t.Errorf("two paths for one release: %s and %s", bins[i].Path, bins[0].Path)
		}
		if bins[i].Built > 0 {
			built++
			t.Logf("built %s in %v", r, bins[i].Built)
		}
	}
	if built != 1 {
		t.Errorf("%d of %d concurrent calls built the release, want 1", built, len(bins))
	}
	out, err := exec.Command(bins[0].Path, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), r.Commit[:12]) {
		t.Fatalf("%s version: %v\n%s\nwant its commit %s", bins[0].Path, err, out, r.Commit)
	}
	again, err := b.Build(context.Background(), r)
	if err != nil || again.Built != 0 || again.Path != bins[0].Path {
		t.Fatalf("a build after the first: %+v, %v; want the cached binary", again, err)
	}
}

// TestPreviousIsTheReleaseBeforeThisOne keeps the table in step with idem.Release:
// the skew test runs the release of the previous minor version beside this one.
func TestPreviousIsTheReleaseBeforeThisOne(t *testing.T) {
	var major, minor, patch int
	if _, err := fmt.Sscanf(idem.Release, "%d.%d.%d", &major, &minor, &patch); err != nil {
		t.Fatalf("idem.Release %q: %v", idem.Release, err)
	}
	want := fmt.Sprintf("%d.%d.", major, minor-1)
	if patch > 0 {
		want = fmt.Sprintf("%d.%d.", major, minor) // a patch release follows its minor's .0
	}
	if prev := release.Previous(); !strings.HasPrefix(prev.Version, want) {
		t.Errorf("the previous release is %s, but this one is %s: add the release before it to release.Releases", prev, idem.Release)
	}
}

// TestForTestSkipsWithoutTheCommitOutsideCI: a clone without a release's commit (a
// shallow one) skips the tests that need the release, unless CI=true.
func TestForTestSkipsWithoutTheCommitOutsideCI(t *testing.T) {
	t.Setenv("CI", "")
	missing := release.Release{Version: "0.0.0", Commit: strings.Repeat("0", 40)}
	skipped := false
	t.Run("needs 0.0.0", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		release.ForTest(t, missing)
		t.Error("ForTest returned a binary of a commit that is not in the history")
	})
	if !skipped {
		t.Fatal("the test that needs a release missing from the history did not skip")
	}
}
