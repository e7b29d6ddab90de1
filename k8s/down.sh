#!/usr/bin/env bash
# make k8s-down: removes everything k8s-up created and restores what it
# changed. Works on a healthy cluster (pods are deleted first, so the CNI
# plugin tears their networks down cleanly), on a half-started one and
# after a crash (then it removes what the dead processes left). Ends with a
# check that nothing is left; exits 1 if something is.
# The apt packages and the cached binaries in $KVROUTE_K8S_CACHE stay.
set -uo pipefail
cd "$(dirname "$0")/.."
. k8s/env.sh
need_root k8s-down
t_start=$SECONDS
step() { printf '== [%3ds] %s\n' $((SECONDS - t_start)) "$*"; }

# 1. Pods first, while the kubelet and containerd still run.
if pid_alive kube-apiserver && kctl get --raw /readyz >/dev/null 2>&1; then
  step "deleting workloads"
  for ns in $(kctl get ns -o jsonpath='{.items[*].metadata.name}' 2>/dev/null); do
    case $ns in default|kube-system|kube-public|kube-node-lease) ;; *) kctl delete ns "$ns" --wait=false >/dev/null 2>&1 ;; esac
  done
  kctl delete pods --all -A --grace-period=5 --wait=false >/dev/null 2>&1
  if pid_alive kubelet; then
    wait_for "pods to go" 60 bash -c "[[ -z \$('$KBIN/kubectl' --kubeconfig '$KUBECONFIG_ADMIN' get pods -A -o name 2>/dev/null) ]]" ||
      echo "   some pods remain; their containers are killed below"
  fi
fi

# 2. The egress guard's counters, before the guard goes.
if iptables -t mangle -S "$GUARD" >/dev/null 2>&1; then
  dropped=$(iptables -t mangle -L "$GUARD" -n -v -x | awk '$3=="DROP"{s+=$1} END{print s+0}')
  echo "$dropped" > "$STATE/egress-dropped" 2>/dev/null || true
  step "egress guard: $dropped packets of cluster addresses stopped at a non-local interface"
fi

# 3. Processes in reverse start order: SIGTERM, then SIGKILL after 10 s.
stop() {
  local name=$1 pid
  [[ -f $RUNDIR/$name.pid ]] || return 0
  pid=$(cat "$RUNDIR/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$RUNDIR/$name.pid"
}
for c in $(echo $COMPONENTS | tr ' ' '\n' | tac); do
  if [[ $c == containerd ]] && pid_alive containerd; then
    # Whatever the kubelet did not remove: kill and delete every task and
    # container, so that no shim or container process outlives containerd.
    for t in $(ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks kill -s SIGKILL "$t" >/dev/null 2>&1
    done
    sleep 1
    for t in $(ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks delete -f "$t" >/dev/null 2>&1
    done
    for c2 in $(ctr --address "$CONTAINERD_SOCK" -n k8s.io containers ls -q 2>/dev/null); do
      ctr --address "$CONTAINERD_SOCK" -n k8s.io containers delete "$c2" >/dev/null 2>&1
    done
  fi
  if [[ -f $RUNDIR/$c.pid ]]; then step "stopping $c"; fi
  stop "$c"
done
# After a crash the pid files may be gone: our binaries by their exact
# path, and shims by the exact socket they serve.
for p in /proc/[0-9]*; do
  exe=$(readlink "$p/exe" 2>/dev/null) || continue
  cmd=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)
  ours=0
  case $exe in
    "$KBIN"/*) ours=1 ;;
    /usr/bin/etcd) [[ $cmd == *"$STATE/etcd"* ]] && ours=1 ;;
    /usr/bin/containerd) [[ $cmd == *"$STATE/containerd.toml"* ]] && ours=1 ;;
    /usr/bin/containerd-shim-runc-v2) [[ $cmd == *"-address $CONTAINERD_SOCK"* ]] && ours=1 ;;
  esac
  [[ $ours == 1 ]] || continue
  step "killing leftover ${exe##*/} (pid ${p#/proc/})"
  kill -KILL "${p#/proc/}" 2>/dev/null
done

# Containers whose shim died with containerd still run in the kubepods
# cgroups: every process there is a pod's.
for _ in 1 2 3 4 5; do
  pids=$(cat /sys/fs/cgroup/*/kubepods/cgroup.procs /sys/fs/cgroup/*/kubepods/*/cgroup.procs \
    /sys/fs/cgroup/*/kubepods/*/*/cgroup.procs /sys/fs/cgroup/*/kubepods/*/*/*/cgroup.procs 2>/dev/null | sort -u)
  [[ -z $pids ]] && break
  step "killing $(wc -w <<<"$pids") leftover container processes"
  kill -KILL $pids 2>/dev/null
  sleep 0.5
done

# 4. iptables: kube-proxy's chains, then the kubelet's, then the guard.
if [[ -x $KBIN/kube-proxy ]]; then
  step "kube-proxy --cleanup"
  "$KBIN/kube-proxy" --cleanup >/dev/null 2>&1
fi
for ipt in iptables ip6tables; do
  for table in filter nat mangle; do
    chains=$($ipt -t $table -S 2>/dev/null | awk '$1=="-N"{print $2}' | grep -E '^(KUBE-|CNI-)' || true)
    [[ -z $chains ]] && continue
    # Rules that jump to them first, then the chains.
    $ipt -t $table -S 2>/dev/null | grep -E -- '-j (KUBE-|CNI-)' | grep '^-A' | while read -r _ rest; do
      eval "$ipt -t $table -D $rest" 2>/dev/null
    done
    for ch in $chains; do $ipt -t $table -F "$ch" 2>/dev/null; done
    for ch in $chains; do $ipt -t $table -X "$ch" 2>/dev/null; done
  done
done
while iptables -t mangle -D POSTROUTING -j "$GUARD" 2>/dev/null; do :; done
iptables -t mangle -F "$GUARD" 2>/dev/null && iptables -t mangle -X "$GUARD" 2>/dev/null
# The kubelet and kube-proxy loaded tables this machine did not use; drop
# those that are empty again (no rule, no chain of anyone else's).
for fam in ip ip6; do
  for table in filter nat mangle; do
    rules=$(nft list table $fam $table 2>/dev/null) || continue
    # Only chain headers: nobody has a rule in it.
    grep -qvE '^[[:space:]]*(table .*|chain [A-Z]+ \{|type .*|\}|)$' <<<"$rules" && continue
    nft delete table $fam $table 2>/dev/null
  done
done

# 5. Network: pod namespaces, bridge, veths, the node address, the route.
step "network: netns, $BRIDGE, $NODE_IP on lo"
for ns in /run/netns/cni-*; do
  [[ -e $ns ]] || continue
  ip netns delete "${ns##*/}" 2>/dev/null || { umount -l "$ns" 2>/dev/null; rm -f "$ns"; }
done
# Only the veths on our bridge: other tests on this machine have their own.
for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
  ip link delete "$v" 2>/dev/null
done
ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
[[ -n $(ip -o addr show dev lo to "$NODE_IP/32") ]] && ip addr del "$NODE_IP/32" dev lo
[[ -n $(ip route show "$SVC_CIDR") ]] && ip route del "$SVC_CIDR"

# 6. Mounts (deepest first), then kubepods cgroups, then state.
step "mounts, cgroups, state"
# /run/netns itself is shared with other users of `ip netns`: only cni-*.
findmnt -rn -o TARGET | grep -E "^(/var/lib/kubelet|/run/containerd|/run/netns/cni-|$STATE)" | sort -r |
  while read -r m; do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null; done
for cg in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
  [[ -d $cg ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null
done
left=()
if [[ -f $STATE/sysctl.saved ]]; then
  step "restoring sysctls"
  while IFS='=' read -r k v; do
    [[ $(sysctl -n "$k" 2>/dev/null) == "$v" ]] || sysctl -qw "$k=$v" 2>/dev/null
    [[ $(sysctl -n "$k" 2>/dev/null) == "$v" ]] || left+=("sysctl $k")
  done < "$STATE/sysctl.saved"
fi
rm -rf /run/netns/cni-* /run/containerd /var/lib/cni /var/lib/kubelet /var/log/containers /var/log/pods \
  "$RUNDIR" "$STATE"

# 7. Nothing may be left.
for p in /proc/[0-9]*; do
  exe=$(readlink "$p/exe" 2>/dev/null) || continue
  case $exe in "$KBIN"/*|/usr/bin/containerd|/usr/bin/containerd-shim-runc-v2) left+=("process ${exe##*/}") ;;
    /usr/bin/etcd) left+=("process etcd") ;; esac
done
for ipt in iptables ip6tables; do
  n=$($ipt-save 2>/dev/null | grep -cE "KUBE-|CNI-|$GUARD" || true)
  [[ $n != 0 ]] && left+=("$n $ipt rules or chains")
done
ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
[[ -n $(ip -o addr show dev lo to "$NODE_IP/32") ]] && left+=("address $NODE_IP on lo")
ls /run/netns/cni-* >/dev/null 2>&1 && left+=("network namespaces")
[[ -n $(findmnt -rn -o TARGET | grep -E '^(/var/lib/kubelet|/run/containerd|/run/netns/cni-)') ]] && left+=("mounts")
ls -d /sys/fs/cgroup/*/kubepods >/dev/null 2>&1 && left+=("kubepods cgroups")
if (( ${#left[@]} )); then
  printf 'k8s-down: left behind: %s\n' "${left[@]}" >&2
  exit 1
fi
step "cluster removed; nothing left (binaries stay cached in $KVROUTE_K8S_CACHE)"
