#!/usr/bin/env bash
# make k8s-e2e: k8s-up, then two phases one after the other, then k8s-down:
#   kustomize  overlays/cpu-sim in namespace kvroute-e2e: the end-to-end
#              checks, the hit rates, the faults under load, 8 replicas
#   helm       charts/kvroute with values-sim.yaml in namespace kvroute-helm
#              (after kvroute-e2e is deleted, so the node has the CPU): pods
#              Ready, the mesh, the hit rates, `helm upgrade` to a changed
#              sidecar flag under load, `helm uninstall` leaving nothing
# Writes $OUT/result.json (machine-readable: every check with its verdict,
# the figures) and $OUT/*.json per load run. Exits 0 only when every check
# passed and k8s-down left nothing.
#
# KEEP=1 leaves the cluster up afterwards; PHASES picks phases (default
# "kustomize helm"); RATE, LOAD_S and FAULT_LOAD_S size the load (defaults
# 4 req/s, 60 s and 190 s), HELM_LOAD_S and UPGRADE_LOAD_S the helm phase's
# (40 s per Service, 80 s around the upgrade); HANG_S how long the engine
# stays frozen and the pod cut off (15 s each).
set -uo pipefail
cd "$(dirname "$0")/.."
. k8s/env.sh
need_root k8s-e2e
OUT=${OUT:-out/k8s-e2e}
PHASES=${PHASES:-kustomize helm}
KNS=kvroute-e2e                      # the kustomize phase's namespace
HNS=kvroute-helm                     # the helm phase's
NS=$KNS                              # the namespace k(), pods() and fault.sh act on
# The release name "kvroute" gives every object the kustomize base's name
# (charts/kvroute/README.md), so both phases check the same names.
RELEASE=kvroute
RATE=${RATE:-4}
LOAD_S=${LOAD_S:-60}
FAULT_LOAD_S=${FAULT_LOAD_S:-190}
HELM_LOAD_S=${HELM_LOAD_S:-40}
UPGRADE_LOAD_S=${UPGRADE_LOAD_S:-80}
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
  printf '   %-50s %s  %s\n' "$1" "$([[ $2 == true ]] && echo PASS || echo FAIL)" "$3"
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
    --argjson h_install "$(cat "$OUT/helm-install.json" 2>/dev/null || echo null)" \
    --argjson h_service "$(cat "$OUT/load-helm-service.json" 2>/dev/null || echo null)" \
    --argjson h_kvroute "$(cat "$OUT/load-helm-kvroute.json" 2>/dev/null || echo null)" \
    --argjson h_upgrade "$(cat "$OUT/helm-upgrade.json" 2>/dev/null || echo null)" \
    --argjson h_upload "$(cat "$OUT/load-helm-upgrade.json" 2>/dev/null || echo null)" \
    --argjson h_uninstall "$(cat "$OUT/helm-uninstall.json" 2>/dev/null || echo null)" \
    --arg phases "$PHASES" \
    --argjson dropped "${dropped:-null}" --argjson down_s "$down_s" --argjson total $((SECONDS - t0)) \
    --argjson completed "$([[ -f $OUT/completed ]] && echo true || echo false)" \
    --arg version "$KUBE_VERSION" --arg commit "$(git rev-parse --short HEAD 2>/dev/null)" '
    def brief: if . == null then null else {requests, success_rate, hit_rate, ttft_p50_s, ttft_p90_s, failed, lost, unrouted, cut, per_pod, errors} end;
    {kube_version: $version, commit: $commit, total_s: $total, phases: ($phases | split(" ")),
     completed: $completed, passed: ($completed and ($checks | all(.ok))),
     checks: $checks, up: $up, ready: $ready,
     hit_rate: {plain_service: ($service.hit_rate), kvroute_service: ($kvroute.hit_rate)},
     load: {plain_service: ($service | brief), kvroute_service: ($kvroute | brief)},
     faults: (if $faults == null then null else ($faults.faults | map({kind, pod, at_s, requests, lost, unrouted, cut, errors})) end),
     fault_load: ($faults | brief),
     helm: (if $h_install == null then null else
       {install: $h_install,
        hit_rate: {plain_service: ($h_service.hit_rate), kvroute_service: ($h_kvroute.hit_rate)},
        load: {plain_service: ($h_service | brief), kvroute_service: ($h_kvroute | brief)},
        upgrade: (if $h_upgrade == null then null else $h_upgrade + {load: ($h_upload | brief),
          windows: ($h_upload.faults // [] | map({kind, at_s, requests, lost, errors}))} end),
        uninstall: $h_uninstall} end),
     egress_dropped: $dropped, down_s: $down_s}' > "$OUT/result.json"
  step "result: $OUT/result.json"
  jq -r '"   passed: \(.passed)",
    (select(.hit_rate.plain_service != null) | "   hit rate plain Service \(.hit_rate.plain_service)  kvroute Service \(.hit_rate.kvroute_service)"),
    (.faults // [] | .[] | "   fault \(.kind) \(.pod): \(.requests) requests, \(.lost) lost (\(.unrouted) never reached a pod), \(.cut) cut"),
    (.helm // empty | "   helm: hit rate plain Service \(.hit_rate.plain_service)  kvroute Service \(.hit_rate.kvroute_service)",
      (.upgrade // empty | "   helm upgrade under load: \(.rollout_s)s, \(.load.requests) requests, \(.load.lost) lost, \(.load.failed) failed"),
      (.uninstall // empty | "   helm uninstall: \(.made | length) objects made, \(.left | length) left"))' "$OUT/result.json"
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
go build -o "$OUT/load" ./k8s/load || exit 1
for phase in $PHASES; do
  case $phase in
    kustomize) kustomize_phase ;;
    helm) HELM=$(k8s/build-helm.sh) || exit 1; helm_phase ;;
    *) echo "k8s-e2e: unknown phase $phase (PHASES: kustomize helm)" >&2; exit 2 ;;
  esac
done
touch "$OUT/completed"
}

k() { "$KBIN/kubectl" -n "$NS" "$@"; }
pods() { k get pods -l app.kubernetes.io/name=kvroute -o json | jq -r '.items[] | select(.metadata.deletionTimestamp == null) | "\(.metadata.name) \(.status.podIP)"'; }
# Every sidecar lists every pod (and no draining one).
peers_ok() {
  local names ips n
  names=$(pods | awk '{print $1}' | sort | tr '\n' ' ')
  for ip in $(pods | awk '{print $2}'); do
    n=$(curl -fsS --max-time 2 "http://$ip:9090/debug/peers" | jq -r '[.[] | select(.draining | not) | .id] | sort | join(" ")') || return 1
    [[ "$n " == "$names" ]] || return 1
  done
}
peers_seen() { for ip in $(pods | awk '{print $2}'); do curl -s --max-time 2 "http://$ip:9090/debug/peers" | jq -c '[.[].id]'; done; }

kustomize_phase() {
NS=$KNS
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

# --- every sidecar lists every pod
step "checks"
t1=$SECONDS
if wait_for "every sidecar to list every pod" 60 peers_ok; then
  check "every /debug/peers lists every pod" true "after $((SECONDS - t1))s"
else
  check "every /debug/peers lists every pod" false "$(peers_seen)"
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
}

# The chart the way the README installs it: values-sim.yaml, plus the plain
# Service for the hit-rate comparison (plainService, the kustomize phase's
# vllm-direct). Helm's cache, config and data stay in $OUT, not in $HOME.
helm_phase() {
NS=$HNS
export HELM_CACHE_HOME=$OUT/helm-home/cache HELM_CONFIG_HOME=$OUT/helm-home/config HELM_DATA_HOME=$OUT/helm-home/data
h() { "$HELM" --kubeconfig "$KUBECONFIG_ADMIN" -n "$NS" "$@"; }
local values=(-f charts/kvroute/values-sim.yaml --set plainService.enabled=true)
local deploy=kvroute sel=app.kubernetes.io/instance=$RELEASE
if "$KBIN/kubectl" get namespace "$KNS" >/dev/null 2>&1; then
  # 8 pods of 200m each there; the release's 4 more would not fit on 2 CPUs.
  step "helm: deleting namespace $KNS first (the node's CPU)"
  "$KBIN/kubectl" delete namespace "$KNS" --wait=true --timeout=180s >/dev/null
fi

# --- install
step "helm install $RELEASE charts/kvroute -f charts/kvroute/values-sim.yaml (namespace $NS)"
local tr0 ready_s n st
tr0=$(date +%s.%N)
if h install "$RELEASE" charts/kvroute --create-namespace "${values[@]}" --wait --timeout 180s \
     > "$OUT/helm-install.log" 2>&1 && k rollout status "deploy/$deploy" --timeout=60s >/dev/null; then
  ready_s=$(secs "$(date +%s.%N) - $tr0")
  n=$(k get deploy "$deploy" -o jsonpath='{.status.readyReplicas}')
  st=$(h status "$RELEASE" -o json | jq -c '{status: .info.status, revision: .version}')
  check "helm: install, $REPLICAS pods Ready" "$([[ $n == "$REPLICAS" ]] && echo true || echo false)" \
    "$n Ready ${ready_s}s from helm install; $st"
else
  check "helm: install, $REPLICAS pods Ready" false "$(tail -3 "$OUT/helm-install.log" | tr '\n' ' ')"
  k get pods -o wide; exit 1
fi
jq -n --argjson s "$ready_s" --argjson st "$st" --arg chart "$(h list -o json | jq -r '.[0].chart')" \
  '{pods_ready_s: $s, chart: $chart} + $st' > "$OUT/helm-install.json"
k get pods -o wide > "$OUT/helm-pods.txt"
# NOTES.txt tells the user where the Service is.
grep -qF "http://$deploy.$NS.svc:8000/v1" "$OUT/helm-install.log" &&
  check "helm: NOTES name the Service" true "http://$deploy.$NS.svc:8000/v1" ||
  check "helm: NOTES name the Service" false "see helm-install.log"

local t1=$SECONDS
if wait_for "every sidecar to list every pod" 60 peers_ok; then
  check "helm: every /debug/peers lists every pod" true "after $((SECONDS - t1))s"
else
  check "helm: every /debug/peers lists every pod" false "$(peers_seen)"
fi

# --- hit rates, as in the kustomize phase (other seeds; shorter)
local svc_ip direct_ip hs hk
svc_ip=$(k get svc "$deploy" -o jsonpath='{.spec.clusterIP}')
direct_ip=$(k get svc "$deploy-direct" -o jsonpath='{.spec.clusterIP}')
step "helm: load, plain Service $deploy-direct ($RATE req/s, ${HELM_LOAD_S}s)"
"$OUT/load" --url "http://$direct_ip:8001" --name helm-plain-service --rate "$RATE" --duration "${HELM_LOAD_S}s" \
  --pods $REPLICAS --seed 4 --out "$OUT/load-helm-service.json" 2> "$OUT/load-helm-service.log"
step "helm: load, kvroute Service ($RATE req/s, ${HELM_LOAD_S}s)"
"$OUT/load" --url "http://$svc_ip:8000" --name helm-kvroute-service --rate "$RATE" --duration "${HELM_LOAD_S}s" \
  --pods $REPLICAS --seed 5 --out "$OUT/load-helm-kvroute.json" 2> "$OUT/load-helm-kvroute.log"
hs=$(jq .hit_rate "$OUT/load-helm-service.json"); hk=$(jq .hit_rate "$OUT/load-helm-kvroute.json")
check "helm: kvroute hit rate above plain Service" "$(jq -n "$hk > $hs")" "kvroute $hk, plain Service $hs"
check "helm: no failed requests without faults" \
  "$(jq -n "$(jq .failed "$OUT/load-helm-service.json") + $(jq .failed "$OUT/load-helm-kvroute.json") == 0")" \
  "plain $(jq .failed "$OUT/load-helm-service.json"), kvroute $(jq .failed "$OUT/load-helm-kvroute.json")"

# --- helm upgrade under load: a sidecar flag changes (--drain-timeout
# 90s -> 60s), so every pod is replaced, one at a time (maxUnavailable 1).
# The upgrade's start and end go to the load's --faults file, which splits
# the requests into before, during and after; a failure in any window is lost.
local secret0 pods0 upg=$OUT/helm-upgrade.jsonl load_pid t_a t_b up_ok=false
secret0=$(k get secret "$RELEASE-cluster-secret" -o jsonpath='{.data.secret}')
pods0=$(pods | awk '{print $1}' | sort)
: > "$upg"
step "helm upgrade --set sidecar.drainTimeout=60s under load ($RATE req/s, ${UPGRADE_LOAD_S}s)"
"$OUT/load" --url "http://$svc_ip:8000" --name helm-upgrade --rate "$RATE" --duration "${UPGRADE_LOAD_S}s" \
  --pods $REPLICAS --seed 6 --faults "$upg" --out "$OUT/load-helm-upgrade.json" 2> "$OUT/load-helm-upgrade.log" &
load_pid=$!
sleep 10
t_a=$(date +%s%3N)
jq -cn --argjson at "$t_a" '{at_ms: $at, kind: "helm-upgrade", pod: ""}' >> "$upg"
if h upgrade "$RELEASE" charts/kvroute "${values[@]}" --set sidecar.drainTimeout=60s --wait --timeout 300s \
     > "$OUT/helm-upgrade.log" 2>&1 && k rollout status "deploy/$deploy" --timeout=120s >/dev/null; then
  up_ok=true
fi
t_b=$(date +%s%3N)
jq -cn --argjson at "$t_b" '{at_ms: $at, kind: "helm-upgraded", pod: ""}' >> "$upg"
wait $load_pid
local rollout_s rev new flags before_end=false lost failed
rollout_s=$(secs "($t_b - $t_a) / 1000")
rev=$(h status "$RELEASE" -o json | jq -c '{status: .info.status, revision: .version}')
# Every pod is new and runs the new flag.
new=$(comm -12 <(echo "$pods0") <(pods | awk '{print $1}' | sort) | wc -l)
flags=$(k get pods -l "$sel" -o json | jq '[.items[] | select(.metadata.deletionTimestamp == null)
  | select(.spec.initContainers[] | select(.name == "kvroute") | .args | index("--drain-timeout=60s"))] | length')
[[ $up_ok == true && $new == 0 && $flags == "$REPLICAS" && $(jq -r .revision <<<"$rev") == 2 ]] &&
  check "helm upgrade: every pod replaced, new flag" true "${rollout_s}s; $rev; $flags pods with --drain-timeout=60s" ||
  check "helm upgrade: every pod replaced, new flag" false "ok=$up_ok $rev; $new old pods left; $flags with the flag; $(tail -2 "$OUT/helm-upgrade.log" | tr '\n' ' ')"
if [[ -f $OUT/load-helm-upgrade.json ]]; then
  lost=$(jq .lost "$OUT/load-helm-upgrade.json"); failed=$(jq .failed "$OUT/load-helm-upgrade.json")
  check "helm upgrade under load: 0 lost" "$(jq -n "$lost == 0")" \
    "$(jq -r '"\(.requests) requests, \(.lost) lost, \(.failed) failed; during the upgrade \([.faults[] | select(.kind == "helm-upgrade") | .requests] | add // 0)"' "$OUT/load-helm-upgrade.json")"
  # The whole rollout ran under load: it ended before the last request was sent.
  jq -e --argjson d "$UPGRADE_LOAD_S" '[.faults[] | select(.kind == "helm-upgraded") | .at_s] | .[0] < $d' \
    "$OUT/load-helm-upgrade.json" >/dev/null && before_end=true
  check "helm upgrade ended while the load ran" "$before_end" \
    "ended at $(jq '[.faults[] | select(.kind == "helm-upgraded") | .at_s] | .[0]' "$OUT/load-helm-upgrade.json")s of ${UPGRADE_LOAD_S}s"
else
  check "helm upgrade under load: 0 lost" false "no load-helm-upgrade.json"
fi
# A new secret would split the mesh into old and new pods during the rollout.
[[ -n $secret0 && $(k get secret "$RELEASE-cluster-secret" -o jsonpath='{.data.secret}') == "$secret0" ]] &&
  check "helm upgrade kept the cluster secret" true "$RELEASE-cluster-secret unchanged (lookup)" ||
  check "helm upgrade kept the cluster secret" false "changed or missing"
wait_for "peers after the upgrade" 60 peers_ok &&
  check "helm: upgraded pods all in every /debug/peers" true "" ||
  check "helm: upgraded pods all in every /debug/peers" false "$(peers_seen)"
jq -n --argjson s "$rollout_s" --argjson st "$rev" --argjson ok "$up_ok" \
  '{rollout_s: $s, changed: "sidecar.drainTimeout 90s -> 60s (--drain-timeout)", ok: $ok} + $st' > "$OUT/helm-upgrade.json"

# --- helm uninstall: the objects of the release's manifest, and anything
# else in the namespace, must be gone. A namespace keeps only what
# Kubernetes puts in every namespace (ConfigMap kube-root-ca.crt,
# ServiceAccount default) and Events (they expire on their own; they are
# records about the objects, not objects of the release). The release
# records (Secrets sh.helm.release.v1.*) and the cluster Secret go too.
local made tu0 un_ok=false kinds left left_made
h get manifest "$RELEASE" > "$OUT/helm-manifest.yaml"
made=$(k get -f "$OUT/helm-manifest.yaml" -o name | sort)
k get secrets -o name > "$OUT/helm-secrets-before.txt"
step "helm uninstall $RELEASE --cascade foreground --wait"
tu0=$(date +%s.%N)
h uninstall "$RELEASE" --cascade foreground --wait --timeout 180s > "$OUT/helm-uninstall.log" 2>&1 && un_ok=true
# Foreground deletion removes the ReplicaSets' pods first; their grace
# period (the drain) may still run.
wait_for "the release's pods to go" 180 bash -c "[[ -z \$('$KBIN/kubectl' -n '$NS' get pods -l '$sel' -o name 2>/dev/null) ]]"
local un_s
un_s=$(secs "$(date +%s.%N) - $tu0")
check "helm uninstall" "$un_ok" "${un_s}s, pods gone included; $(tail -1 "$OUT/helm-uninstall.log")"
left_made=$(k get -f "$OUT/helm-manifest.yaml" --ignore-not-found -o name 2>/dev/null | sort)
[[ -z $left_made && -n $made ]] &&
  check "helm uninstall: none of the objects it made left" true "$(wc -l <<<"$made") gone: $(sed 's|/.*||' <<<"$made" | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}' | sed 's/, $//')" ||
  check "helm uninstall: none of the objects it made left" false "left: $(tr '\n' ' ' <<<"$left_made")"
kinds=$("$KBIN/kubectl" api-resources --verbs=list --namespaced -o name | grep -vxE 'events|events\.events\.k8s\.io' | paste -sd,)
# A failed list must not read as an empty namespace.
left=$(k get "$kinds" --ignore-not-found -o name 2>"$OUT/helm-left.err") || left="(kubectl get failed: $(tail -1 "$OUT/helm-left.err"))"
left=$(grep -vxE 'configmap/kube-root-ca\.crt|serviceaccount/default' <<<"$left" | sort)
[[ -z $left ]] &&
  check "helm uninstall: namespace empty but its defaults" true "$(tr ',' '\n' <<<"$kinds" | wc -l) kinds listed; release records and $RELEASE-cluster-secret gone" ||
  check "helm uninstall: namespace empty but its defaults" false "left: $(tr '\n' ' ' <<<"$left")"
jq -n --argjson s "$un_s" --argjson ok "$un_ok" --arg made "$made" --arg left "$left" --arg kinds "$kinds" \
  '{seconds: $s, ok: $ok, made: ($made | split("\n") | map(select(. != ""))),
    left: ($left | split("\n") | map(select(. != ""))), kinds_listed: ($kinds | split(",") | length)}' > "$OUT/helm-uninstall.json"
}
main "$@"
