#!/usr/bin/env bash
# Builds the helm CLI from the Helm Go module that charts/kvroute/test
# requires (its tools.go keeps helm.sh/helm/v4/cmd/helm in that module's
# graph), so `make k8s-e2e` and the README's commands run the same Helm the
# chart tests link, with no downloaded binary. Prints the binary's path.
#   k8s/build-helm.sh [OUTPUT]     (default out/bin/helm)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-out/bin/helm}")
mod=charts/kvroute/test
version=$(cd "$mod" && go list -m -f '{{.Version}}' helm.sh/helm/v4)
mkdir -p "$(dirname "$out")"
# Helm's own Makefile sets the version with -X; without it `helm version`
# says only the minor (v4.3).
(cd "$mod" && CGO_ENABLED=0 go build -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
  -o "$out" helm.sh/helm/v4/cmd/helm)
echo "$out"
