// Package corehooks is what the root package lends to the operator's tools (package
// admin) without exporting it to applications: how the core seals and opens a record
// (SPEC §19) and which response headers it never stores (SPEC §6). The root package
// sets these in its init; package admin imports the root package, so they are set
// before any of admin's functions runs. It imports the standard library and the
// store's and sealing's contracts only.
package corehooks

import (
	"context"

	"github.com/idem-go/idem/idemstore"
	"github.com/idem-go/idem/seal"
)

var (
	// SealResponse seals resp for the record (scope, key, recordID) under k, as the
	// core stores a completion under a keyring.
	SealResponse func(k *seal.Keyring, scope, key, recordID string, resp *idemstore.Response) (*idemstore.Response, error)
	// OpenRecord opens rec's response and step results with k, as the core opens a
	// record it reads.
	OpenRecord func(ctx context.Context, k *seal.Keyring, rec *idemstore.Record) (*idemstore.Record, error)
	// StoredHeaderError says why the core never stores the response header name, or
	// returns nil.
	StoredHeaderError func(name string) error
)
