package charttest

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestLint runs `helm lint --strict` with the defaults and each preset: no error and no
// warning. Info messages (such as "icon is recommended") are logged.
func TestLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range presets {
		t.Run(p.Name, func(t *testing.T) {
			l := action.NewLint()
			l.Strict, l.Namespace, l.KubeVersion = true, namespace, kv
			res := l.Run([]string{chartDir}, presetValues(t, p.Values))
			if res.TotalChartsLinted != 1 {
				t.Errorf("linted %d charts; want 1", res.TotalChartsLinted)
			}
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("lint: %s", m)
				} else {
					t.Logf("lint: %s", m)
				}
			}
			for _, err := range res.Errors {
				t.Errorf("lint: %v", err)
			}
		})
	}
}

// TestLintFindsProblems shows that the lint action would fail the chart for a broken value:
// the schema is part of lint.
func TestLintFindsProblems(t *testing.T) {
	l := action.NewLint()
	l.Strict, l.Namespace = true, namespace
	res := l.Run([]string{chartDir}, map[string]any{"sidecar": map[string]any{"drainTimeout": "1m30s"}})
	if len(res.Errors) == 0 {
		t.Errorf("lint with sidecar.drainTimeout=1m30s found nothing; want a schema error")
	}
}

func TestKubeVersion(t *testing.T) {
	ch := loadChart(t)
	if _, err := helmTemplateOn(ch, nil, releaseName, "v1.29.9"); err == nil || !strings.Contains(err.Error(), "kubeVersion") {
		t.Errorf("render for Kubernetes 1.29 = %v; want a kubeVersion error (native sidecars need 1.29+, the sleep hook 1.30)", err)
	}
	if _, err := helmTemplateOn(ch, nil, releaseName, "v1.34.4"); err != nil {
		t.Errorf("render for Kubernetes 1.34 (make k8s-e2e's): %v", err)
	}
}

// TestDashboardIsTheBase: the chart ships a copy of the kustomize base's dashboard (Helm
// packages only files inside the chart, and a symlink out of it breaks a chart copied on its
// own), so the copy must stay the same bytes.
func TestDashboardIsTheBase(t *testing.T) {
	want := readFile(t, filepath.Join(manifestsDir, "base/dashboards/kvroute.json"))
	got := readFile(t, filepath.Join(chartDir, "dashboards/kvroute.json"))
	if !bytes.Equal(got, want) {
		t.Fatalf("charts/kvroute/dashboards/kvroute.json differs from manifests/base/dashboards/kvroute.json; run\n" +
			"  cp manifests/base/dashboards/kvroute.json charts/kvroute/dashboards/kvroute.json")
	}
	b, err := decode(mustTemplate(t, loadChart(t), nil).Objects)
	if err != nil {
		t.Fatal(err)
	}
	cm := b.configMap("kvroute-dashboard")
	if cm == nil || cm.Data["kvroute.json"] != string(want) || cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("ConfigMap kvroute-dashboard does not carry the dashboard byte for byte with label grafana_dashboard=1: %v", cm)
	}
}

var flagDecl = regexp.MustCompile(`fs\.(\w+)\((?:&[\w.]+, )?"([a-z0-9-]+)"`)

// binaryFlags reads the flag names a binary declares on its *flag.FlagSet fs.
func binaryFlags(t *testing.T, file string) map[string]bool {
	t.Helper()
	flags := map[string]bool{}
	for _, m := range flagDecl.FindAllStringSubmatch(string(readFile(t, filepath.Join(repoRoot, file))), -1) {
		flags[m[2]] = true
	}
	if len(flags) < 5 {
		t.Fatalf("%s: found only %d flags; has the declaration style changed?", file, len(flags))
	}
	return flags
}

// TestFlags checks every flag the chart passes, in every preset, against the binaries' own
// declarations: the sidecar's (cmd/sidecar/config.go, and join in serve.go) and the
// simulator's, which takes vLLM's names (cmd/vllm-sim/flags.go).
func TestFlags(t *testing.T) {
	side := binaryFlags(t, "cmd/sidecar/config.go")
	side["join"] = true // declared on a local variable in serve.go
	sim := binaryFlags(t, "cmd/vllm-sim/flags.go")
	ch := loadChart(t)
	for _, p := range presets {
		b, err := decode(mustTemplate(t, ch, presetValues(t, p.Values)).Objects)
		if err != nil {
			t.Fatal(err)
		}
		pod := b.Deployments[0].Spec.Template.Spec
		for _, c := range []struct {
			args  []string
			flags map[string]bool
		}{{pod.InitContainers[0].Args, side}, {findContainer(pod.Containers, "vllm").Args, sim}} {
			for _, a := range c.args {
				if !strings.HasPrefix(a, "--") {
					continue
				}
				n, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if !c.flags[n] {
					t.Errorf("%s: flag --%s is not declared by the binary", p.Name, n)
				}
			}
		}
	}
}

// TestSecondRelease: a second release in the same namespace gets its own names, labels, seeds
// and gossip label, so the two form two meshes and no object of one selects the other's pods.
func TestSecondRelease(t *testing.T) {
	ch := loadChart(t)
	first := mustTemplate(t, ch, nil).Objects
	r, err := helmTemplate(ch, nil, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ids(r.Objects) {
		if slices.Contains(ids(first), n) {
			t.Errorf("release team-b renders %s, which release kvroute has too", n)
		}
	}
	b, err := decode(r.Objects)
	if err != nil {
		t.Fatal(err)
	}
	a, err := decode(first)
	if err != nil {
		t.Fatal(err)
	}
	pods := b.Deployments[0].Spec.Template.Labels
	other := a.Deployments[0].Spec.Template.Labels
	var selectors []map[string]string
	for _, s := range b.Services {
		selectors = append(selectors, s.Spec.Selector)
	}
	selectors = append(selectors, b.PDBs[0].Spec.Selector.MatchLabels, b.NetworkPolicies[0].Spec.PodSelector.MatchLabels,
		b.Deployments[0].Spec.Selector.MatchLabels)
	for _, s := range selectors {
		if !selects(s, pods) || selects(s, other) {
			t.Errorf("selector %v: selects its pods %v: %v, the other release's %v: %v", s, pods, selects(s, pods), other, selects(s, other))
		}
	}
	args := strings.Join(b.Deployments[0].Spec.Template.Spec.InitContainers[0].Args, " ")
	for _, want := range []string{"--join=team-b-kvroute-gossip.$(POD_NAMESPACE).svc:7946", "--cluster-label=kvroute/$(POD_NAMESPACE)/team-b-kvroute"} {
		if !strings.Contains(args, want) || b.service("team-b-kvroute-gossip") == nil {
			t.Errorf("team-b sidecar args %q; want %s and its gossip Service", args, want)
		}
	}
	if v := b.Deployments[0].Spec.Template.Spec.Volumes[0]; v.Secret == nil || v.Secret.SecretName != "team-b-kvroute-cluster-secret" {
		t.Errorf("team-b mounts %+v; want its own Secret team-b-kvroute-cluster-secret", v)
	}
}

func TestPlainService(t *testing.T) {
	vals := withValue(presetValues(t, "values-sim.yaml"), "plainService.enabled", true)
	b, err := decode(mustTemplate(t, loadChart(t), vals).Objects)
	if err != nil {
		t.Fatal(err)
	}
	s := b.service("kvroute-direct")
	pods := b.Deployments[0].Spec.Template.Labels
	if s == nil || !selects(s.Spec.Selector, pods) || s.Spec.Ports[0].TargetPort != intstr.FromInt32(8001) {
		t.Fatalf("plain Service %+v; want kvroute-direct selecting the pods, to vLLM's 8001", s)
	}
	open := map[int32]bool{} // ports some rule admits from beyond the release's pods
	for _, r := range b.NetworkPolicies[0].Spec.Ingress {
		for _, p := range r.Ports {
			if !fromPods(r, pods) {
				open[p.Port.IntVal] = true
			}
		}
	}
	if !open[8001] || open[5557] || open[5558] {
		t.Errorf("NetworkPolicy opens %v beyond the release's pods; want 8001 for the plain Service and never the KV-event ports", open)
	}
}

// TestNetworkPolicyVLLM: without plainService, vLLM's HTTP port 8001 is admitted from the
// release's own pods only (a peer sidecar asks this vLLM about a stored response while this
// pod's sidecar is away), and the KV-event ports 5557/5558 from no one.
func TestNetworkPolicyVLLM(t *testing.T) {
	b, err := decode(mustTemplate(t, loadChart(t), presetValues(t, "values-sim.yaml")).Objects)
	if err != nil {
		t.Fatal(err)
	}
	pods := b.Deployments[0].Spec.Template.Labels
	peers := false
	for _, r := range b.NetworkPolicies[0].Spec.Ingress {
		for _, p := range r.Ports {
			switch port := p.Port.IntVal; {
			case port == 5557 || port == 5558:
				t.Errorf("NetworkPolicy rule %+v admits the KV-event port %d", r, port)
			case port == 8001 && !fromPods(r, pods):
				t.Errorf("NetworkPolicy rule %+v admits 8001 from beyond the release's pods %v", r, pods)
			case port == 8001:
				peers = true
			}
		}
	}
	if !peers {
		t.Errorf("NetworkPolicy closes 8001 to the release's pods: stored-response follow-ups wait 10 s for their 404 while a sidecar is away")
	}
}

// fromPods reports whether rule admits only pods that the selector labels pick, in the
// release's namespace.
func fromPods(r networkingv1.NetworkPolicyIngressRule, pods map[string]string) bool {
	if len(r.From) == 0 {
		return false
	}
	for _, p := range r.From {
		if p.NamespaceSelector != nil || p.IPBlock != nil || p.PodSelector == nil || !selects(p.PodSelector.MatchLabels, pods) {
			return false
		}
	}
	return true
}

func TestNetworkPolicyClients(t *testing.T) {
	clients := []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "apps"}}}}
	b, err := decode(mustTemplate(t, loadChart(t), withValue(nil, "networkPolicy.apiFrom", clients)).Objects)
	if err != nil {
		t.Fatal(err)
	}
	api := b.NetworkPolicies[0].Spec.Ingress[0]
	pods := b.Deployments[0].Spec.Template.Labels
	if api.Ports[0].Port.IntVal != 8000 || len(api.From) != 2 || !selects(api.From[0].PodSelector.MatchLabels, pods) ||
		api.From[1].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "apps" {
		t.Errorf("API rule %+v; want 8000 from the kvroute pods (peers forward) and namespace apps", api)
	}
}

// TestValuesRejected: the schema and the chart's own checks refuse values that would deploy a
// broken or open mesh, with a message that names the value.
func TestValuesRejected(t *testing.T) {
	ch := loadChart(t)
	tests := []struct {
		name string
		path string
		v    any
		want string
	}{
		{"misspelt key", "vllm.modle", "x", "modle"},
		{"flag without dashes", "sidecar.extraArgs", []any{"log-level=debug"}, "extraArgs"},
		{"duration the chart cannot check", "sidecar.drainTimeout", "1m30s", "drainTimeout"},
		{"grace shorter than the drain", "deployment.terminationGracePeriodSeconds", 100, "terminationGracePeriodSeconds"},
		{"metrics open to all", "networkPolicy.metricsFrom", []any{}, "metricsFrom"},
		{"pull policy", "vllm.image.pullPolicy", "Sometimes", "pullPolicy"},
		{"resource quantity", "vllm.resources.limits.memory", "lots", "memory"},
		{"inject without a target", "deployment.create", false, "existingDeployment.name"},
		{"plain Service named as the API one", "plainService", map[string]any{"enabled": true, "name": "kvroute"}, "plainService.name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := helmTemplate(ch, withValue(nil, tt.path, tt.v), releaseName)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("render with %s=%v: %v; want an error naming %q", tt.path, tt.v, err, tt.want)
			}
			t.Log(err)
		})
	}
}

// TestParityCatchesDrift: a changed value shows up as a difference that expectedDiffs does
// not explain.
func TestParityCatchesDrift(t *testing.T) {
	ch := loadChart(t)
	got := mustTemplate(t, ch, withValue(presetValues(t, "values-sim.yaml"), "sidecar.logLevel", "debug")).Objects
	want := difference{"Deployment/kvroute", "spec.template.spec.initContainers[kvroute].env[KVROUTE_LOG_LEVEL].value", `"info"`, `"debug"`}
	diffs := compare(kustomize(t, "overlays/cpu-sim"), got)
	if !slices.Contains(diffs, want) {
		t.Fatalf("compare after sidecar.logLevel=debug = %v; want %s", diffs, want)
	}
	for _, e := range expectedDiffs(ch) {
		if e.matches(want) {
			t.Errorf("expectedDiffs row %s explains a drift", e.difference)
		}
	}
}

func TestNotes(t *testing.T) {
	ch := loadChart(t)
	tests := []struct {
		name string
		vals map[string]any
		want []string
	}{
		{"defaults", nil, []string{
			"http://kvroute.llm.svc:8000/v1",
			"kubectl -n llm port-forward service/kvroute 8000:8000",
			"kubectl -n llm port-forward deployment/kvroute 9090:9090",
			"curl -s 'localhost:9090/debug/route?format=text' -d '{\"model\":\"Qwen/Qwen3-0.6B\"",
			"/debug/peers",
		}},
		{"existing secret", withValue(nil, "clusterSecret.existingSecret", "mesh-key"), []string{
			"kubectl -n llm create secret generic mesh-key",
		}},
		{"inject", withValue(withValue(nil, "deployment.create", false), "existingDeployment.name", "my-vllm"), []string{
			"kubectl -n llm patch deployment my-vllm --type strategic",
			"get configmap kvroute-sidecar-patch -o jsonpath='{.data.patch\\.yaml}'",
			"port-forward deployment/my-vllm 9090:9090",
			`--kv-events-config={"enable_kv_cache_events":true`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			notes := mustTemplate(t, ch, tt.vals).Notes
			for _, w := range tt.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES.txt lacks %q:\n%s", w, notes)
				}
			}
		})
	}
}

// TestPodMonitor: the optional PodMonitor scrapes the sidecar's admin port on the pods.
func TestPodMonitor(t *testing.T) {
	vals := withValue(withValue(nil, "podMonitor.enabled", true), "podMonitor.labels", map[string]any{"release": "prometheus"})
	b, err := decode(mustTemplate(t, loadChart(t), vals).Objects)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.PodMonitors) != 1 {
		t.Fatalf("%d PodMonitors; want 1", len(b.PodMonitors))
	}
	pm, tmpl := b.PodMonitors[0], b.Deployments[0].Spec.Template
	side := tmpl.Spec.InitContainers[0]
	e := pm.Spec.PodMetricsEndpoints[0]
	port := slices.IndexFunc(side.Ports, func(p corev1.ContainerPort) bool { return p.Name == e.Port && p.ContainerPort == 9090 })
	if !selects(pm.Spec.Selector.MatchLabels, tmpl.Labels) || port < 0 || e.Path != "/metrics" || pm.Metadata.Labels["release"] != "prometheus" {
		t.Errorf("PodMonitor %+v; want the pods' admin port /metrics, labelled release=prometheus", pm)
	}
	if n := len(mustTemplateKinds(t, nil)["PodMonitor"]); n != 0 {
		t.Errorf("defaults render %d PodMonitors; want none (the CRD may be absent)", n)
	}
}

func mustTemplateKinds(t *testing.T, vals map[string]any) map[string][]object {
	t.Helper()
	out := map[string][]object{}
	for _, o := range mustTemplate(t, loadChart(t), vals).Objects {
		k := fmt.Sprint(o["kind"])
		out[k] = append(out[k], o)
	}
	return out
}
