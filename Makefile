GO ?= go

.PHONY: test test-race test-short test-leftovers test-cluster accept-cluster lint bench ci soak bench-cli bench-dashboard bench-ab

# Same command as the README.
test:
	$(GO) test -race -count=1 -timeout 12m ./...

test-race:
	$(GO) test -race -count=1 -timeout 12m ./...

test-short:
	$(GO) test -short -race ./...

# The suite against a redis-server of its own, failing if it leaves a key there.
test-leftovers:
	.ci/test-leftovers

# The suites that store runs, maps, rollbacks, sweeps, guarded undos and the dashboard's reads,
# and the public facade's (reactor, reactortest, mapstep, metrics, examples), on a Redis Cluster
# of 3 masters with a replica each: started on free ports in a temporary directory for the run
# and killed after it, whatever the outcome (internal/redistest/cmd/testcluster, which names it
# to the tests in GOREACTOR_TEST_CLUSTER). 3 to 5 minutes on 2 cores.
CLUSTER_PKGS ?= ./internal/redistest/ ./internal/store/ ./internal/lock/ ./internal/engine/ \
	./internal/mapcore/ ./sweeper/ ./worker/ ./dashboard/ \
	./reactor/ ./reactortest/ ./mapstep/ ./metrics/ ./examples/
CLUSTER_FLAGS ?=
test-cluster:
	$(GO) run ./internal/redistest/cmd/testcluster -masters 3 -replicas 1 -- \
		$(GO) test -race -count=1 -timeout 12m $(CLUSTER_FLAGS) $(CLUSTER_PKGS)

# The acceptance of issue 24 (worker.TestClusterAcceptance10k): a 10,000-element fan-out map rolled
# back on a cluster of its own (3 masters, a replica each) while its slot moves and its master fails
# over; logs the phases' times, each master's keys and each node's commands. Not in .ci/run: a few
# minutes on 2 cores.
accept-cluster:
	GOREACTOR_ACCEPT=1 $(GO) test -race -count=1 -run TestClusterAcceptance10k -v -timeout 15m ./worker/

lint:
	@files="$$(git ls-files -z '*.go' | xargs -0 -r gofmt -l)"; \
	if [ -n "$$files" ]; then echo "gofmt: these files need formatting:"; echo "$$files"; exit 1; fi
	$(GO) vet ./...
	@if command -v staticcheck >/dev/null 2>&1; then staticcheck ./...; else $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...; fi

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

ci:
	.ci/run

# The chaos loop: at most 5 minutes, a one-line summary last, non-zero on any violation.
soak:
	$(GO) run ./soak

# The fan-out benchmark CLI (docs/bench.md): a table, about a minute.
bench-cli:
	$(GO) run ./bench

# The dashboard's answers over 100,000 stored runs and a 100,000-element map (about half a minute to seed).
bench-dashboard:
	GOREACTOR_DASHBOARD_BENCH_RUNS=100000 $(GO) test -count=1 -run '^$$' -bench 'BenchmarkDashboard|BenchmarkElementSummary' -benchtime 50x ./dashboard/

# In-process runs/s of this checkout against a pinned build (old and new alternating):
# make bench-ab BASE=47764b8 (the commit that added the benchmark, before issue 23's work).
BASE ?= 47764b8
bench-ab:
	bench/ab-run.sh $(BASE) 5
