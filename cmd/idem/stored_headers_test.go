package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// No refusal of a header prints its value: the flag package quotes a value its Set
// refuses, and `idem keys resolve --header 'Authorization: …'` printed the credential.
func TestNoRefusalOfAHeaderPrintsItsValue(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	const secret = "sekrit-0123456789"
	for _, tc := range []struct{ header, want string }{
		{"Authorization: Bearer " + secret, "Authorization carries a credential"},
		{"Cookie: session=" + secret, "Cookie carries a credential"},
		{"X-Auth-Token: " + secret, "X-Auth-Token looks like a credential"},
		{"Authorization Bearer " + secret, "want 'Name: value'"},
		{"X-Ok: a\r\nX-Api-Key: " + secret, "line break"},
	} {
		code, stdout, stderr := runCmd(t, "keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", tc.header)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("--header %q: exit %d, stderr %q; want exit 2 and one line saying %q", tc.header, code, stderr, tc.want)
		}
		if strings.Contains(stdout+stderr, "sekrit") {
			t.Errorf("--header %q: the refusal prints the value: %q", tc.header, stderr)
		}
	}
}

// --stored-header refuses a header whose name looks like a credential's unless
// --allow-stored-header names it; idem keys resolve --header likewise.
func TestCredentialLookingHeadersAreStoredOnlyWhenAllowedByName(t *testing.T) {
	t.Parallel()
	store := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	for _, name := range []string{"X-Auth-Token", "X-Access-Token", "Api-Key", "X-Amz-Security-Token", "X-CSRF-Token"} {
		code, _, stderr := runCmd(t, "proxy", "--store", store, "--upstream", "http://127.0.0.1:1", "--stored-header", name)
		if code != exitUsage || !strings.Contains(strings.ToLower(stderr), strings.ToLower("--stored-header: "+name+" looks like a credential")) {
			t.Errorf("--stored-header %s: exit %d, %q; want a usage error saying it looks like a credential", name, code, stderr)
		}
		// Allowed, the flags pass that check: the next one fails instead.
		code, _, stderr = runCmd(t, "proxy", "--store", store, "--upstream", "http://127.0.0.1:1", "--stored-header", name,
			"--allow-stored-header", strings.ToLower(name), "--upstream-resends", "0")
		if code != exitUsage || !strings.Contains(stderr, "--upstream-resends") {
			t.Errorf("--stored-header %s --allow-stored-header: exit %d, %q; want the check passed", name, code, stderr)
		}
		code, _, stderr = runCmd(t, "keys", "resolve", "--store", store, "--scope", "s", "--key", "key-1234", "--status", "201", "--header", name+": v")
		if code != exitUsage || !strings.Contains(strings.ToLower(stderr), strings.ToLower(name+" looks like a credential")) {
			t.Errorf("keys resolve --header %s: exit %d, %q; want a usage error", name, code, stderr)
		}
	}
	// The core's refusals stand whatever is allowed.
	code, _, stderr := runCmd(t, "proxy", "--store", store, "--upstream", "http://127.0.0.1:1", "--stored-header", "Set-Cookie", "--allow-stored-header", "Set-Cookie")
	if code != exitUsage || !strings.Contains(stderr, "Set-Cookie") {
		t.Errorf("--stored-header Set-Cookie allowed: exit %d, %q; want a usage error", code, stderr)
	}
}
