//go:build !idem_nokms

package main

// The key managers' drivers of --encryption-key (SPEC §19): awskms://, gcpkms://,
// azurekeyvault://, hashivault:// (base64key:// comes with seal/cloudkeys). They add
// about 16 MB to the binary (66 MB against 50; 11 MB stripped, -ldflags='-s -w');
// `go build -tags idem_nokms` leaves them out, and then only base64key:// keys open.
import (
	_ "gocloud.dev/secrets/awskms"
	_ "gocloud.dev/secrets/azurekeyvault"
	_ "gocloud.dev/secrets/gcpkms"
	_ "gocloud.dev/secrets/hashivault"
)
