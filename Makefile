# The commands the README names.
.PHONY: run test bench ci

run:
	go run ./cmd/idem payments

test:
	go test -race ./...

# Benchmarks live in scripts/bench once written; until then, the Go benchmarks.
bench:
	@if [ -x scripts/bench ]; then scripts/bench; else go test -run '^$$' -bench . -benchmem ./...; fi

ci:
	.ci/run
