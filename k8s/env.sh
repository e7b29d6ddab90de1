# Shared settings of k8s/up.sh, down.sh, e2e.sh and fault.sh (sourced).
# Every address below stays on this machine: the node address sits on lo,
# pods live on the bridge $BRIDGE, and the egress guard drops any packet of
# these ranges that would leave through another interface.

KUBE_VERSION=${KUBE_VERSION:-v1.34.4}
KVROUTE_K8S_CACHE=${KVROUTE_K8S_CACHE:-/var/cache/kvroute/k8s}
KBIN=$KVROUTE_K8S_CACHE/$KUBE_VERSION/bin
STATE=/var/lib/kvroute-k8s          # certificates, kubeconfigs, etcd data, logs
RUNDIR=/run/kvroute-k8s             # pid files
LOGS=$STATE/logs
NODE_NAME=kvroute-node
NODE_IP=10.213.0.1                  # on lo as /32: the kernel has no dummy interface
POD_CIDR=10.214.0.0/16
NODE_POD_CIDR=10.214.0.0/24
POD_GW=10.214.0.1
SVC_CIDR=10.215.0.0/24
BRIDGE=kvr0
GUARD=KVROUTE-EGRESS-GUARD
CONTAINERD_SOCK=/run/containerd/containerd.sock
KUBECONFIG_ADMIN=$STATE/admin.conf
IMAGES_DIR=${IMAGES_DIR:-out/images}

# Changed by the kubelet (overcommit, panic), the bridge plugin (forwarding)
# and kube-proxy; up.sh records them once, down.sh writes them back.
SYSCTLS="vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward
net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.ipv4.conf.all.route_localnet
net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
net.netfilter.nf_conntrack_tcp_timeout_close_wait net.ipv6.conf.all.forwarding"

# Process start order; down.sh stops them in reverse.
COMPONENTS="etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy coredns"

need_root() {
  if [[ $(id -u) != 0 ]]; then
    echo "$1 needs root: the local cluster runs containerd, the kubelet and kube-proxy as root" >&2
    echo "and changes iptables, routes and sysctls on this machine. Run it as root (sudo make $1)." >&2
    exit 2
  fi
}

kctl() { "$KBIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_for() {
  local what=$1 limit=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    if (( SECONDS - t0 >= limit )); then
      echo "timed out after ${limit}s waiting for $what" >&2
      return 1
    fi
    sleep 0.5
  done
}

pid_alive() { [[ -f $RUNDIR/$1.pid ]] && kill -0 "$(cat "$RUNDIR/$1.pid")" 2>/dev/null; }
