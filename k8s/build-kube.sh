#!/usr/bin/env bash
# Builds the Kubernetes binaries (and CoreDNS) from their Go modules into
# $KVROUTE_K8S_CACHE/<version>/bin, once per version: a cold build takes
# about 25 minutes on two busy cores, a warm one returns at once. The
# binaries (about 560 MB) stay outside the repository.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=${KUBE_VERSION:-v1.34.4}
coredns=${COREDNS_VERSION:-v1.14.7}
cache=${KVROUTE_K8S_CACHE:-/var/cache/kvroute/k8s}
bin=$cache/$version/bin
cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kubeadm)

have=1
for c in "${cmds[@]}" coredns; do [[ -x $bin/$c ]] || have=0; done
if [[ $have == 1 && -f $bin/.stamp && $(cat "$bin/.stamp") == "$version $coredns" ]]; then
  echo "== kube binaries $version cached in $bin"
  exit 0
fi

if [[ $(grep -o 'k8s.io/kubernetes v[0-9.]*' "$here/kubebuild/go.mod") != "k8s.io/kubernetes $version" ]]; then
  echo "build-kube: $here/kubebuild/go.mod pins another k8s.io/kubernetes than $version" >&2
  exit 2
fi

mkdir -p "$bin"
# k8s.io/kubernetes v1.X.Y publishes its staging modules as v0.X.Y.
minor=${version#v1.}; minor=${minor%%.*}
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ld+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
done

cd "$here/kubebuild"
for c in "${cmds[@]}"; do
  [[ -x $bin/$c ]] && continue
  start=$SECONDS
  echo "== building $c $version (go build, CGO_ENABLED=0)"
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "$ld" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c"
  mv "$bin/$c.tmp" "$bin/$c"
  echo "   $c built in $((SECONDS - start)) s"
done

if [[ ! -x $bin/coredns ]]; then
  start=$SECONDS
  echo "== building coredns $coredns"
  gobin=$(mktemp -d)
  CGO_ENABLED=0 GOBIN=$gobin go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$coredns"
  mv "$gobin/coredns" "$bin/coredns"
  rmdir "$gobin"
  echo "   coredns built in $((SECONDS - start)) s"
fi
echo "$version $coredns" > "$bin/.stamp"
echo "== kube binaries $version in $bin"
