# The commands the README names.
.PHONY: run test bench ci

run:
	go run ./cmd/idem payments

test:
	go test -race -p 1 ./...

# End-to-end ratios into docs/benchmarks.md; the middleware's own: go test -bench . -benchmem .
bench:
	scripts/bench

ci:
	.ci/run
