package secret_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/secret"
)

func TestRedactURLHidesEveryPasswordOfEveryStoreURLForm(t *testing.T) {
	t.Parallel()
	cases := []struct{ raw, want string }{
		// userinfo
		{"postgres://u:secret@db.example:5432/app", "postgres://u:xxxxx@db.example:5432/app"},
		{"postgresql://u:s%40cret@db/app?sslmode=require", "postgresql://u:xxxxx@db/app?sslmode=require"},
		{"redis://:secret@127.0.0.1:6379/0", "redis://:xxxxx@127.0.0.1:6379/0"},
		{"rediss://u:secret@cache:6380", "rediss://u:xxxxx@cache:6380"},
		{"redis+cluster://u:secret@n1:7000?addr=n2:7000&addr=n3:7000", "redis+cluster://u:xxxxx@n1:7000?addr=n2:7000&addr=n3:7000"},
		{"rediss+cluster://:secret@n1:7000", "rediss+cluster://:xxxxx@n1:7000"},
		// query parameters: pgx's password and sslpassword, go-redis's, any spelling
		{"postgres://u@db/app?password=secret&sslmode=disable", "postgres://u@db/app?password=xxxxx&sslmode=disable"},
		{"postgres://u@db/app?sslmode=verify-full&sslpassword=secret", "postgres://u@db/app?sslmode=verify-full&sslpassword=xxxxx"},
		{"postgres://u@db/app?pass%77ord=secret", "postgres://u@db/app?pass%77ord=xxxxx"},
		{"postgres://u@db/app?PASSWORD=secret&application_name=idem", "postgres://u@db/app?PASSWORD=xxxxx&application_name=idem"},
		{"redis://127.0.0.1:6379/0?password=secret&dial_timeout=1s", "redis://127.0.0.1:6379/0?password=xxxxx&dial_timeout=1s"},
		{"redis+cluster://n1:7000?addr=n2:7000&sentinel_password=secret", "redis+cluster://n1:7000?addr=n2:7000&sentinel_password=xxxxx"},
		{"postgres://u:secret@db/app?password=secret2", "postgres://u:xxxxx@db/app?password=xxxxx"},
		// sqlite file: URIs
		{"sqlite:file:idem.db?_pragma=busy_timeout(5000)&password=secret", "sqlite:file:idem.db?_pragma=busy_timeout(5000)&password=xxxxx"},
		{"sqlite://file:/var/lib/idem.db?token=secret", "sqlite://file:/var/lib/idem.db?token=xxxxx"},
		// nothing to hide: as given, even where url.URL.String would respell it
		{"SQLite:x.db", "SQLite:x.db"},
		{"sqlite:file:x.db?cache=private", "sqlite:file:x.db?cache=private"},
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=4", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&pool_max_conns=4"},
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		// unparseable: the scheme only
		{"redis://:secret@127.0.0.1:abc/0", "redis://…"},
		{"postgres://u:secret@h:notaport/db", "postgres://…"},
		{"postgres://u:sec ret@h/db", "postgres://…"},
		{"sqlite:file:x.db?password=secret#%zz", "sqlite:…"},
		{"://secret@h", "(unparseable URL)"},
		{"user:secret@host/db", "user:…"}, // no "//": url.Parse takes "user" for the scheme
	}
	for _, tc := range cases {
		if got := secret.RedactURL(tc.raw); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.raw, got, tc.want)
		}
	}
}

func TestRedactURLErrorHidesThePasswordThatURLParseQuotes(t *testing.T) {
	t.Parallel()
	raw := "redis://:secret@127.0.0.1:abc/0"
	_, err := url.Parse(raw)
	if err == nil || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("url.Parse(%q) = %v; the test expects its error to quote the URL", raw, err)
	}
	wrapped := fmt.Errorf("redis store: %w", err)
	redacted := secret.RedactURLError(wrapped)
	if got := redacted.Error(); strings.Contains(got, "secret") || !strings.Contains(got, `invalid port ":abc"`) {
		t.Fatalf("RedactURLError: %q, want the cause without the password", got)
	}
	if !errors.Is(redacted, err) {
		t.Fatal("the redacted error must still wrap the original")
	}
	plain := fmt.Errorf("dial tcp: connection refused")
	if secret.RedactURLError(plain) != plain {
		t.Fatal("an error without a URL must come back as it is")
	}
}

func TestIsSecretParam(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"password": true, "sslpassword": true, "Passwd": true, "passphrase": true, "pwd": true,
		"client_secret": true, "auth_token": true, "sentinel_password": true,
		"sslmode": false, "user": false, "sslkey": false, "dial_timeout": false, "addr": false,
	} {
		if got := secret.IsSecretParam(name); got != want {
			t.Errorf("IsSecretParam(%q) = %v, want %v", name, got, want)
		}
	}
}
