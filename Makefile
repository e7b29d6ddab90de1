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

.PHONY: all deps build test vet unit fuzz fuzz-ci demo cluster cluster-down bench clean chaos soak overload scale chaos-deps test-deps

all: build

# apt-get install of Debian packages a target needs, when they are missing:
# one line of progress, apt's own output appended to out/apt.log (its tail
# shown if it fails). The package lists are refreshed only when they cannot
# provide the packages (none yet, or stale), which spares a fresh machine's
# demo an apt-get update. env: sudo drops DEBIAN_FRONTEND from the environment.
APT_GET := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get -y -qq --no-install-recommends
apt-install = echo "== $(1): apt-get install $(2) (log: out/apt.log)"; mkdir -p out; \
	{ echo "== $(1): apt-get install $(2)"; $(APT_GET) install $(2) \
	  || { $(SUDO) apt-get update -qq && $(APT_GET) install $(2); }; } >>out/apt.log 2>&1 \
	|| { tail -n 20 out/apt.log; echo "$(1): apt-get failed (run as root or with sudo)"; exit 1; }

# What the build needs: libzmq (cgo, for pebbe/zmq4) and a C compiler.
deps:
	@missing=; pkg-config --exists libzmq 2>/dev/null || missing="libzmq3-dev pkg-config"; \
	  command -v gcc >/dev/null || missing="$$missing gcc libc6-dev"; \
	  [ -z "$$missing" ] || { $(call apt-install,deps,$$missing); }

# go build of $(1) into $(BIN)/ with one line per binary, a count every 100
# packages compiled and one for the modules downloaded (go prints a line per
# module); compiler errors pass through.
go-build = set -o pipefail; $(GO) build -v -ldflags '$(LDFLAGS)' -o $(BIN)/ $(1) 2>&1 | awk ' \
	  /^go: downloading / { if (!d++) print "   downloading modules"; fflush(); next } \
	  /^[^ :\#]+$$/ { if (d && !r++) print "   downloaded " d " modules"; \
	                 if ($$0 ~ /\/cmd\/[a-z-]+$$/) { sub(".*/", ""); print "   built $(BIN)/" $$0 } \
	                 else if (++n % 100 == 0) print "   compiled " n " packages"; fflush(); next } \
	  { print; fflush() }'

# Every binary the README names, in one go build (parallel over packages).
# A cold build compiles ~480 packages.
build: deps
	@echo "== build: go build -o $(BIN)/ ./cmd/..."
	@$(call go-build,./cmd/...)
	@echo "   $(BIN)/: $$(cd $(BIN) && ls | tr '\n' ' ')"

vet: deps
	@echo "== vet"
	@$(GO) vet -tags integration ./... ./.ci/testsum

# Unit and integration tests (real processes on loopback), with the race
# detector. Every fuzz target's seed corpus runs here as a test; real
# fuzzing is `make fuzz`.
test: vet unit chart-test

# The output is go test's without -v (a line per package, failed tests in
# full) and then every skipped test with its reason and the counts: without
# -v go test hides a test that could not run here. .ci/testsum reads
# go test -json for that; .ci is outside ./..., so its tests are named.
unit: deps chaos-deps test-deps
	@echo "== test: go test $(TESTFLAGS) -tags integration ./... ./.ci/testsum"
	@mkdir -p out && $(GO) build -o out/testsum ./.ci/testsum
	@set -o pipefail; start=$$(date +%s); \
	  $(GO) test -json $(TESTFLAGS) -tags integration ./... ./.ci/testsum 2>&1 | out/testsum -trim "$$($(GO) list -m)/"; \
	  rc=$$?; echo "== test: $$([ $$rc = 0 ] && echo passed || echo FAILED) in $$(( $$(date +%s) - start ))s"; exit $$rc

# What the tests need besides the build and chaos-deps: node and npm, for
# e2e's run of the official Anthropic and OpenAI SDKs (npm ci in e2e/sdk;
# it fails without them, so that CI cannot pass without running it).
test-deps:
	@{ command -v node && command -v npm; } >/dev/null 2>&1 || { $(call apt-install,test-deps,nodejs npm); }

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
	./prompt:FuzzParseAPI ./forward:FuzzFirstID ./vllmclient:FuzzParseRendered ./gossip:FuzzResponses ./forward:FuzzHopPrefill ./forward:FuzzHopRankChoice
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
# after the build, which is only of what the demo runs (the central router
# runs inside kvbench): on a cold cache most of the packages anyway, but
# four links fewer than make build.
DEMO_CMDS  := ./cmd/kvbench ./cmd/vllm-sim ./cmd/sidecar
DEMO_FLAGS ?= --pods 4 --workload shared-prefix --policies service,kvroute,central-precise \
	--rate 10 --duration 15s --out out/demo
# While apt installs libzmq, the packages that need none (the standard
# library and every package that does not import zmq4) download and compile
# in the background, so on a fresh machine apt's time and most of the cold
# build overlap; the build after it compiles zmq4, what imports it and the
# links. Its errors would be the build's own, so here they are only logged.
WARM_DEPS := {{$$z := eq .ImportPath "github.com/pebbe/zmq4"}}{{range .Deps}}{{if eq . "github.com/pebbe/zmq4"}}{{$$z = true}}{{end}}{{end}}{{if not $$z}}{{.ImportPath}}{{end}}
demo:
	@mkdir -p out; warm=; if ! pkg-config --exists libzmq 2>/dev/null; then \
	  echo "== warm: go build of what needs no libzmq, beside apt (log: out/warm.log)"; \
	  { $(GO) list -deps -f '$(WARM_DEPS)' $(DEMO_CMDS) | xargs $(GO) build -v; } >out/warm.log 2>&1 & warm=$$!; fi; \
	  $(MAKE) --no-print-directory deps || exit 1; [ -z "$$warm" ] || { wait $$warm; \
	  echo "   warm: compiled $$(grep -c '^[^ :#]*$$' out/warm.log) packages, downloaded $$(grep -c '^go: downloading' out/warm.log) modules"; }
	@echo "== build: go build -o $(BIN)/ $(DEMO_CMDS)"
	@$(call go-build,$(DEMO_CMDS))
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

# The mesh's cost against its size (issue 25): N real cache-state nodes
# (kvindex, cachestate, gossip over real memberlist, route) in one process on
# 127.0.96.x, each churning 200 vLLM blocks/s at the sidecar's routing
# stride; a table per N, a fitted model with a verdict per target, a plot.
# About 7 minutes on 2 cores, 64 nodes unsaturated (the report marks a size
# that saturates the machine). docs/scale/ has the runs.
SCALE_FLAGS ?= --sizes 16,32,64 --out out/scale
scale: deps
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/kvscale $(SCALE_FLAGS)

# A long day (issue 29): 30 minutes of agentic traffic (15 req/s, about
# 60% of what 6 simulated pods serve at the knee) on 6 pods with a fault
# every two minutes, every kind but upgrade-sidecar (rolling-upgrade-mixed
# has its own), then the sidecars' RSS, goroutines and open fds per pod,
# judged flat (within 10%) after warm-up. About 32 minutes. Writes
# out/soak/{result.json,result.md,timeline.png,resources-*.png,logs/}.
SOAK_FLAGS ?= --scenario chaos/scenarios/soak.json --out out/soak
soak: deps chaos-deps
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/chaos $(SOAK_FLAGS)

# Overload (issue 29): 6 pods under a multi-turn chat workload; from 60 s
# to 120 s, on top, unique 32k-token chats through the Service at 5x what
# the pods can prefill of them. The report's verdict asserts sidecar RSS
# at most 256 MiB, every request served or refused retryably (429/503,
# Retry-After, the API's error shape) within 1 s, no sidecar retry or
# refused hop, and the workload's TTFT p90 back to its pre-burst level
# within 10 s of the burst. About 4 minutes. Writes out/overload/.
OVERLOAD_FLAGS ?= --scenario chaos/scenarios/overload.json --out out/overload
overload: deps chaos-deps
	$(GO) run -ldflags '$(LDFLAGS)' ./cmd/chaos $(OVERLOAD_FLAGS)

# ip(8), iptables(8) and sysctl(8) for the chaos namespaces (netns mode runs
# as root; make test's namespace tests too), from Debian when missing: a
# minimal Debian image has none of them (sysctl is in procps).
chaos-deps:
	@{ command -v ip && command -v iptables && command -v sysctl; } >/dev/null 2>&1 || { $(call apt-install,chaos-deps,iproute2 iptables procps); }

# --- Kubernetes (issue 12). All four need root; see README "Kubernetes".
# The images of images/Dockerfile as docker-save archives in out/images,
# built offline (a debootstrapped Debian instead of pulled base images).
# The modules come from this machine's cache, filled here first (with this
# machine's proxy settings and certificate authorities, which the build's
# chroot has not): images/build mounts the cache and the build stage runs
# with GOPROXY=off.
IMAGE_TAG ?= v0.1.0
IMAGES    := sidecar=ghcr.io/kvroute/sidecar:$(IMAGE_TAG) vllm-sim=ghcr.io/kvroute/vllm-sim:$(IMAGE_TAG) \
	pause=kvroute.local/pause:v1
.PHONY: images k8s-up k8s-down k8s-e2e k8s-helm
images:
	@[ "$$(id -u)" = 0 ] || { echo "make images needs root (debootstrap, chroot): sudo make images" >&2; exit 2; }
	@command -v debootstrap >/dev/null || { $(call apt-install,images,debootstrap); }
	@echo "== images: go mod download (into this machine's module cache, which the build stage reads)"
	@$(GO) mod download
	$(GO) run ./images/build --build-arg GOPROXY=off --out out/images $(IMAGES)

# A single-node cluster on this machine (kube binaries cached in
# /var/cache/kvroute/k8s/<version>); prints how to use it.
k8s-up:
	@[ -f out/images/sidecar.tar ] || $(MAKE) images
	k8s/up.sh

k8s-down:
	k8s/down.sh

# Up, the kustomize phase (checks, hit rates, faults), the Helm phase (install,
# hit rates, upgrade under load, uninstall), down; the result in out/k8s-e2e/result.json.
k8s-e2e: images
	k8s/e2e.sh

# out/bin/helm, built from the Helm module charts/kvroute/test requires (no
# downloaded binary); k8s-e2e builds it too.
k8s-helm:
	@k8s/build-helm.sh
