# kvroute — see README.md. `make test` is what CI runs.
SHELL     := /bin/bash
GO        ?= go
BIN       := bin
# An exec count, not a duration: a timed run can end with a spurious
# "context deadline exceeded" when the deadline lands inside a slow input.
FUZZTIME  ?= 200000x
TESTFLAGS ?= -race -count=1 -timeout 12m
# What --version prints (buildinfo): the tag or commit of this checkout.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS   := $(if $(VERSION),-X github.com/kvroute/kvroute/buildinfo.version=$(VERSION))
# apt-get needs root; sudo when we are not root and it exists.
SUDO      := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)

.PHONY: all deps build test vet unit fuzz fuzz-ci demo cluster cluster-down bench clean chaos chaos-deps

all: build

# libzmq (cgo, for pebbe/zmq4) from Debian when it is missing. One line of
# progress; apt's own output goes to out/apt.log (shown if it fails).
deps:
	@pkg-config --exists libzmq 2>/dev/null || { \
	  echo "== deps: apt-get install libzmq3-dev pkg-config (log: out/apt.log)"; \
	  mkdir -p out; \
	  { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	      --no-install-recommends libzmq3-dev pkg-config; } >out/apt.log 2>&1 \
	    || { tail -n 20 out/apt.log; echo "deps: apt-get failed (run as root or with sudo)"; exit 1; }; }

# Every binary the README names, in one go build (parallel over packages).
# A cold build compiles ~470 packages: a count every 100, and a line per
# binary; compiler errors pass through.
build: deps
	@echo "== build: go build -o $(BIN)/ ./cmd/..."
	@set -o pipefail; $(GO) build -v -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/... 2>&1 | awk ' \
	  /^[^ :#]+$$/ { if ($$0 ~ /\/cmd\/[a-z-]+$$/) { sub(".*/", ""); print "   built $(BIN)/" $$0 } \
	                 else if (++n % 100 == 0) print "   compiled " n " packages"; fflush(); next } \
	  { print; fflush() }'
	@echo "   $(BIN)/: $$(cd $(BIN) && ls | tr '\n' ' ')"

vet: deps
	@echo "== vet"
	@$(GO) vet -tags integration ./...

# Unit and integration tests (real processes on loopback), with the race
# detector. Every fuzz target's seed corpus runs here as a test; real
# fuzzing is `make fuzz`.
test: vet unit chart-test

unit: deps chaos-deps
	@echo "== test: go test $(TESTFLAGS) -tags integration ./..."
	@set -o pipefail; start=$$(date +%s); \
	  $(GO) test $(TESTFLAGS) -tags integration ./... 2>&1 | grep --line-buffered -v -e '\[no test files\]$$'; \
	  rc=$$?; echo "== test: $$([ $$rc = 0 ] && echo passed || echo FAILED) in $$(( $$(date +%s) - start ))s"; exit $$rc

# The Helm chart (charts/kvroute): helm lint, the values schema, and its rendering with each
# preset compared object by object with the kustomize overlays. Helm and kustomize are Go
# libraries in the test's own module, so the main module's build does not pull them. Cold
# (empty caches): about 3 min here, 540 MB of modules; warm: about 7 s.
.PHONY: chart-test
chart-test:
	@echo "== chart-test: cd charts/kvroute/test && go test ./..."
	@cd charts/kvroute/test && $(GO) test -count=1 ./...

# Fuzzes every target for FUZZTIME (default 200000 execs each; e.g.
# `make fuzz FUZZTIME=5m`, or FUZZ_PKGS=./kvevent for one package). Each
# target needs an instrumented build of its package: minutes in all.
FUZZ_PKGS ?= .
fuzz:
	@set -o pipefail; grep -rl --include='*_test.go' '^func Fuzz' $(FUZZ_PKGS) | xargs -r -n1 dirname | sort -u | while read -r dir; do \
	  for name in $$(grep -h '^func Fuzz' $$dir/*_test.go | sed 's/^func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    echo "== fuzz $$dir $$name ($(FUZZTIME))"; \
	    $(GO) test -run='^$$' -fuzz="^$$name$$" -fuzztime=$(FUZZTIME) $$dir || exit 1; \
	  done; \
	done

# CI's bounded fuzz step: the decoders of bytes from other processes (vLLM's
# KV events, peers' node meta and messages, clients' request bodies, vLLM's
# answers), 20000 execs each, one line per target. Six instrumented package builds: about
# seven minutes on a busy 2-core machine, most of it compiling.
FUZZ_CI ?= ./kvevent:FuzzDecodeFrames ./gossip:FuzzMeta ./gossip:FuzzDigestMsg ./gossip:FuzzTextPrefix ./prompt:FuzzScanObject ./prompt:FuzzParsePromptStd ./tokenids:FuzzParsePrefix ./forward:FuzzSplitMessages ./forward:FuzzTakeTokenIDs \
	./prompt:FuzzParseAPI ./forward:FuzzFirstID ./vllmclient:FuzzParseRendered ./gossip:FuzzResponses
fuzz-ci:
	@for t in $(FUZZ_CI); do dir=$${t%%:*}; name=$${t##*:}; \
	  out=$$($(GO) test -run='^$$' -fuzz="^$$name$$" -fuzztime=20000x $$dir 2>&1) \
	    && echo "== fuzz $$dir $$name: ok" || { echo "$$out"; exit 1; }; \
	done

clean:
	rm -rf $(BIN) out

# The README's main command: the scene (five calls sharing one system
# prompt, on 3 pods, through the plain Service and then kvroute), then a
# 4-pod benchmark of one prefix-heavy workload through the plain Service,
# kvroute and a central precise router: the table, and where the plots and
# the clusters' logs are (out/demo/clusters/). About a minute
# after the build.
DEMO_FLAGS ?= --pods 4 --workload shared-prefix --policies service,kvroute,central-precise \
	--rate 10 --duration 15s --out out/demo
demo: build
	@echo "== demo: $(BIN)/kvbench --build=false --story $(DEMO_FLAGS)"
	@$(BIN)/kvbench --build=false --story $(DEMO_FLAGS)

# A local mesh to try by hand (README "Try it by hand"): starts in the
# background, prints the URLs, stays up until `make cluster-down`.
CLUSTER_FLAGS ?= --pods 3
cluster: build
	@$(BIN)/kvcluster --detach $(CLUSTER_FLAGS)

cluster-down:
	@if [ -x $(BIN)/kvcluster ]; then $(BIN)/kvcluster down; else echo "no $(BIN)/kvcluster: nothing to stop"; fi

# The full matrix (not in CI): every workload and policy at 10 req/s (35
# runs of 30 s plus start and drain, ~25 minutes), an offered-load sweep of
# shared-prefix (12 runs, ~8 minutes), and both Mooncake traces when TRACES
# names a directory with them (8 runs of 240 s, ~35 minutes more): about
# 35 minutes without the traces, 70 with them. The traces
# need pods with a realistic KV cache (32768 blocks, 524k tokens: an 8B
# model on an H100) and 8 minutes of trace (2x time compression, 240 s):
# their conversations come back minutes apart, so a shorter window or a
# smaller cache measures nothing but the shared first block.
BENCH_POLICIES ?= service,kvroute,round-robin,least-loaded,chwbl,approx-prefix,central-precise
BENCH_SWEEP    ?= 5,10,20
BENCH_FLAGS    ?= --build=false --pods 4 --duration 30s --rate 10
# A directory with conversation_trace.jsonl and synthetic_trace.jsonl, the
# FAST'25 traces of github.com/kvcache-ai/Mooncake; empty skips them.
TRACES         ?=
bench: build
	@for w in shared-prefix agent-fanout doc-qa multi-turn-chat no-reuse; do \
	  echo "== bench $$w"; \
	  $(BIN)/kvbench $(BENCH_FLAGS) --workload $$w --policies $(BENCH_POLICIES) --out out/bench/$$w || exit 1; \
	done
	$(BIN)/kvbench $(BENCH_FLAGS) --workload shared-prefix --sweep $(BENCH_SWEEP) \
	  --policies service,least-loaded,kvroute,central-precise --out out/bench/sweep-shared-prefix
	@for t in conversation synthetic; do \
	  f=$(TRACES)/$${t}_trace.jsonl; \
	  if [ -f "$$f" ]; then echo "== bench mooncake $$t"; \
	    $(BIN)/kvbench --build=false --pods 8 --blocks-per-pod 32768 --trace $$f --time-scale 2 --duration 240s \
	      --policies service,least-loaded,kvroute,central-precise --out out/bench/mooncake-$$t || exit 1; \
	  else echo "== bench mooncake $$t skipped: no $$f (set TRACES)"; fi; \
	done

# The standard chaos scenario (README: Chaos testing): 8 simulated pods, each
# in its own network namespace when run as root (loopback addresses
# otherwise), one pod replaced every 20 s for 3 minutes under 20 req/s of
# multi-turn chat, no client retries. About 4 minutes. Writes
# out/chaos/{result.json,result.md,timeline.png,logs/}. After an
# interrupted run, `go run ./cmd/chaos --cleanup` removes what is left.
CHAOS_FLAGS ?= --scenario chaos/scenarios/kill-every-20s.json --out out/chaos
chaos: deps chaos-deps
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/chaos $(CHAOS_FLAGS)

# ip(8) and iptables(8) for the chaos namespaces (netns mode runs as root),
# from Debian when missing; apt's output goes to out/apt.log.
chaos-deps:
	@{ command -v ip && command -v iptables; } >/dev/null 2>&1 || { \
	  echo "== chaos-deps: apt-get install iproute2 iptables (log: out/apt.log)"; \
	  mkdir -p out; \
	  { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq \
	      --no-install-recommends iproute2 iptables; } >out/apt.log 2>&1 \
	    || { tail -n 20 out/apt.log; echo "chaos-deps: apt-get failed (run as root or with sudo)"; exit 1; }; }

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
