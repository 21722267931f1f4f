package redis

import (
	"strings"
	"testing"
)

func TestVersionCheckRefusesRedisOlderThanSeven(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"6.2.14", "6.0.0", "5.0.7"} {
		err := versionError("10.0.0.1:6379", v)
		if err == nil || !strings.Contains(err.Error(), "Redis "+v) || !strings.Contains(err.Error(), "7.0 or later") {
			t.Errorf("versionError(%q) = %v, want a refusal naming the version and the requirement", v, err)
		}
	}
	// 255.255.255 is an unstable build; an unparseable version is left to the scripts.
	for _, v := range []string{"7.0.0", "7.0.15", "7.2.4", "8.0.1", "255.255.255", "", "unknown"} {
		if err := versionError("10.0.0.1:6379", v); err != nil {
			t.Errorf("versionError(%q) = %v, want nil", v, err)
		}
	}
}

func TestInfoFieldReadsOneLine(t *testing.T) {
	t.Parallel()
	info := "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n"
	if got := infoField(info, "redis_version"); got != "7.0.15" {
		t.Fatalf("infoField = %q, want 7.0.15", got)
	}
	if got := infoField(info, "redis_mode"); got != "" {
		t.Fatalf("infoField of a missing field = %q, want empty", got)
	}
}
