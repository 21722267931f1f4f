package admin_test

import (
	"strings"
	"testing"

	"github.com/idem-go/idem/admin"
)

// An operator's tool refuses to store a header whose name looks like a credential's,
// unless the operator names it as allowed; what the core never stores stays refused
// whatever is allowed, and the refusal names the header only.
func TestStoredHeaderErrorRefusesCredentialLookingNamesUnlessAllowed(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"X-Auth-Token", "x-access-token", "Api-Key", "X-Amz-Security-Token", "X-CSRF-Token",
		"X-Session-Id", "X-Client-Secret", "Cookie2", "X-Xsrf-Token", "Proxy-Authorization-Extra"} {
		err := admin.StoredHeaderError(name)
		if err == nil || !strings.Contains(err.Error(), "looks like a credential") || !strings.Contains(err.Error(), "--allow-stored-header") {
			t.Errorf("StoredHeaderError(%q) = %v, want a refusal naming --allow-stored-header", name, err)
		}
		if err := admin.StoredHeaderError(name, "X-Other", strings.ToUpper(name)); err != nil {
			t.Errorf("StoredHeaderError(%q) allowed by name = %v, want nil", name, err)
		}
	}
	for _, name := range []string{"Authorization", "Set-Cookie", "X-Api-Key", "Date", "Idempotency-Key"} {
		if err := admin.StoredHeaderError(name, name); err == nil {
			t.Errorf("StoredHeaderError(%q) allowed by name = nil, want the core's refusal", name)
		}
	}
	for _, name := range []string{"Content-Type", "X-Request-Id", "X-RateLimit-Remaining", "Retry-After", "Location"} {
		if err := admin.StoredHeaderError(name); err != nil {
			t.Errorf("StoredHeaderError(%q) = %v, want nil", name, err)
		}
	}
}
