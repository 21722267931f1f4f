//go:build !unix

package release

import "context"

// lock is a no-op where flock is missing: builds are serialised within a process only.
func lock(context.Context, string) (func(), error) { return func() {}, nil }
