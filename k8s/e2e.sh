#!/usr/bin/env bash
# make k8s-e2e: k8s-up, the end-to-end checks on overlays/cpu-sim, the
# faults under load, k8s-down. Writes $OUT/result.json (machine-readable:
# every check with its verdict, the figures) and $OUT/*.json per load run.
# Exits 0 only when every check passed and k8s-down left nothing.
#
# KEEP=1 leaves the cluster up afterwards; RATE, LOAD_S and FAULT_LOAD_S
# size the load (defaults 4 req/s, 60 s and 190 s); HANG_S how long the
# engine stays frozen and the pod cut off (15 s each).
set -uo pipefail
cd "$(dirname "$0")/.."
. k8s/env.sh
need_root k8s-e2e
OUT=${OUT:-out/k8s-e2e}
NS=kvroute-e2e
RATE=${RATE:-4}
LOAD_S=${LOAD_S:-60}
FAULT_LOAD_S=${FAULT_LOAD_S:-190}
REPLICAS=4
rm -rf "$OUT" && mkdir -p "$OUT"
OUT=$(realpath "$OUT")
t0=$SECONDS
step() { printf '== [%4ds] %s\n' $((SECONDS - t0)) "$*"; }
checks=$OUT/checks.jsonl
: > "$checks"
# check NAME OK(true|false) DETAIL
check() {
  jq -cn --arg n "$1" --argjson ok "$2" --arg d "$3" '{name: $n, ok: $ok, detail: $d}' >> "$checks"
  printf '   %-34s %s  %s\n' "$1" "$([[ $2 == true ]] && echo PASS || echo FAIL)" "$3"
}
secs() { awk "BEGIN{printf \"%.1f\", $1}"; }

finish() {
  local rc=$?
  trap - EXIT INT TERM
  local dropped=null down_ok=false down_s=null
  if [[ ${KEEP:-0} != 1 ]]; then
    step "k8s-down"
    local td=$SECONDS
    if k8s/down.sh > "$OUT/down.log" 2>&1; then down_ok=true; fi
    down_s=$((SECONDS - td))
    tail -3 "$OUT/down.log"
    dropped=$(grep -o 'egress guard: [0-9]*' "$OUT/down.log" | grep -o '[0-9]*$' || echo null)
    check "k8s-down leaves nothing" "$down_ok" "see down.log"
    [[ $dropped == 0 ]] && check "egress guard counted 0 packets" true "mangle $GUARD DROP counters" ||
      check "egress guard counted 0 packets" false "dropped=$dropped"
  fi
  jq -n --slurpfile checks "$checks" \
    --argjson up "$(cat "$OUT/up.json" 2>/dev/null || echo null)" \
    --argjson ready "$(cat "$OUT/ready.json" 2>/dev/null || echo null)" \
    --argjson service "$(cat "$OUT/load-service.json" 2>/dev/null || echo null)" \
    --argjson kvroute "$(cat "$OUT/load-kvroute.json" 2>/dev/null || echo null)" \
    --argjson faults "$(cat "$OUT/load-faults.json" 2>/dev/null || echo null)" \
    --argjson dropped "${dropped:-null}" --argjson down_s "$down_s" --argjson total $((SECONDS - t0)) \
    --argjson completed "$([[ -f $OUT/completed ]] && echo true || echo false)" \
    --arg version "$KUBE_VERSION" --arg commit "$(git rev-parse --short HEAD 2>/dev/null)" '
    def brief: if . == null then null else {requests, success_rate, hit_rate, ttft_p50_s, ttft_p90_s, failed, lost, unrouted, cut, per_pod, errors} end;
    {kube_version: $version, commit: $commit, total_s: $total,
     completed: $completed, passed: ($completed and ($checks | all(.ok))),
     checks: $checks, up: $up, ready: $ready,
     hit_rate: {plain_service: ($service.hit_rate), kvroute_service: ($kvroute.hit_rate)},
     load: {plain_service: ($service | brief), kvroute_service: ($kvroute | brief)},
     faults: (if $faults == null then null else ($faults.faults | map({kind, pod, at_s, requests, lost, unrouted, cut, errors})) end),
     fault_load: ($faults | brief),
     egress_dropped: $dropped, down_s: $down_s}' > "$OUT/result.json"
  step "result: $OUT/result.json"
  jq -r '"   passed: \(.passed)   hit rate plain Service \(.hit_rate.plain_service)  kvroute Service \(.hit_rate.kvroute_service)",
    (.faults // [] | .[] | "   fault \(.kind) \(.pod): \(.requests) requests, \(.lost) lost (\(.unrouted) never reached a pod), \(.cut) cut")' "$OUT/result.json"
  if [[ $(jq -r .passed "$OUT/result.json") != true ]]; then rc=1; fi
  exit $rc
}
trap finish EXIT
trap 'exit 130' INT TERM

# The body is one function, so bash has read all of it before it runs
# (editing the file during a run cannot change what runs).
main() {
# --- up
step "k8s-up"
tu=$SECONDS
if ! k8s/up.sh 2>&1 | tee "$OUT/up.log" | grep --line-buffered -E '^== '; then
  tail -5 "$OUT/up.log"
  check "k8s-up" false "see up.log"
  exit 1
fi
echo "{\"seconds\": $((SECONDS - tu)), \"cluster_seconds\": $(cat "$RUNDIR/up-seconds")}" > "$OUT/up.json"
export KUBECONFIG=$KUBECONFIG_ADMIN
k() { "$KBIN/kubectl" -n "$NS" "$@"; }
go build -o "$OUT/load" ./k8s/load || exit 1

# --- deploy: the Secret (generated here, never committed), the overlay, a plain Service
step "deploy overlays/cpu-sim ($REPLICAS replicas)"
"$KBIN/kubectl" delete namespace "$NS" --ignore-not-found --wait=true >/dev/null
"$KBIN/kubectl" create namespace "$NS" >/dev/null
k create secret generic kvroute-cluster-secret --from-literal=secret="$(head -c 32 /dev/urandom | base64)" >/dev/null
tr0=$(date +%s.%N)
k apply -k manifests/overlays/cpu-sim >/dev/null || exit 1
k apply -f - >/dev/null <<EOF
# The user's situation before kvroute: a Service straight to vLLM's port.
apiVersion: v1
kind: Service
metadata: {name: vllm-direct}
spec:
  selector: {app.kubernetes.io/name: kvroute, app.kubernetes.io/instance: kvroute}
  ports: [{name: vllm, port: 8001, targetPort: 8001}]
EOF
if k rollout status deploy/kvroute --timeout=180s >/dev/null; then
  ready_s=$(secs "$(date +%s.%N) - $tr0")
  check "rollout: $REPLICAS pods Ready" true "${ready_s}s from apply"
else
  check "rollout: $REPLICAS pods Ready" false "not Ready in 180s"; k get pods -o wide; exit 1
fi
echo "{\"pods_ready_s\": $ready_s}" > "$OUT/ready.json"
k get pods -o wide > "$OUT/pods.txt"

pods() { k get pods -l app.kubernetes.io/name=kvroute -o json | jq -r '.items[] | select(.metadata.deletionTimestamp == null) | "\(.metadata.name) \(.status.podIP)"'; }

# --- every sidecar lists every pod
step "checks"
peers_ok() {
  local names ips n
  names=$(pods | awk '{print $1}' | sort | tr '\n' ' ')
  for ip in $(pods | awk '{print $2}'); do
    n=$(curl -fsS --max-time 2 "http://$ip:9090/debug/peers" | jq -r '[.[] | select(.draining | not) | .id] | sort | join(" ")') || return 1
    [[ "$n " == "$names" ]] || return 1
  done
}
t1=$SECONDS
if wait_for "every sidecar to list every pod" 60 peers_ok; then
  check "every /debug/peers lists every pod" true "after $((SECONDS - t1))s"
else
  check "every /debug/peers lists every pod" false "$(for ip in $(pods | awk '{print $2}'); do curl -s --max-time 2 "http://$ip:9090/debug/peers" | jq -c '[.[].id]'; done)"
fi

pod1=$(pods | head -1 | awk '{print $1}')
ip1=$(pods | head -1 | awk '{print $2}')
spec=$(k get pod "$pod1" -o json)
# Native sidecar: an init container with restartPolicy Always, started
# (and Ready) before the vllm container started.
native=$(jq -r '.spec.initContainers[] | select(.name == "kvroute") | .restartPolicy' <<<"$spec")
s_start=$(jq -r '.status.initContainerStatuses[] | select(.name == "kvroute") | .state.running.startedAt' <<<"$spec")
v_start=$(jq -r '.status.containerStatuses[] | select(.name == "vllm") | .state.running.startedAt' <<<"$spec")
if [[ $native == Always && -n $s_start && $s_start != null && ! $s_start > $v_start ]]; then
  check "native sidecar starts first" true "restartPolicy Always; kvroute $s_start, vllm $v_start"
else
  check "native sidecar starts first" false "restartPolicy=$native kvroute=$s_start vllm=$v_start"
fi
# Probes: both containers Ready through their probes; the endpoints answer.
rz=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$ip1:9090/readyz")
lz=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$ip1:9090/livez")
vm=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$ip1:8001/v1/models")
readyc=$(jq -r '[(.status.initContainerStatuses[], .status.containerStatuses[]) | select(.ready)] | length' <<<"$spec")
[[ $rz == 200 && $lz == 200 && $vm == 200 && $readyc == 2 ]] &&
  check "probes" true "/readyz $rz /livez $lz vllm /v1/models $vm, 2/2 containers Ready" ||
  check "probes" false "/readyz $rz /livez $lz /v1/models $vm ready=$readyc"
# Read-only root filesystem and the non-root user, from inside the sidecar.
ro=$(k exec "$pod1" -c kvroute -- sh -c 'id -u; touch /probe-write 2>&1 || true' 2>&1 | tr '\n' ' ')
[[ $ro == 65532\ *Read-only\ file\ system* ]] &&
  check "sidecar read-only rootfs, uid 65532" true "$ro" || check "sidecar read-only rootfs, uid 65532" false "$ro"
# The response headers say which pod served and why.
hdr=$(curl -s -D - -o /dev/null --max-time 5 "http://$(k get svc kvroute -o jsonpath='{.spec.clusterIP}'):8000/v1/chat/completions" \
  -H 'content-type: application/json' -d '{"model":"Qwen/Qwen3-0.6B","messages":[{"role":"user","content":"hi"}],"max_tokens":4}' | tr -d '\r')
grep -qi '^x-kvroute-served-by: kvroute-' <<<"$hdr" &&
  check "ClusterIP answers with X-Kvroute-Served-By" true "$(grep -i '^x-kvroute-' <<<"$hdr" | tr '\n' ' ')" ||
  check "ClusterIP answers with X-Kvroute-Served-By" false "$hdr"

# --- hit rates: the same workload (other seeds, so neither finds the
# other's prefixes cached) through a plain Service to vLLM and through kvroute
svc_ip=$(k get svc kvroute -o jsonpath='{.spec.clusterIP}')
direct_ip=$(k get svc vllm-direct -o jsonpath='{.spec.clusterIP}')
step "load: plain Service to the vLLM port ($RATE req/s, ${LOAD_S}s)"
"$OUT/load" --url "http://$direct_ip:8001" --name plain-service --rate "$RATE" --duration "${LOAD_S}s" \
  --pods $REPLICAS --seed 1 --out "$OUT/load-service.json" 2> "$OUT/load-service.log"
step "load: kvroute Service ($RATE req/s, ${LOAD_S}s)"
"$OUT/load" --url "http://$svc_ip:8000" --name kvroute-service --rate "$RATE" --duration "${LOAD_S}s" \
  --pods $REPLICAS --seed 2 --out "$OUT/load-kvroute.json" 2> "$OUT/load-kvroute.log"
hs=$(jq .hit_rate "$OUT/load-service.json"); hk=$(jq .hit_rate "$OUT/load-kvroute.json")
check "kvroute hit rate above plain Service" "$(jq -n "$hk > $hs")" "kvroute $hk, plain Service $hs"
check "no failed requests without faults" "$(jq -n "$(jq .failed "$OUT/load-service.json") + $(jq .failed "$OUT/load-kvroute.json") == 0")" \
  "plain $(jq .failed "$OUT/load-service.json"), kvroute $(jq .failed "$OUT/load-kvroute.json")"

# --- faults under load
step "faults under load through the kvroute Service (${FAULT_LOAD_S}s)"
export NS FAULTS=$OUT/faults.jsonl
: > "$FAULTS"
"$OUT/load" --url "http://$svc_ip:8000" --name kvroute-faults --rate "$RATE" --duration "${FAULT_LOAD_S}s" \
  --pods $REPLICAS --seed 3 --faults "$FAULTS" --out "$OUT/load-faults.json" 2> "$OUT/load-faults.log" &
load_pid=$!
drain_seen=false
sleep 10
# The issue's four faults, then two informational ones: a frozen engine
# (detected by the sidecar's health probe, so requests it already took
# wait for that) and a pod cut off from its peers (clients still reach it).
for f in delete-pod force-delete kill-engine rollout-restart hang-engine partition; do
  kill -0 $load_pid 2>/dev/null || break
  victim=$(k8s/fault.sh "$f" | jq -r .pod)
  printf '   %-16s %s\n' "$f" "$victim"
  if [[ $f == hang-engine ]]; then
    sleep "${HANG_S:-15}"
    k8s/fault.sh resume-engine "$victim" >/dev/null
  fi
  if [[ $f == partition ]]; then
    sleep "${HANG_S:-15}"
    k8s/fault.sh heal "$victim" >/dev/null
  fi
  if [[ $f == delete-pod ]]; then
    # The preStop hook calls the sidecar's /drain: its /readyz turns 503 while it terminates.
    vip=$(k get pod "$victim" -o jsonpath='{.status.podIP}' 2>/dev/null)
    for _ in $(seq 1 20); do
      body=$(curl -s --max-time 1 "http://$vip:9090/readyz")
      if [[ $body == *draining* ]]; then drain_seen=true; break; fi
      sleep 0.25
    done
  fi
  k8s/fault.sh ready || echo "   not all Ready again after $f"
  sleep 8
done
wait $load_pid
check "preStop drain (readyz 503 draining)" "$drain_seen" "during kubectl delete pod"
if [[ -f $OUT/load-faults.json ]]; then
  # Lost before the first fault or in the window of one of the four.
  lost=$(jq '.lost - ([.faults[] | select(.kind | IN("hang-engine", "resume-engine", "partition", "heal")) | .lost] | add // 0)' "$OUT/load-faults.json")
  cut=$(jq '[.faults[] | select(.kind | IN("hang-engine", "resume-engine", "partition", "heal") | not) | .cut] | add // 0' "$OUT/load-faults.json")
  check "no request lost that a live pod could serve" "$(jq -n "$lost == 0")" \
    "delete, forced delete, engine kill, rollout restart: lost $lost, streams cut on a killed pod $cut"
  nf=$(jq '[.faults[] | select(.kind | IN("delete-pod", "force-delete", "kill-engine", "rollout-restart"))] | length' "$OUT/load-faults.json")
  check "all 4 faults injected" "$(jq -n "$nf == 4")" "$nf"
else
  check "fault load finished" false "no load-faults.json"
fi
# Every pod back, and in every peer table.
wait_for "peers after the faults" 60 peers_ok &&
  check "after the faults every /debug/peers lists every pod" true "" ||
  check "after the faults every /debug/peers lists every pod" false ""
k get pods -o wide > "$OUT/pods-after.txt"

# The overlay's requests let 8 pods fit on this 2-CPU node.
step "scale to 8 replicas"
k scale deploy/kvroute --replicas=8 >/dev/null
if k rollout status deploy/kvroute --timeout=120s >/dev/null && wait_for "8 pods in every peer table" 60 peers_ok; then
  check "8 replicas fit on 2 CPUs and find each other" true "$(k get deploy kvroute -o jsonpath='{.status.readyReplicas}') Ready"
else
  check "8 replicas fit on 2 CPUs and find each other" false "$(k get pods --no-headers | awk '{print $3}' | sort | uniq -c | tr '\n' ' ')"
fi
touch "$OUT/completed"
}
main "$@"
