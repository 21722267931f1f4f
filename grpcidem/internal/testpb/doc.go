// Package testpb is the test service of package grpcidem, generated from
// payments.proto by protoc 3.21 with protoc-gen-go v1.36.12 and protoc-gen-go-grpc
// v1.6.2; the generated files are committed, so that the tests need no protoc.
package testpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative payments.proto
