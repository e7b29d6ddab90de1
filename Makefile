# kvroute — see README.md. `make test` is what CI runs.
GO        ?= go
BIN       := bin
FUZZTIME  ?= 5s
TESTFLAGS ?= -race -count=1 -timeout 12m

.PHONY: all build test vet unit fuzz fuzz-smoke demo bench clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...

vet:
	$(GO) vet -tags integration ./...

# Unit, integration (real processes on loopback) and a short fuzz pass over
# every decoder of outside bytes.
test: vet unit fuzz-smoke

unit:
	$(GO) test $(TESTFLAGS) -tags integration ./...

# Runs every Fuzz target for FUZZTIME (default 5s; `make fuzz FUZZTIME=5m`
# for a long run).
fuzz-smoke fuzz:
	@grep -rl --include='*_test.go' '^func Fuzz' . | xargs -r -n1 dirname | sort -u | while read -r dir; do \
	  for name in $$(grep -h '^func Fuzz' $$dir/*_test.go | sed 's/^func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do \
	    echo "== fuzz $$dir $$name ($(FUZZTIME))"; \
	    $(GO) test -run='^$$' -fuzz="^$$name$$" -fuzztime=$(FUZZTIME) $$dir || exit 1; \
	  done; \
	done

clean:
	rm -rf $(BIN) out
