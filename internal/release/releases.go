// Package release builds the idem command of an earlier release from the repository's
// own git history, so that tests can run it beside the current build on one store
// (the version-skew policy, SPEC §20; e2e's TestVersionSkew).
//
// A release is named by its version and found by its commit, from the table below: a
// clean clone in CI may have the history but not the tags. Build checks the commit out
// with `git worktree add --detach` into a temporary directory, builds ./cmd/idem there
// as scripts/build-static builds the image's binary (CGO_ENABLED=0, -trimpath), so the
// build shares the module cache and most of the build cache with the current one, and
// keeps the binary in a cache of its own (~/.cache/idem/release/<commit>/idem), under a
// lock that serialises concurrent builds of one commit across processes.
package release

import "fmt"

// Release is a tagged release of idem: its version (without the tag's "v") and the
// commit the tag names.
type Release struct {
	Version string
	Commit  string
}

// Tag returns the git tag of r, "v" and its version.
func (r Release) Tag() string { return "v" + r.Version }

// String returns the tag and a short commit, as in "v0.2.0 (b644b59)".
func (r Release) String() string { return fmt.Sprintf("%s (%.7s)", r.Tag(), r.Commit) }

// Releases are idem's releases, oldest first: the commit each tag names. A release
// adds its line here when it is tagged (CHANGELOG.md has a section of the same version
// at the same commit).
var Releases = []Release{
	{Version: "0.1.0", Commit: "8be3c3d27311081cb3739ea1960a739888d265b2"},
	{Version: "0.2.0", Commit: "b644b591d9d236bf23b8c2f4582b7051b2be96cc"},
}

// Previous returns the latest release: the one that shares a store with the current
// build in a rolling upgrade or a rollback (SPEC §20: two adjacent releases).
func Previous() Release { return Releases[len(Releases)-1] }

// Lookup returns the release of version (with or without the tag's "v").
func Lookup(version string) (Release, bool) {
	for _, r := range Releases {
		if r.Version == version || r.Tag() == version {
			return r, true
		}
	}
	return Release{}, false
}
