# Tools that build pgonce itself are pinned here and installed with
# `go install`; they never enter the library's go.mod.
SQLC_VERSION          := v1.31.1
GOLANGCI_LINT_VERSION := v2.15.0

GOBIN ?= $(shell go env GOPATH)/bin
# The fault campaign (internal/faults) appends its summary line here.
FAULTS_SUMMARY := $(CURDIR)/faults-summary.txt
# The failover campaign (internal/failover) writes its figures here.
FAILOVER_SUMMARY := $(CURDIR)/failover-summary.txt
SQLC          := $(GOBIN)/sqlc
GOLANGCI_LINT := $(GOBIN)/golangci-lint
# The telemetry package's tests with the OpenTelemetry SDK: a module of its
# own, never released, so that the SDK stays out of pgonce's go.mod.
SDKTEST       := telemetry/internal/sdktest
# The agent adapters: modules of their own beside the library, so that no
# agent SDK ever enters the core module's graph (docs/agents.md).
AGENT_MODULES := agents/pgonceopenai agents/pgonceanthropic agents/pgoncemcp
AGENT_SDKS    := github.com/(openai/openai-go|anthropics/anthropic-sdk-go|modelcontextprotocol/go-sdk)
# Every module make test runs, each whatever the others did (.ci/test).
TEST_MODULES  := . $(SDKTEST) $(AGENT_MODULES)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@grep -E '^[a-zA-Z/_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

.PHONY: tools
tools: ## Install the pinned sqlc and golangci-lint
	@$(SQLC) version 2>/dev/null | grep -qx '$(SQLC_VERSION)' || go install github.com/sqlc-dev/sqlc/cmd/sqlc@$(SQLC_VERSION)
	@$(GOLANGCI_LINT) version 2>/dev/null | grep -q '$(patsubst v%,%,$(GOLANGCI_LINT_VERSION))' || go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

.PHONY: generate
generate: tools ## Regenerate the sqlc code in internal/dbpgx and internal/dbstd
	$(SQLC) generate

.PHONY: verify
verify: tools ## Fail when generated code is stale, code is unformatted or vet complains
	$(SQLC) diff
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo 'gofmt: files above need formatting'; exit 1; }
	go vet ./...
	go mod verify
	cd $(SDKTEST) && go vet ./... && go mod verify
	@! go list -deps -test ./... | grep -x 'go.opentelemetry.io/otel/sdk.*' || { echo 'the OpenTelemetry SDK must stay out of the core module: test telemetry with it in $(SDKTEST)'; exit 1; }
	@set -e; for m in $(AGENT_MODULES); do echo "vet $$m"; (cd $$m && go vet ./... && go mod verify); done
	@! go list -deps -test ./... | grep -E '^$(AGENT_SDKS)' || { echo 'agent SDKs must stay out of the core module: adapters live in $(AGENT_MODULES)'; exit 1; }
	@! grep -n 'replace github.com/pgonce/pgonce\b' $(addsuffix /go.mod,$(SDKTEST) $(AGENT_MODULES) bench) || { echo 'modules require a version of the core module; go.work joins them for development'; exit 1; }

.PHONY: lint
lint: tools ## Run golangci-lint
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...
	cd $(SDKTEST) && $(GOLANGCI_LINT) run --allow-parallel-runners ./...
	@set -e; for m in $(AGENT_MODULES); do echo "lint $$m"; (cd $$m && $(GOLANGCI_LINT) run --allow-parallel-runners ./...); done

.PHONY: setup
setup: ## Set up what the tests need, only what is missing: PostgreSQL (or Docker for a container), PgBouncer, Chromium, faketime (.ci/setup test)
	bash .ci/setup test

.PHONY: test
test: setup ## Run every module's tests with -race against PostgreSQL, the fault campaign's quick profile included; list every failure at the end (see docs/development.md)
	@rm -f $(FAULTS_SUMMARY)
	@status=0; PGONCE_FAULTS_SUMMARY=$(FAULTS_SUMMARY) PGONCE_TEST_MODULES='$(TEST_MODULES)' bash .ci/test -race -count=1 -timeout=45m || status=$$?; \
		cat $(FAULTS_SUMMARY) 2>/dev/null || true; exit $$status

.PHONY: outside
outside: ## Test each agent adapter as a user gets it: GOWORK=off, the core served by a file:// proxy built from this checkout (.ci/outside)
	bash .ci/outside $(AGENT_MODULES)

# VERSION is the release's, vX.Y.Z: the CHANGELOG's newest section, and
# the version of the core module every adapter requires.
.PHONY: release
release: ## Check and tag a release: make release VERSION=vX.Y.Z (see docs/development.md#releasing); pushes nothing
	@echo '$(VERSION)' | grep -Eq '^v[0-9]+\.[0-9]+\.[0-9]+$$' || { echo 'release: VERSION=vX.Y.Z is required'; exit 2; }
	@test -z "$$(git status --porcelain)" || { echo 'release: the working tree has changes; commit them first'; exit 1; }
	@grep -q '^## \[$(patsubst v%,%,$(VERSION))\] - ' CHANGELOG.md || { echo 'release: CHANGELOG.md has no section "## [$(patsubst v%,%,$(VERSION))] - DATE"; move [Unreleased] into one'; exit 1; }
	@set -e; for m in $(AGENT_MODULES); do \
		grep -Eq '^[[:space:]]*github.com/pgonce/pgonce $(VERSION)$$' $$m/go.mod || { echo "release: $$m/go.mod must require github.com/pgonce/pgonce $(VERSION)"; exit 1; }; \
	done
	bash .ci/outside $(AGENT_MODULES)
	git tag -a $(VERSION) -m 'pgonce $(VERSION)'
	@set -e; for m in $(AGENT_MODULES); do git tag -a $$m/$(VERSION) -m "$$m $(VERSION)"; echo "tagged $$m/$(VERSION)"; done
	@echo 'release: tagged; publish with: git push origin $(VERSION) $(addsuffix /$(VERSION),$(AGENT_MODULES))'

.PHONY: test-busy
test-busy: ## Run make test with two CPU-bound hogs per core beside it, as on a busy machine; it must pass (.ci/busy)
	bash .ci/busy $(MAKE) --no-print-directory test

.PHONY: demo
demo: ## Run the refund demo against PostgreSQL: DATABASE_URL, else 127.0.0.1:5432, started or installed when missing (.ci/setup demo)
	bash .ci/setup demo
	go run ./cmd/pgonce demo

.PHONY: faults
faults: ## Run the fault campaign's long profile (as root: it makes private clusters; see docs/reliability.md)
	@rm -f $(FAULTS_SUMMARY)
	PGONCE_FAULTS=long PGONCE_FAULTS_SUMMARY=$(FAULTS_SUMMARY) go test -race -count=1 -timeout=90m ./internal/faults/
	@cat $(FAULTS_SUMMARY)

.PHONY: failover
failover: ## Run the failover campaign in every replication mode and print its figures (as root: it makes private clusters; see docs/high-availability.md)
	@rm -f $(FAILOVER_SUMMARY)
	PGONCE_FAULTS=long PGONCE_FAULTS_SUMMARY=$(FAILOVER_SUMMARY) go test -race -count=1 -timeout=30m -run='^TestFailover$$' ./internal/failover/
	@cat $(FAILOVER_SUMMARY)

.PHONY: test/short
test/short: ## Run every module's tests without the race detector; list every failure at the end
	PGONCE_TEST_MODULES='$(TEST_MODULES)' bash .ci/test -count=1

# Each fuzz target runs for FUZZTIME; plain `go test` runs only the seed
# corpora in testdata/fuzz, which is what CI does.
FUZZTIME ?= 60s
FUZZ_TARGETS := ./outbox:FuzzCanonicalize ./outbox:FuzzDeriveKeyRespelling ./outbox:FuzzSubmit

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 60s; FuzzSubmit needs PostgreSQL)
	@set -e; for target in $(FUZZ_TARGETS); do \
		pkg=$${target%%:*}; name=$${target#*:}; \
		echo "fuzz $$pkg $$name for $(FUZZTIME)"; \
		go test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) $$pkg; \
	done

.PHONY: bench
bench: ## Run the benchmarks (bench-size and bench-scale aside), 6 counts each, for benchstat
	go test -run='^$$' -bench=. -benchmem -count=6 -timeout=60m $$(go list ./... | grep -v /internal/storagebench) | tee bench.txt

.PHONY: bench-drain
bench-drain: ## Print how fast 1, 2, 4 and 8 dispatcher processes drain a backlog (PGONCE_BENCH_DRAIN_KEYS keys, default 5000)
	go test -run='^$$' -bench='^BenchmarkDrainProcesses$$' -benchtime=1x -count=3 -timeout=60m ./internal/faults/

.PHONY: flow-full
flow-full: ## Run the flow-control tests at full length: a rate of 200/s held within 5% over 60s across 3 processes, and 20000 calls under a limit of 25 in flight (docs/flow-control.md)
	PGONCE_TEST_FLOW_RATE_SECONDS=60 go test -count=1 -v -timeout=30m -run='^TestFlowRateAcrossProcesses$$/^Pgx$$' ./dispatcher/
	PGONCE_TEST_FLOW_CALLS=20000 go test -count=1 -v -timeout=30m -run='^TestFlowMaxInFlightAcrossProcesses$$/^Pgx$$' ./dispatcher/

.PHONY: bench-size
bench-size: ## Print the bytes per finished key and per tombstone (PGONCE_BENCH_KEYS calls, default 100000)
	go test -run='^$$' -bench='^BenchmarkSize$$' -benchtime=1x -count=1 -timeout=60m ./internal/storagebench/

.PHONY: bench-scale
bench-scale: ## Compare submit, claim, get and prune at PGONCE_BENCH_SCALE_KEYS finished keys (default 10000000) and at 10000, PGONCE_BENCH_SCALE_REPS times (default 5)
	go test -run='^$$' -bench='^BenchmarkScale$$' -count=1 -timeout=0 ./internal/storagebench/

.PHONY: bench-scale-buffers
bench-scale-buffers: ## bench-scale against a private cluster like the one on 5432 but with shared_buffers PGONCE_BENCH_SHARED_BUFFERS (default 2GB); needs root
	internal/storagebench/scale_cluster.sh

.PHONY: bench-telemetry
bench-telemetry: ## Compare the drain's throughput with the telemetry middleware over the OpenTelemetry SDK and without it, 6 counts
	cd $(SDKTEST) && go test -run='^$$' -bench='^BenchmarkDrainTelemetry$$' -benchtime=4x -count=6 -timeout=30m .

# The comparison with river is a module of its own (bench/), so that river
# never enters the library's go.mod; its CSV path is resolved here, as the
# command runs inside bench/.
PGONCE_COMPARE_CSV ?= bench/out/compare.csv

.PHONY: bench-compare
bench-compare: ## Compare drain, enqueue and end to end with river v0.51.2, and the pgbench floor, interleaved rounds (PGONCE_COMPARE_QUICK=1: a smoke run; see docs/performance.md)
	cd bench && PGONCE_COMPARE_CSV=$(abspath $(PGONCE_COMPARE_CSV)) go run ./compare

.PHONY: bench-instructions
bench-instructions: ## Count PostgreSQL's instructions per submit and per drained call with callgrind, with and without the row invariants (a private cluster; needs root and valgrind)
	bench/instructions.sh

.PHONY: tidy
tidy: ## go mod tidy, of the core module, and of the modules beside it over a local proxy of the core (tidy does not read go.work)
	go mod tidy
	bash .ci/outside --tidy $(SDKTEST) bench $(AGENT_MODULES)
