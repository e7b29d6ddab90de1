package manifests

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

var (
	flagsOnce sync.Once
	flagsVal  flagSets
	flagsErr  error
)

// binaryFlags reads the flag names of cmd/sidecar and cmd/vllm-sim from source.
func binaryFlags(t *testing.T) flagSets {
	t.Helper()
	flagsOnce.Do(func() {
		var side, sim []byte
		if side, flagsErr = os.ReadFile("../cmd/sidecar/config.go"); flagsErr != nil {
			return
		}
		if sim, flagsErr = os.ReadFile("../cmd/vllm-sim/flags.go"); flagsErr != nil {
			return
		}
		flagsVal = flagSets{Sidecar: parseFlagNames(string(side)), Sim: parseFlagNames(string(sim))}
	})
	if flagsErr != nil {
		t.Fatal(flagsErr)
	}
	return flagsVal
}

func renderBundle(t *testing.T, dir string) *bundle {
	t.Helper()
	b, err := decodeBundle(render(t, dir))
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	return b
}

func TestKustomizations(t *testing.T) {
	flags := binaryFlags(t)
	known, err := codeMetrics("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			b := renderBundle(t, dir)
			for _, p := range append(check(b, flags), checkDashboard(b, known)...) {
				t.Error(p)
			}
		})
	}
}

func TestFlagNames(t *testing.T) {
	f := binaryFlags(t)
	// join is declared on a local variable, not on the config struct.
	for _, n := range []string{"listen", "admin-listen", "join", "cluster-secret-file", "drain-timeout"} {
		if _, ok := f.Sidecar[n]; !ok {
			t.Errorf("sidecar flags: %q not found in cmd/sidecar/config.go", n)
		}
	}
	if !f.Sim["enable-prompt-tokens-details"] {
		t.Errorf("sim flags: enable-prompt-tokens-details not found as a boolean flag")
	}
	if _, ok := f.Sim["served-model-name"]; !ok {
		t.Errorf("sim flags: served-model-name (fs.Var) not found")
	}
}

// TestAdminRoutes checks that the sidecar's admin mux (cmd/sidecar/admin.go)
// serves, for GET, every path the kubelet and Prometheus call on the admin port.
func TestAdminRoutes(t *testing.T) {
	src, err := os.ReadFile("../cmd/sidecar/admin.go")
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]bool{}
	for _, m := range regexp.MustCompile(`Handle(?:Func)?\("GET (/[\w/]*)"`).FindAllStringSubmatch(string(src), -1) {
		routes[m[1]] = true
	}
	b := renderBundle(t, "base")
	pod := b.Deployments[0].Spec.Template.Spec
	side := findContainer(pod.InitContainers, sidecarName)
	v := findContainer(pod.Containers, vllmName)
	paths := []string{side.LivenessProbe.HTTPGet.Path, side.ReadinessProbe.HTTPGet.Path,
		v.Lifecycle.PreStop.HTTPGet.Path, b.Deployments[0].Spec.Template.Annotations["prometheus.io/path"]}
	for _, p := range paths {
		if !routes[p] {
			t.Errorf("admin mux has no GET %s (routes: %v)", p, routes)
		}
	}
}

// TestRenderersAgree keeps the fallback renderer honest: where kubectl is
// installed, both renderings of every kustomization are the same objects.
func TestRenderersAgree(t *testing.T) {
	for _, dir := range kustomizations {
		t.Run(dir, func(t *testing.T) {
			want, ok, err := kubectlKustomize(dir)
			if !ok {
				t.Skip("kubectl not installed")
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := renderFallback(dir)
			if err != nil {
				t.Fatal(err)
			}
			byName := func(objs []object) map[string]object {
				m := map[string]object{}
				for _, o := range objs {
					m[o["kind"].(string)+"/"+name(o)] = o
				}
				return m
			}
			if d := cmp.Diff(byName(want), byName(got)); d != "" {
				t.Errorf("fallback rendering differs from kubectl kustomize (-kubectl +fallback):\n%s", d)
			}
		})
	}
}

func TestOverlays(t *testing.T) {
	sim := renderBundle(t, "overlays/cpu-sim")
	v := findContainer(sim.Deployments[0].Spec.Template.Spec.Containers, vllmName)
	if !strings.Contains(v.Image, "vllm-sim") || !slices.Contains(v.Args, "--sim-time-scale=1") {
		t.Errorf("cpu-sim: vllm container runs %s %q; want the simulator", v.Image, v.Args)
	}
	if _, ok := v.Resources.Limits["nvidia.com/gpu"]; ok {
		t.Errorf("cpu-sim: asks for a GPU")
	}

	gpu := renderBundle(t, "overlays/gpu-example")
	pod := gpu.Deployments[0].Spec.Template.Spec
	v = findContainer(pod.Containers, vllmName)
	if q := v.Resources.Limits["nvidia.com/gpu"]; q.Value() != 1 {
		t.Errorf("gpu-example: nvidia.com/gpu limit = %v; want 1", q.String())
	}
	if !slices.ContainsFunc(pod.Tolerations, func(t corev1.Toleration) bool { return t.Key == "nvidia.com/gpu" }) || len(pod.NodeSelector) == 0 {
		t.Errorf("gpu-example: want a nvidia.com/gpu toleration and a nodeSelector, got %v, %v", pod.Tolerations, pod.NodeSelector)
	}
	if env := containerEnv(v); env["MODEL"] == "Qwen/Qwen3-0.6B" || env["POD_NAME"] == "" || env["HF_HOME"] == "" {
		t.Errorf("gpu-example: env %v; want the patched MODEL and the base's other variables", env)
	}
}

// TestStrictDecode shows that a misspelt or mistyped field fails decoding.
func TestStrictDecode(t *testing.T) {
	tests := []struct {
		name, doc string
	}{
		{"unknown field", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {clusterIp: None}\n"},
		{"wrong type", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: two}\n"},
		{"unexpected kind", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"},
		{"duplicate key", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {type: ClusterIP, type: NodePort}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := splitDocs([]byte(tt.doc))
			if err == nil {
				_, err = decodeBundle(objs)
			}
			if err == nil {
				t.Errorf("decoding %q = nil error; want an error", tt.doc)
			}
		})
	}
}

// TestCheckFindsProblems breaks the base one property at a time and expects
// the check to name it, so that a passing TestKustomizations means something.
func TestCheckFindsProblems(t *testing.T) {
	flags := binaryFlags(t)
	base := render(t, "base")
	pod := func(b *bundle) *corev1.PodSpec { return &b.Deployments[0].Spec.Template.Spec }
	side := func(b *bundle) *corev1.Container { return &pod(b).InitContainers[0] }
	vllm := func(b *bundle) *corev1.Container { return findContainer(pod(b).Containers, vllmName) }
	setArg := func(c *corev1.Container, prefix, v string) {
		for i, a := range c.Args {
			if strings.HasPrefix(a, prefix) {
				c.Args[i] = v
			}
		}
	}
	// vllmRule is the index of the ingress rule for vLLM's HTTP port 8001.
	vllmRule := func(b *bundle) int {
		return slices.IndexFunc(b.NetworkPolicies[0].Spec.Ingress, func(r networkingv1.NetworkPolicyIngressRule) bool {
			return slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.IntVal == 8001 })
		})
	}
	tests := []struct {
		name   string
		mutate func(b *bundle)
		want   string
	}{
		{"sidecar as regular container", func(b *bundle) {
			pod(b).Containers = append(pod(b).Containers, *side(b))
			pod(b).InitContainers = nil
		}, "native sidecar"},
		{"no restartPolicy", func(b *bundle) { side(b).RestartPolicy = nil }, "restartPolicy must be Always"},
		{"template label", func(b *bundle) { b.Deployments[0].Spec.Template.Labels["app.kubernetes.io/instance"] = "other" }, "does not match"},
		{"gossip not headless", func(b *bundle) { b.service(gossipService).Spec.ClusterIP = "" }, "headless"},
		{"not-ready pods hidden", func(b *bundle) { b.service(gossipService).Spec.PublishNotReadyAddresses = false }, "publishNotReadyAddresses"},
		{"gossip service without UDP", func(b *bundle) {
			s := b.service(gossipService)
			s.Spec.Ports = s.Spec.Ports[:1]
		}, "TCP and UDP"},
		{"api service to vLLM", func(b *bundle) {
			b.service(apiService).Spec.Ports[0].TargetPort = intstr.FromString("vllm")
		}, "--listen port"},
		{"listen port drift", func(b *bundle) { setArg(side(b), "--listen=", "--listen=:8080") }, `container port "http"`},
		{"unknown flag", func(b *bundle) { side(b).Args = append(side(b).Args, "--bogus=1") }, "unknown flag --bogus"},
		{"flag without =", func(b *bundle) { side(b).Args = append(side(b).Args, "--model", "x") }, "--model=value"},
		{"unknown env twin", func(b *bundle) {
			side(b).Env = append(side(b).Env, corev1.EnvVar{Name: "KVROUTE_BOGUS", Value: "1"})
		}, "KVROUTE_BOGUS is the twin of no flag"},
		{"flag twice", func(b *bundle) {
			side(b).Env = append(side(b).Env, corev1.EnvVar{Name: "KVROUTE_JOIN", Value: "x:7946"})
		}, "set both"},
		{"undefined var", func(b *bundle) { setArg(side(b), "--node-name=", "--node-name=$(NAME)") }, "references $(NAME)"},
		{"join elsewhere", func(b *bundle) { setArg(side(b), "--join=", "--join=kvroute:7946") }, "headless Service"},
		{"preStop named port", func(b *bundle) { vllm(b).Lifecycle.PreStop.HTTPGet.Port = intstr.FromString("admin") }, "is a name"},
		{"preStop to API port", func(b *bundle) { vllm(b).Lifecycle.PreStop.HTTPGet.Port = intstr.FromInt32(8000) }, "admin port"},
		{"short grace", func(b *bundle) {
			g := int64(60)
			pod(b).TerminationGracePeriodSeconds = &g
		}, "terminationGracePeriodSeconds"},
		{"surge", func(b *bundle) {
			s := intstr.FromInt32(1)
			b.Deployments[0].Spec.Strategy.RollingUpdate.MaxSurge = &s
		}, "maxSurge"},
		{"optional secret", func(b *bundle) {
			t := true
			pod(b).Volumes[0].Secret.Optional = &t
		}, "optional"},
		{"committed secret", func(b *bundle) {
			b.Secrets = append(b.Secrets, &corev1.Secret{})
		}, "committed key"},
		{"events on another port", func(b *bundle) {
			setArg(side(b), "--kv-events-endpoint=", "--kv-events-endpoint=tcp://127.0.0.1:6000")
		}, "must dial"},
		{"topic mismatch", func(b *bundle) { setArg(side(b), "--kv-events-topic=", "--kv-events-topic=kv@other@") }, "not a prefix"},
		{"vLLM on loopback", func(b *bundle) { setArg(vllm(b), "--host=", "--host=127.0.0.1") }, "cannot reach"},
		{"sim flag on vLLM", func(b *bundle) { vllm(b).Args = append([]string{"--sim-time-scale=2"}, vllm(b).Args...) }, "simulator flag"},
		{"readiness on /health", func(b *bundle) { vllm(b).ReadinessProbe.HTTPGet.Path = "/health" }, "vLLM readiness probe"},
		{"sidecar CPU limit", func(b *bundle) {
			side(b).Resources.Limits[corev1.ResourceCPU] = side(b).Resources.Requests[corev1.ResourceCPU]
		}, "no CPU limit"},
		{"events port open", func(b *bundle) {
			np := &b.NetworkPolicies[0].Spec
			np.Ingress = append(np.Ingress, networkingv1.NetworkPolicyIngressRule{})
		}, "vLLM's port kv-events"},
		{"events port admitted from peers", func(b *bundle) {
			np := &b.NetworkPolicies[0].Spec
			port := intstr.FromInt32(5557)
			np.Ingress = append(np.Ingress, networkingv1.NetworkPolicyIngressRule{
				From:  np.Ingress[1].From,
				Ports: []networkingv1.NetworkPolicyPort{{Port: &port}},
			})
		}, "vLLM's port kv-events (5557)"},
		{"vLLM HTTP open to all", func(b *bundle) {
			b.NetworkPolicies[0].Spec.Ingress[vllmRule(b)].From = nil
		}, "vLLM's HTTP port vllm (8001) from outside the Deployment's pods"},
		{"vLLM HTTP open to a namespace", func(b *bundle) {
			r := &b.NetworkPolicies[0].Spec.Ingress[vllmRule(b)]
			r.From = append(r.From, networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{}})
		}, "vLLM's HTTP port vllm (8001) from outside the Deployment's pods"},
		{"vLLM HTTP rule removed", func(b *bundle) {
			np := &b.NetworkPolicies[0].Spec
			np.Ingress = slices.Delete(np.Ingress, vllmRule(b), vllmRule(b)+1)
		}, "wait 10 s for their 404"},
		{"gossip open to all", func(b *bundle) {
			b.NetworkPolicies[0].Spec.Ingress[1].From = nil
		}, "gossip 7946/TCP from outside"},
		{"no network policy", func(b *bundle) { b.NetworkPolicies = nil }, "no NetworkPolicy"},
		{"token mounted", func(b *bundle) {
			pod(b).AutomountServiceAccountToken = nil
			b.ServiceAccounts[0].AutomountServiceAccountToken = nil
		}, "API token"},
		{"two deployments", func(b *bundle) {
			b.Deployments = append(b.Deployments, &appsv1.Deployment{})
		}, "exactly one Deployment"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := decodeBundle(base)
			if err != nil {
				t.Fatal(err)
			}
			tt.mutate(b)
			probs := check(b, flags)
			if !slices.ContainsFunc(probs, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("check after %q = %q; want a problem containing %q", tt.name, probs, tt.want)
			}
		})
	}
}

func TestDashboardFindsProblems(t *testing.T) {
	known, err := codeMetrics("..")
	if err != nil {
		t.Fatal(err)
	}
	base := render(t, "base")
	tests := []struct {
		name    string
		replace [2]string
		want    string
	}{
		{"unknown metric", [2]string{"kvroute_inflight_requests", "kvroute_inflight_requestz"}, "no package registers"},
		{"missing panel", [2]string{"kvroute_kv_event_gaps_total", "kvroute_inflight_requests"}, "no panel for kvroute_kv_event_gaps_total"},
		{"undefined variable", [2]string{`pod=~\"$pod\"`, `pod=~\"$pods\"`}, "undefined variable $pods"},
		{"not JSON", [2]string{`"panels": [`, `"panels": [[`}, "dashboard JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := decodeBundle(base)
			if err != nil {
				t.Fatal(err)
			}
			cm := b.ConfigMaps[0]
			if !strings.Contains(cm.Data["kvroute.json"], tt.replace[0]) {
				t.Fatalf("dashboard has no %q to replace", tt.replace[0])
			}
			cm.Data["kvroute.json"] = strings.ReplaceAll(cm.Data["kvroute.json"], tt.replace[0], tt.replace[1])
			probs := checkDashboard(b, known)
			if !slices.ContainsFunc(probs, func(p string) bool { return strings.Contains(p, tt.want) }) {
				t.Errorf("checkDashboard after %q = %q; want a problem containing %q", tt.name, probs, tt.want)
			}
		})
	}
}

func TestMergePatch(t *testing.T) {
	tests := []struct {
		name, orig, patch, want string
	}{
		{"maps merge", `{a: 1, b: {c: 2, d: 3}}`, `{b: {d: 4, e: 5}}`, `{a: 1, b: {c: 2, d: 4, e: 5}}`},
		{"null deletes", `{a: 1, b: 2}`, `{b: null}`, `{a: 1}`},
		{"plain lists replace", `{args: [a, b]}`, `{args: [c]}`, `{args: [c]}`},
		{"named lists merge, patched first", `{env: [{name: A, value: "1"}, {name: B, value: "2"}]}`,
			`{env: [{name: B, value: "3"}, {name: C, value: "4"}]}`,
			`{env: [{name: B, value: "3"}, {name: C, value: "4"}, {name: A, value: "1"}]}`},
		{"nested by key", `{containers: [{name: x, image: i, ports: [{containerPort: 1, name: p}]}]}`,
			`{containers: [{name: x, image: j}]}`, `{containers: [{name: x, image: j, ports: [{containerPort: 1, name: p}]}]}`},
		{"mounts merge by path", `{volumeMounts: [{name: a, mountPath: /a}]}`, `{volumeMounts: [{name: b, mountPath: /a}]}`,
			`{volumeMounts: [{name: b, mountPath: /a}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var orig, patch, want object
			for _, x := range []struct {
				s string
				v *object
			}{{tt.orig, &orig}, {tt.patch, &patch}, {tt.want, &want}} {
				if err := yaml.Unmarshal([]byte(x.s), x.v); err != nil {
					t.Fatal(err)
				}
			}
			got, err := mergePatch(orig, patch, "")
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("mergePatch(%s, %s) (-want +got):\n%s", tt.orig, tt.patch, d)
			}
		})
	}
	if _, err := mergePatch(object{}, object{"$patch": "delete"}, ""); err == nil {
		t.Errorf("mergePatch with a $patch directive = nil error; want errDirective")
	}
}

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "x", "B": "y"}
	tests := []struct {
		in, want  string
		undefined []string
	}{
		{"$(A)-$(B)", "x-y", nil},
		{"$$(A)", "$(A)", nil},
		{"$(A)$(C)", "x$(C)", []string{"C"}},
		{"$A (A)", "$A (A)", nil},
	}
	for _, tt := range tests {
		got, undefined := expand(tt.in, env)
		if got != tt.want || !slices.Equal(undefined, tt.undefined) {
			t.Errorf("expand(%q) = %q, %q; want %q, %q", tt.in, got, undefined, tt.want, tt.undefined)
		}
	}
}

// podMonitor is the part of the prometheus-operator's PodMonitor used here;
// strict decoding catches fields outside it.
type podMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

func TestPodMonitor(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("monitoring", "podmonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pm podMonitor
	if err := yaml.UnmarshalStrict(raw, &pm); err != nil {
		t.Fatal(err)
	}
	b := renderBundle(t, "base")
	tmpl := b.Deployments[0].Spec.Template
	side := findContainer(tmpl.Spec.InitContainers, sidecarName)
	if pm.APIVersion != "monitoring.coreos.com/v1" || pm.Kind != "PodMonitor" || !subset(pm.Spec.Selector.MatchLabels, tmpl.Labels) {
		t.Errorf("PodMonitor %s/%s selector %v does not select the pods %v", pm.APIVersion, pm.Kind, pm.Spec.Selector.MatchLabels, tmpl.Labels)
	}
	for _, e := range pm.Spec.PodMetricsEndpoints {
		cp, ok := containerPort(side, e.Port)
		if !ok || cp.ContainerPort != 9090 || e.Path != "/metrics" {
			t.Errorf("PodMonitor endpoint %s%s; want the sidecar's admin port and /metrics", e.Port, e.Path)
		}
	}
	if ann := tmpl.Annotations; ann["prometheus.io/port"] != "9090" || ann["prometheus.io/scrape"] != "true" {
		t.Errorf("pod annotations %v; want prometheus.io scrape of the admin port", ann)
	}
}
