# kvroute — see README.md. `make test` is what CI runs.
GO        ?= go
BIN       := bin
# An exec count, not a duration: a timed run can end with a spurious
# "context deadline exceeded" when the deadline lands inside a slow input.
FUZZTIME  ?= 20000x
TESTFLAGS ?= -race -count=1 -timeout 12m

.PHONY: all deps build test vet unit fuzz fuzz-smoke demo bench clean

all: build

# libzmq (cgo, for pebbe/zmq4) from Debian when it is missing; needs root.
deps:
	@pkg-config --exists libzmq 2>/dev/null || { \
	  echo "== installing libzmq3-dev pkg-config (apt-get)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libzmq3-dev pkg-config; }

build: deps
	$(GO) build -o $(BIN)/ ./cmd/...

vet: deps
	$(GO) vet -tags integration ./...

# Unit, integration (real processes on loopback) and a short fuzz pass over
# every decoder of outside bytes.
test: vet unit fuzz-smoke

unit:
	$(GO) test $(TESTFLAGS) -tags integration ./...

# Runs every Fuzz target for FUZZTIME (default 20000 execs, a few seconds;
# `make fuzz FUZZTIME=5m` for a long run).
fuzz-smoke fuzz:
	@grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u | while read -r dir; do \
	  for name in $$(grep -h '^func Fuzz' $$dir/*_test.go | sed 's/^func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    echo "== fuzz $$dir $$name ($(FUZZTIME))"; \
	    $(GO) test -run='^$$' -fuzz="^$$name$$" -fuzztime=$(FUZZTIME) $$dir || exit 1; \
	  done; \
	done

clean:
	rm -rf $(BIN) out

# The README's main command: a 4-pod simulated cluster, one prefix-heavy
# workload through the plain Service, kvroute and a central precise router;
# prints the table and where the plots are. About 2 minutes.
DEMO_FLAGS ?= --pods 4 --workload shared-prefix --policies service,kvroute,central-precise \
	--rate 10 --duration 30s --out out/demo
demo: deps
	$(GO) run ./cmd/kvbench $(DEMO_FLAGS)

# The full matrix (not in CI; about two hours at ~35 s per policy and
# load): every workload and policy at 10 req/s, an offered-load sweep of
# shared-prefix, and both Mooncake traces when TRACES has them. The traces
# need pods with a realistic KV cache (32768 blocks, 524k tokens: an 8B
# model on an H100) and 8 minutes of trace (2x time compression, 240 s):
# their conversations come back minutes apart, so a shorter window or a
# smaller cache measures nothing but the shared first block.
BENCH_POLICIES ?= service,kvroute,round-robin,least-loaded,chwbl,approx-prefix,central-precise
BENCH_SWEEP    ?= 5,10,20
BENCH_FLAGS    ?= --pods 4 --duration 30s --rate 10
TRACES         ?= ../shared/traces/mooncake-fast25
bench: deps
	$(GO) build -o $(BIN)/ ./cmd/kvbench
	@for w in shared-prefix agent-fanout doc-qa multi-turn-chat no-reuse; do \
	  echo "== bench $$w"; \
	  $(BIN)/kvbench $(BENCH_FLAGS) --workload $$w --policies $(BENCH_POLICIES) --out out/bench/$$w || exit 1; \
	done
	$(BIN)/kvbench $(BENCH_FLAGS) --workload shared-prefix --sweep $(BENCH_SWEEP) \
	  --policies service,least-loaded,kvroute,central-precise --out out/bench/sweep-shared-prefix
	@for t in conversation synthetic; do \
	  f=$(TRACES)/$${t}_trace.jsonl; \
	  if [ -f "$$f" ]; then echo "== bench mooncake $$t"; \
	    $(BIN)/kvbench --pods 8 --blocks-per-pod 32768 --trace $$f --time-scale 2 --duration 240s \
	      --policies service,least-loaded,kvroute,central-precise --out out/bench/mooncake-$$t || exit 1; \
	  else echo "== bench mooncake $$t skipped: no $$f"; fi; \
	done

# --- Kubernetes (issue 12). All four need root; see README "Kubernetes".
# The images of images/Dockerfile as docker-save archives in out/images,
# built offline (a debootstrapped Debian instead of pulled base images).
IMAGE_TAG ?= v0.1.0
IMAGES    := sidecar=ghcr.io/kvroute/sidecar:$(IMAGE_TAG) vllm-sim=ghcr.io/kvroute/vllm-sim:$(IMAGE_TAG) \
	pause=kvroute.local/pause:v1
.PHONY: images k8s-up k8s-down k8s-e2e
images:
	@[ "$$(id -u)" = 0 ] || { echo "make images needs root (debootstrap, chroot): sudo make images" >&2; exit 2; }
	@command -v debootstrap >/dev/null || { echo "== installing debootstrap (apt-get)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; }
	$(GO) run ./images/build --out out/images $(IMAGES)

# A single-node cluster on this machine (kube binaries cached in
# /var/cache/kvroute/k8s/<version>); prints how to use it.
k8s-up:
	@[ -f out/images/sidecar.tar ] || $(MAKE) images
	k8s/up.sh

k8s-down:
	k8s/down.sh

# Up, the end-to-end checks and faults, down; the result in out/k8s-e2e/result.json.
k8s-e2e: images
	k8s/e2e.sh
