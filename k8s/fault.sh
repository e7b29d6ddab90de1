#!/usr/bin/env bash
# The Kubernetes fault driver: one fault against the kvroute Deployment,
# through kubectl (and, for the engine faults, the node's containerd, which
# is local here). This is the seam for the `chaos` command's Kubernetes
# mode: it runs `k8s/fault.sh KIND [POD]` and reads one JSON line
#   {"at_ms": <unix ms when the fault was issued>, "kind": "...", "pod": "..."}
# from stdout (also appended to $FAULTS when set). POD defaults to the
# first Ready pod by name.
#
#   delete-pod       kubectl delete pod (graceful: preStop drain, then SIGTERM)
#   force-delete     kubectl delete pod --grace-period=0 --force
#   kill-engine      SIGKILL the pod's vllm container only; the kubelet restarts it
#   hang-engine      freeze the vllm container (cgroup freezer): a hung engine
#   resume-engine    thaw it
#   partition        cut the pod off from the other pods (clients, probes and DNS still reach it)
#   heal             undo partition
#   rollout-restart  kubectl rollout restart deploy/kvroute (pod is empty)
#   ready            wait until every replica is Ready again (no JSON line)
#
# Environment: NS (default kvroute-e2e), KUBECONFIG (default the k8s-up one),
# DEPLOY (default kvroute), FAULTS (a file to append the JSON line to).
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$0")/.."
. k8s/env.sh
NS=${NS:-kvroute-e2e}
DEPLOY=${DEPLOY:-kvroute}
export KUBECONFIG=${KUBECONFIG:-$KUBECONFIG_ADMIN}
k() { "$KBIN/kubectl" -n "$NS" "$@"; }

usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$self"; }
kind=${1:-}
case $kind in -h|--help|"") usage; [[ -n $kind ]]; exit $? ;; esac

selector=$(k get deploy "$DEPLOY" -o jsonpath='{.spec.selector.matchLabels}' |
  jq -r 'to_entries | map("\(.key)=\(.value)") | join(",")')

ready_pod() {
  k get pods -l "$selector" -o json | jq -r '[.items[] | select(.metadata.deletionTimestamp == null)
    | select(.status.conditions // [] | any(.type == "Ready" and .status == "True"))
    | .metadata.name] | sort | .[0] // empty'
}

# container_id POD NAME: the containerd id of a container of the pod.
container_id() {
  k get pod "$1" -o json | jq -r --arg c "$2" '.status.containerStatuses[] | select(.name == $c) | .containerID' |
    sed 's|^containerd://||'
}

ctr_() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }

# in_pod_net POD COMMAND...: runs COMMAND in the pod's network namespace.
in_pod_net() {
  local id pid
  id=$(container_id "$1" vllm)
  pid=$(ctr_ tasks ls | awk -v id="$id" '$1 == id {print $2}')
  [[ -n $pid ]] || { echo "fault: no task for $1's vllm container" >&2; return 1; }
  shift
  nsenter -t "$pid" -n "$@"
}

# Packets from and to other pods are dropped; the gateway (node, kubelet
# probes, clients through kube-proxy from the host) stays reachable.
partition_rules() {
  local op=$1 pod=$2 c=(-m comment --comment kvroute-partition) pos=()
  [[ $op == -I ]] && pos=(1)
  # Inserted at 1 in this order, the ACCEPT ends up before the DROP.
  in_pod_net "$pod" iptables -w "$op" INPUT "${pos[@]}" -s "$NODE_POD_CIDR" "${c[@]}" -j DROP &&
    in_pod_net "$pod" iptables -w "$op" INPUT "${pos[@]}" -s "$POD_GW" "${c[@]}" -j ACCEPT &&
    in_pod_net "$pod" iptables -w "$op" OUTPUT "${pos[@]}" -d "$NODE_POD_CIDR" "${c[@]}" -j DROP &&
    in_pod_net "$pod" iptables -w "$op" OUTPUT "${pos[@]}" -d "$POD_GW" "${c[@]}" -j ACCEPT
}

emit() {
  local line
  line=$(jq -cn --argjson at "$1" --arg kind "$kind" --arg pod "$2" '{at_ms: $at, kind: $kind, pod: $pod}')
  echo "$line"
  [[ -n ${FAULTS:-} ]] && echo "$line" >> "$FAULTS"
  return 0
}

now_ms() { date +%s%3N; }

if [[ $kind == ready ]]; then
  want=$(k get deploy "$DEPLOY" -o jsonpath='{.spec.replicas}')
  k rollout status deploy/"$DEPLOY" --timeout=180s >/dev/null
  wait_for "$want Ready pods" 180 bash -c "[[ \$('$KBIN/kubectl' -n '$NS' get pods -l '$selector' -o json | jq '[.items[]
    | select(.metadata.deletionTimestamp == null) | select(.status.conditions // [] | any(.type == \"Ready\" and .status == \"True\"))] | length') == $want ]]"
  exit 0
fi

pod=${2:-}
if [[ -z $pod && $kind != rollout-restart ]]; then
  pod=$(ready_pod)
  [[ -n $pod ]] || { echo "fault: no Ready pod of deploy/$DEPLOY in $NS" >&2; exit 1; }
fi

case $kind in
  delete-pod)
    t=$(now_ms); k delete pod "$pod" --wait=false >/dev/null ;;
  force-delete)
    t=$(now_ms); k delete pod "$pod" --grace-period=0 --force --wait=false >/dev/null 2>&1 ;;
  kill-engine)
    id=$(container_id "$pod" vllm)
    t=$(now_ms); ctr_ tasks kill -s SIGKILL "$id" ;;
  hang-engine)
    id=$(container_id "$pod" vllm)
    t=$(now_ms); ctr_ tasks pause "$id" ;;
  resume-engine)
    id=$(container_id "$pod" vllm)
    t=$(now_ms); ctr_ tasks resume "$id" ;;
  rollout-restart)
    t=$(now_ms); k rollout restart deploy/"$DEPLOY" >/dev/null ;;
  partition)
    t=$(now_ms); partition_rules -I "$pod" ;;
  heal)
    t=$(now_ms); partition_rules -D "$pod" ;;
  *)
    echo "fault: unknown kind $kind" >&2; usage >&2; exit 2 ;;
esac
emit "$t" "$pod"
