package storetest

import (
	"regexp"
	"strings"
	"testing"
)

// TestRunPatternSelectsExactlyTheCallingTest checks the -test.run pattern that children
// are started with: it matches the calling test (and subtest) and no test whose name
// merely starts or ends the same.
func TestRunPatternSelectsExactlyTheCallingTest(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		match   []string
		noMatch []string
	}{
		{"TestClaims", []string{"TestClaims"}, []string{"TestClaimsAcross", "XTestClaims"}},
		{"TestA/sub_test.v2+(x)", []string{"TestA/sub_test.v2+(x)"}, []string{"TestA/sub_testXv2+(x)", "TestA/sub_test.v2+(x)y"}},
	} {
		parts := strings.Split(runPattern(tc.name), "/")
		matches := func(name string) bool {
			elems := strings.Split(name, "/")
			if len(elems) != len(parts) {
				return false
			}
			for i, p := range parts {
				if !regexp.MustCompile(p).MatchString(elems[i]) {
					return false
				}
			}
			return true
		}
		for _, n := range tc.match {
			if !matches(n) {
				t.Errorf("runPattern(%q) = %q does not match %q", tc.name, runPattern(tc.name), n)
			}
		}
		for _, n := range tc.noMatch {
			if matches(n) {
				t.Errorf("runPattern(%q) = %q matches %q", tc.name, runPattern(tc.name), n)
			}
		}
	}
}
