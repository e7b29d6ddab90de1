#!/usr/bin/env bash
# make k8s-up: a single-node Kubernetes on this machine, from Debian
# packages and the kube binaries built by build-kube.sh, with the images of
# `make images` imported. Safe to re-run: a running component is kept, a
# missing one is started. `make k8s-down` removes all of it.
set -euo pipefail
cd "$(dirname "$0")/.."
. k8s/env.sh
need_root k8s-up
t_start=$SECONDS
step() { printf '== [%3ds] %s\n' $((SECONDS - t_start)) "$*"; }

# --- packages: no daemon may start from apt (policy-rc.d exits 101).
pkgs="etcd-server containerd runc containernetworking-plugins iptables iproute2 conntrack"
missing=
for p in $pkgs; do
  [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+="$p "
done
if [[ -n $missing ]]; then
  step "installing ${missing}(apt-get; no daemon is started)"
  saved=
  if [[ -e /usr/sbin/policy-rc.d ]]; then saved=$(mktemp); cp -a /usr/sbin/policy-rc.d "$saved"; fi
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod 755 /usr/sbin/policy-rc.d
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
  if [[ -n $saved ]]; then mv "$saved" /usr/sbin/policy-rc.d; else rm -f /usr/sbin/policy-rc.d; fi
fi
# A daemon the package might still have started would hold our ports.
for d in containerd etcd; do
  if pgrep -x "$d" >/dev/null && ! pid_alive "$d"; then
    echo "k8s-up: a $d that k8s-up did not start is running; stop it first" >&2
    exit 1
  fi
done

# --- binaries, built once per version.
step "kube binaries $KUBE_VERSION"
nice -n 10 k8s/build-kube.sh

# --- images.
for t in sidecar vllm-sim pause; do
  if [[ ! -f $IMAGES_DIR/$t.tar ]]; then
    echo "k8s-up: $IMAGES_DIR/$t.tar is missing: run 'make images' first" >&2
    exit 1
  fi
done

mkdir -p "$STATE" "$RUNDIR" "$LOGS" "$STATE/pki" "$STATE/cni/net.d" /var/lib/kubelet

# --- record what we change, once (a re-run must not record our own values).
if [[ ! -f $STATE/sysctl.saved ]]; then
  for s in $SYSCTLS; do
    v=$(sysctl -n "$s" 2>/dev/null) && echo "$s=$v"
  done > "$STATE/sysctl.saved.tmp"
  mv "$STATE/sysctl.saved.tmp" "$STATE/sysctl.saved"
fi

# --- networking: node address on lo, a local route for Service IPs, the guard.
step "node address $NODE_IP/32 on lo, egress guard $GUARD"
[[ -n $(ip -o addr show dev lo to "$NODE_IP/32") ]] || ip addr add "$NODE_IP/32" dev lo
# Host-originated packets to a ClusterIP are DNATed in OUTPUT; without this
# route their first routing decision would pick the default route (eth0).
[[ -n $(ip route show "$SVC_CIDR") ]] || ip route add "$SVC_CIDR" dev lo src "$NODE_IP"
if ! iptables -t mangle -S "$GUARD" >/dev/null 2>&1; then
  iptables -t mangle -N "$GUARD"
  iptables -t mangle -A "$GUARD" -o lo -j RETURN
  iptables -t mangle -A "$GUARD" -o "$BRIDGE" -j RETURN
  for net in "$POD_CIDR" "$SVC_CIDR" "$NODE_IP/32"; do
    iptables -t mangle -A "$GUARD" -s "$net" -j DROP
    iptables -t mangle -A "$GUARD" -d "$net" -j DROP
  done
fi
iptables -t mangle -C POSTROUTING -j "$GUARD" 2>/dev/null || iptables -t mangle -I POSTROUTING 1 -j "$GUARD"
sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.ipv4.ip_forward=1
printf 'search cluster.local\nnameserver %s\n' "$NODE_IP" > "$STATE/resolv.conf"
# Pods resolve cluster names only: their DNS (CoreDNS) has no upstream.
printf '# no upstream: pods resolve cluster names only\n' > "$STATE/resolv-upstream.conf"

cat > "$STATE/cni/net.d/10-kvroute.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kvroute",
  "plugins": [{
    "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "$NODE_POD_CIDR", "gateway": "$POD_GW"}]],
             "routes": [{"dst": "$SVC_CIDR"}, {"dst": "$NODE_IP/32"}]}
  }]
}
EOF

# --- certificates and kubeconfigs (kubeadm phases only: no preflight, no static pods).
cat > "$STATE/kubeadm.yaml" <<EOF
apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint: {advertiseAddress: $NODE_IP, bindPort: 6443}
nodeRegistration: {name: $NODE_NAME, criSocket: unix://$CONTAINERD_SOCK}
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: $KUBE_VERSION
clusterName: kvroute
certificatesDir: $STATE/pki
controlPlaneEndpoint: $NODE_IP:6443
networking: {serviceSubnet: $SVC_CIDR, podSubnet: $POD_CIDR, dnsDomain: cluster.local}
EOF
if [[ ! -f $STATE/admin.conf ]]; then
  step "certificates and kubeconfigs (kubeadm init phase certs/kubeconfig)"
  "$KBIN/kubeadm" init phase certs all --config "$STATE/kubeadm.yaml" >"$LOGS/kubeadm.log" 2>&1
  "$KBIN/kubeadm" init phase kubeconfig all --config "$STATE/kubeadm.yaml" --kubeconfig-dir "$STATE" >>"$LOGS/kubeadm.log" 2>&1
  "$KBIN/kubeadm" kubeconfig user --config "$STATE/kubeadm.yaml" --client-name system:kube-proxy \
    > "$STATE/kube-proxy.conf" 2>>"$LOGS/kubeadm.log"
fi

# --- configs.
cat > "$STATE/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd"
state = "/run/containerd"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "kvroute.local/pause:v1"
  # This VM's processes lack CAP_SYS_RESOURCE: without this, runc cannot set
  # the negative OOM score the kubelet asks for and every sandbox fails.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF

cat > "$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
resolvConf: $STATE/resolv-upstream.conf
failSwapOn: false
rotateCertificates: false
serializeImagePulls: false
maxPods: 30
# Images cannot be pulled again here: never garbage-collect them, and evict
# only when the machine is really short.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
EOF

cat > "$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: [$NODE_IP/32]
clientConnection: {kubeconfig: $STATE/kube-proxy.conf}
# 0 leaves the conntrack sysctls as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false}
EOF

cat > "$STATE/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $STATE/admin.conf
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
    # 200 once the kubernetes plugin has synced: what up.sh waits for.
    ready 127.0.0.1:8181
}
EOF

# start NAME COMMAND...: runs a component in the background unless it runs.
start() {
  local name=$1
  shift
  if pid_alive "$name"; then return 0; fi
  setsid "$@" >"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUNDIR/$name.pid"
}
pki=$STATE/pki

step "etcd"
start etcd /usr/bin/etcd --name "$NODE_NAME" --data-dir "$STATE/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster "$NODE_NAME=http://127.0.0.1:2380" --listen-metrics-urls http://127.0.0.1:2381
step "containerd"
start containerd /usr/bin/containerd --config "$STATE/containerd.toml"
wait_for "containerd" 30 ctr --address "$CONTAINERD_SOCK" version
wait_for "etcd" 30 curl -fsS http://127.0.0.1:2379/health

step "kube-apiserver"
start kube-apiserver "$KBIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
  --advertise-address="$NODE_IP" --bind-address="$NODE_IP" --secure-port=6443 \
  --service-cluster-ip-range="$SVC_CIDR" --allow-privileged=true \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --client-ca-file="$pki/ca.crt" --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --requestheader-client-ca-file="$pki/front-proxy-ca.crt" --proxy-client-cert-file="$pki/front-proxy-client.crt" \
  --proxy-client-key-file="$pki/front-proxy-client.key" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- --profiling=false
wait_for "the API server" 90 kctl get --raw /readyz
# kubeadm's admin.conf user is in group kubeadm:cluster-admins, which
# `kubeadm init` would bind to cluster-admin; the phases used here do not.
"$KBIN/kubectl" --kubeconfig "$STATE/super-admin.conf" apply -f - >/dev/null <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "kubeadm:cluster-admins"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "kubeadm:cluster-admins"}]
EOF

step "controller-manager, scheduler"
start kube-controller-manager "$KBIN/kube-controller-manager" --kubeconfig="$STATE/controller-manager.conf" \
  --authentication-kubeconfig="$STATE/controller-manager.conf" --authorization-kubeconfig="$STATE/controller-manager.conf" \
  --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
  --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" --root-ca-file="$pki/ca.crt" \
  --service-account-private-key-file="$pki/sa.key" --allocate-node-cidrs=true --cluster-cidr="$POD_CIDR" \
  --node-cidr-mask-size=24 --service-cluster-ip-range="$SVC_CIDR" --profiling=false
start kube-scheduler "$KBIN/kube-scheduler" --kubeconfig="$STATE/scheduler.conf" \
  --authentication-kubeconfig="$STATE/scheduler.conf" --authorization-kubeconfig="$STATE/scheduler.conf" \
  --bind-address=127.0.0.1 --leader-elect=false --profiling=false

step "images: ctr images import $IMAGES_DIR/*.tar"
for t in pause sidecar vllm-sim; do
  ctr --address "$CONTAINERD_SOCK" -n k8s.io images import "$IMAGES_DIR/$t.tar" >>"$LOGS/import.log" 2>&1
done

step "kubelet, kube-proxy, CoreDNS"
start kubelet "$KBIN/kubelet" --config="$STATE/kubelet.yaml" --kubeconfig="$STATE/kubelet.conf" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --cert-dir="$STATE/kubelet-pki" --v=1
start kube-proxy "$KBIN/kube-proxy" --config="$STATE/kube-proxy.yaml"
start coredns "$KBIN/coredns" -conf "$STATE/Corefile"

wait_for "node $NODE_NAME Ready" 120 bash -c \
  "'$KBIN/kubectl' --kubeconfig '$KUBECONFIG_ADMIN' get node $NODE_NAME -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -x True"
step "node $NODE_NAME Ready"
wait_for "CoreDNS" 60 curl -fsS http://127.0.0.1:8181/ready
echo "$((SECONDS - t_start))" > "$RUNDIR/up-seconds"
step "cluster up ($KUBE_VERSION, node $NODE_IP, pods $NODE_POD_CIDR, services $SVC_CIDR)"
cat <<EOF

  export KUBECONFIG=$KUBECONFIG_ADMIN
  export PATH=$KBIN:\$PATH
  kubectl get nodes
  kubectl create namespace llm
  kubectl -n llm create secret generic kvroute-cluster-secret --from-literal=secret="\$(head -c 32 /dev/urandom | base64)"
  kubectl -n llm apply -k manifests/overlays/cpu-sim

  make k8s-down removes the cluster and restores what it changed.
EOF
