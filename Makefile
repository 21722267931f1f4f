# The commands the README names.
.PHONY: run test bench bench-ab mutants dashboard ci tidy

run:
	go run ./cmd/idem payments

test:
	go test -race -p 1 ./...

# End-to-end ratios into docs/benchmarks.md; the middleware's own: go test -bench . -benchmem .
bench:
	scripts/bench

# The current tree against the previous release, side by side; fails when it is slower.
bench-ab:
	scripts/bench-ab

# The configuration-matrix suite's mutation score (docs/combinations.md).
mutants:
	scripts/mutants

# Every query of deploy/grafana/idem.json against a real Prometheus under idem load, and
# its screenshot (needs Debian's prometheus and chromium; docs/operations.md#metrics).
dashboard:
	scripts/check-dashboard

ci:
	.ci/run

# go mod tidy of the root module and of each example module (examples/*/go.mod), whose
# go.sum must follow the root module's requirements.
tidy:
	go mod tidy
	for m in examples/*/go.mod; do (cd "$$(dirname "$$m")" && GOWORK=off go mod tidy) || exit 1; done
