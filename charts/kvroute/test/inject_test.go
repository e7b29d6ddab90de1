package charttest

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"
)

// injectValues are extra plus the settings that inject the sidecar into Deployment my-vllm.
func injectValues(extra map[string]any) map[string]any {
	return withValue(withValue(extra, "deployment.create", false), "existingDeployment.name", "my-vllm")
}

// applyPatch applies the chart's sidecar patch to a Deployment as `kubectl patch --type
// strategic` does: the YAML patch as JSON, merged by the Deployment type's patch strategy.
func applyPatch(t *testing.T, deploy []byte, r rendering) []byte {
	t.Helper()
	b, err := decode(r.Objects)
	if err != nil {
		t.Fatal(err)
	}
	cm := b.configMap("kvroute-sidecar-patch")
	if cm == nil {
		t.Fatalf("no ConfigMap kvroute-sidecar-patch among %v", ids(r.Objects))
	}
	patch, err := yaml.YAMLToJSONStrict([]byte(cm.Data["patch.yaml"]))
	if err != nil {
		t.Fatalf("patch.yaml: %v\n%s", err, cm.Data["patch.yaml"])
	}
	out, err := strategicpatch.StrategicMergePatch(deploy, patch, appsv1.Deployment{})
	if err != nil {
		t.Fatalf("kubectl patch: %v", err)
	}
	return out
}

func decodeDeployment(t *testing.T, raw []byte) *appsv1.Deployment {
	t.Helper()
	var o object
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatal(err)
	}
	b, err := decode([]object{o})
	if err != nil {
		t.Fatalf("patched Deployment: %v", err)
	}
	return b.Deployments[0]
}

// TestInject patches a user's own vLLM Deployment with the chart's patch and checks that its
// pods become kvroute pods exactly as the chart's own Deployment makes them, and keep
// everything of their own.
func TestInject(t *testing.T) {
	ch := loadChart(t)
	userYAML := readFile(t, "testdata/user-vllm.yaml")
	user, err := yaml.YAMLToJSONStrict(userYAML)
	if err != nil {
		t.Fatal(err)
	}
	before := decodeDeployment(t, user)
	r := mustTemplate(t, ch, injectValues(nil))
	got := decodeDeployment(t, applyPatch(t, user, r))
	own, err := decode(mustTemplate(t, ch, nil).Objects)
	if err != nil {
		t.Fatal(err)
	}
	wantPod := own.Deployments[0].Spec.Template

	inj, err := decode(r.Objects)
	if err != nil {
		t.Fatal(err)
	}
	if len(inj.Deployments) != 0 || len(inj.ServiceAccounts) != 0 {
		t.Errorf("inject mode renders %v; want no Deployment and no ServiceAccount (the user's pods keep theirs)", ids(r.Objects))
	}
	for _, want := range []string{"Service/kvroute", "Service/kvroute-gossip", "NetworkPolicy/kvroute", "PodDisruptionBudget/kvroute",
		"Secret/kvroute-cluster-secret", "ConfigMap/kvroute-dashboard"} {
		if !slices.Contains(ids(r.Objects), want) {
			t.Errorf("inject mode lacks %s", want)
		}
	}

	pod := got.Spec.Template
	if d := cmp.Diff(wantPod.Spec.InitContainers, pod.Spec.InitContainers); d != "" {
		t.Errorf("injected sidecar differs from the chart's own (-own +injected):\n%s", d)
	}
	secretVol := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "cluster-secret" })
	if secretVol < 0 || !cmp.Equal(pod.Spec.Volumes[secretVol], wantPod.Spec.Volumes[0]) {
		t.Errorf("volumes %v; want the chart's cluster-secret volume %v", pod.Spec.Volumes, wantPod.Spec.Volumes[0])
	}
	for _, s := range append(inj.Services, &corev1.Service{Spec: corev1.ServiceSpec{Selector: inj.PDBs[0].Spec.Selector.MatchLabels}},
		&corev1.Service{Spec: corev1.ServiceSpec{Selector: inj.NetworkPolicies[0].Spec.PodSelector.MatchLabels}}) {
		if !selects(s.Spec.Selector, pod.Labels) {
			t.Errorf("selector %v does not select the patched pods %v", s.Spec.Selector, pod.Labels)
		}
	}
	if d := cmp.Diff(wantPod.Annotations, pod.Annotations); d != "" {
		t.Errorf("pod annotations (-own +injected):\n%s", d)
	}
	v := findContainer(pod.Spec.Containers, "vllm")
	if v == nil || v.Lifecycle == nil || !cmp.Equal(v.Lifecycle, findContainer(wantPod.Spec.Containers, "vllm").Lifecycle) {
		t.Errorf("vllm container lifecycle %+v; want the chart's drain hook", v)
	}
	if *pod.Spec.TerminationGracePeriodSeconds != *wantPod.Spec.TerminationGracePeriodSeconds || *pod.Spec.SecurityContext.FSGroup != 65532 {
		t.Errorf("grace %d, fsGroup %d; want the chart's %d and 65532 (the sidecar reads the Secret as group 65532)",
			*pod.Spec.TerminationGracePeriodSeconds, *pod.Spec.SecurityContext.FSGroup, *wantPod.Spec.TerminationGracePeriodSeconds)
	}

	// What is the user's stays the user's.
	bv := findContainer(before.Spec.Template.Spec.Containers, "vllm")
	v.Lifecycle = nil
	if d := cmp.Diff(bv, v); d != "" {
		t.Errorf("the user's vllm container changed beyond the hook (-before +after):\n%s", d)
	}
	if got.Spec.Selector.MatchLabels["app"] != "my-vllm" || len(got.Spec.Selector.MatchLabels) != 1 {
		t.Errorf("selector %v; want the user's, unchanged (it is immutable)", got.Spec.Selector.MatchLabels)
	}
	if pod.Labels["team"] != "inference" || pod.Spec.ServiceAccountName != "model-reader" || pod.Spec.AutomountServiceAccountToken != nil {
		t.Errorf("labels %v, ServiceAccount %q, automount %v; want the user's labels and identity kept", pod.Labels, pod.Spec.ServiceAccountName, pod.Spec.AutomountServiceAccountToken)
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "weights" }) || *got.Spec.Replicas != 3 {
		t.Errorf("volumes %v, replicas %d; want the user's weights volume and 3 replicas kept", pod.Spec.Volumes, *got.Spec.Replicas)
	}
}

// TestInjectAgain: the patch is applied again after an upgrade; it replaces the sidecar it
// injected before instead of adding a second one, and applying it twice changes nothing.
func TestInjectAgain(t *testing.T) {
	ch := loadChart(t)
	user, err := yaml.YAMLToJSONStrict(readFile(t, "testdata/user-vllm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	once := applyPatch(t, user, mustTemplate(t, ch, injectValues(nil)))
	twice := applyPatch(t, once, mustTemplate(t, ch, injectValues(nil)))
	if d := cmp.Diff(decodeDeployment(t, once), decodeDeployment(t, twice)); d != "" {
		t.Errorf("second application changed the Deployment:\n%s", d)
	}
	upgraded := decodeDeployment(t, applyPatch(t, once, mustTemplate(t, ch, injectValues(withValue(nil, "sidecar.image.tag", "v0.2.0")))))
	ic := upgraded.Spec.Template.Spec.InitContainers
	if len(ic) != 1 || ic[0].Image != "ghcr.io/kvroute/sidecar:v0.2.0" {
		t.Errorf("after the upgrade's patch: init containers %v; want one sidecar at v0.2.0", ic)
	}
}

// TestInjectKeepsTheirs: a Deployment with its own init container, hooks and container name.
// The drain hook goes to the container the values name and replaces its preStop (a hook has
// one handler); its postStart and its init container stay, after the sidecar.
func TestInjectKeepsTheirs(t *testing.T) {
	user, err := yaml.YAMLToJSONStrict(readFile(t, "testdata/user-vllm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var o object
	if err := json.Unmarshal(user, &o); err != nil {
		t.Fatal(err)
	}
	c := container(o)
	c["name"] = "engine"
	c["lifecycle"] = map[string]any{
		"preStop":   map[string]any{"exec": map[string]any{"command": []any{"sleep", "10"}}},
		"postStart": map[string]any{"exec": map[string]any{"command": []any{"true"}}},
	}
	o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["initContainers"] =
		[]any{map[string]any{"name": "fetch-weights", "image": "busybox"}}
	theirs, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	r := mustTemplate(t, loadChart(t), injectValues(withValue(nil, "existingDeployment.container", "engine")))
	pod := decodeDeployment(t, applyPatch(t, theirs, r)).Spec.Template.Spec
	if len(pod.Containers) != 1 || pod.Containers[0].Name != "engine" {
		t.Fatalf("containers %+v; want the one container engine", pod.Containers)
	}
	lc := pod.Containers[0].Lifecycle
	if lc.PreStop.Exec != nil || lc.PreStop.HTTPGet == nil || lc.PreStop.HTTPGet.Path != "/drain/prestop" || lc.PostStart == nil {
		t.Errorf("lifecycle %+v; want the drain as the only preStop handler and their postStart kept", lc)
	}
	var names []string
	for _, ic := range pod.InitContainers {
		names = append(names, ic.Name)
	}
	if !slices.Equal(names, []string{"kvroute", "fetch-weights"}) {
		t.Errorf("init containers %v; want the sidecar, then theirs", names)
	}
}
