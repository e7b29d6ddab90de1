package charttest

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	chart "helm.sh/helm/v4/pkg/chart/v2"
)

// expectedDiff is a difference between the chart and kustomize that is meant, and why.
// Presets lists the comparisons it applies to ("*": all); Object "*" matches every object.
// Each row must match at least one difference in each comparison it applies to, so a row that
// the chart or the manifests have made obsolete fails the test too.
type expectedDiff struct {
	Presets string
	difference
	Why string
}

// expectedDiffs is every difference between a chart rendering and its kustomization.
func expectedDiffs(ch *chart.Chart) []expectedDiff {
	chartLabel := text(ch.Metadata.Name + "-" + ch.Metadata.Version)
	return []expectedDiff{
		{"*", difference{"*", `metadata.labels["helm.sh/chart"]`, absent, chartLabel},
			"Helm's standard label: which chart version made the object"},
		{"*", difference{"*", `metadata.labels["app.kubernetes.io/managed-by"]`, absent, `"Helm"`},
			"Helm's standard label: the tool that owns the object"},
		{"*", difference{"*", `metadata.labels["app.kubernetes.io/instance"]`, absent, `"kvroute"`},
			"the release, on every object (the base sets it only on the Deployment): two releases in one namespace keep their objects apart"},
		{"*", difference{"Secret/kvroute-cluster-secret", "", absent, "object"},
			"the chart generates the cluster secret at install and keeps it across upgrades (lookup); kustomize leaves it to `kubectl create secret`, as a committed key would be a shared key (clusterSecret.create=false does the same)"},
		{"gpu", difference{"Deployment/kvroute", "spec.template.spec.containers[vllm].env (order)", `["MODEL","POD_NAME","HF_HOME","HF_TOKEN"]`, `["POD_NAME","MODEL","HF_HOME","HF_TOKEN"]`},
			"kustomize's strategic merge puts the patched MODEL first; no value refers to another variable, so the order has no effect"},
		{"gpu", difference{"Deployment/kvroute", "spec.template.spec.volumes (order)", `["dshm","cluster-secret","model-cache"]`, `["cluster-secret","model-cache","dshm"]`},
			"kustomize's strategic merge puts the patched dshm first; the order of volumes has no effect"},
	}
}

func (e expectedDiff) appliesTo(preset string) bool {
	return e.Presets == "*" || strings.Contains(","+e.Presets+",", ","+preset+",")
}

func (e expectedDiff) matches(d difference) bool {
	return (e.Object == "*" || e.Object == d.Object) && e.Path == d.Path && e.Kustomize == d.Kustomize && e.Chart == d.Chart
}

// comparison is one chart rendering set against one kustomize rendering.
type comparison struct {
	preset
	set   map[string]any // --set on top of the preset
	extra []string       // files under manifests/ applied next to the kustomization
}

var comparisons = []comparison{
	{preset: presets[0]},
	{preset: presets[1]},
	{preset: presets[2]},
	// The PodMonitor is applied next to an overlay with kustomize, and enabled by a value here.
	{preset: preset{"podmonitor", "values-sim.yaml", "overlays/cpu-sim"},
		set: map[string]any{"podMonitor.enabled": true}, extra: []string{"monitoring/podmonitor.yaml"}},
}

// TestParity renders the chart with each preset and compares it object by object with the
// kustomize rendering of the matching overlay: every difference must be in expectedDiffs.
func TestParity(t *testing.T) {
	ch := loadChart(t)
	table := expectedDiffs(ch)
	for _, c := range comparisons {
		t.Run(c.Name, func(t *testing.T) {
			kust := kustomize(t, c.Kustomization)
			for _, f := range c.extra {
				objs, err := splitDocs(readFile(t, filepath.Join(manifestsDir, f)))
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				kust = append(kust, objs...)
			}
			vals := presetValues(t, c.Values)
			for path, v := range c.set {
				vals = withValue(vals, path, v)
			}
			got := mustTemplate(t, ch, vals).Objects
			used := make([]bool, len(table))
			for _, d := range compare(kust, got) {
				explained := false
				for i, e := range table {
					if e.appliesTo(c.Name) && e.matches(d) {
						used[i], explained = true, true
					}
				}
				if !explained {
					t.Errorf("unexplained difference: %s", d)
				}
			}
			for i, e := range table {
				if e.appliesTo(c.Name) && !used[i] {
					t.Errorf("expectedDiffs row matches no difference any more (delete or fix it): %s", e.difference)
				}
			}
		})
	}
}

// TestDiffTable prints the differences that remain, with their reasons: the table for the
// chart's README and reviews (go test -run DiffTable -v).
func TestDiffTable(t *testing.T) {
	var b strings.Builder
	fmt.Fprintln(&b, "| compared | object | field | kustomize | chart | why |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- |")
	for _, e := range expectedDiffs(loadChart(t)) {
		fmt.Fprintf(&b, "| %s | %s | `%s` | `%s` | `%s` | %s |\n", e.Presets, e.Object, e.Path, e.Kustomize, e.Chart, e.Why)
	}
	t.Log("\n" + b.String())
}

// TestCompareFindsDifferences keeps compare honest: each kind of change to an object is
// reported at the right path, and equal objects give none.
func TestCompareFindsDifferences(t *testing.T) {
	base := func() object {
		objs, err := splitDocs([]byte(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: x, labels: {a: "1"}}
spec:
  replicas: 2
  template:
    spec:
      containers:
      - name: c
        args: [--a=1, --b=2, pos]
        env: [{name: A, value: "1"}, {name: B, value: "2"}]
        ports: [{name: p, containerPort: 1}]
      volumes: [{name: v, emptyDir: {}}]
`))
		if err != nil {
			t.Fatal(err)
		}
		return objs[0]
	}
	tests := []struct {
		name   string
		mutate func(o object)
		want   []string
	}{
		{"equal", func(object) {}, nil},
		{"scalar", func(o object) { o["spec"].(map[string]any)["replicas"] = 3.0 }, []string{"Deployment/x spec.replicas: kustomize 2, chart 3"}},
		{"added label", func(o object) { o["metadata"].(map[string]any)["labels"].(map[string]any)["k8s.io/x"] = "y" },
			[]string{`Deployment/x metadata.labels["k8s.io/x"]: kustomize <absent>, chart "y"`}},
		{"added flag", func(o object) {
			c := container(o)
			c["args"] = []any{"--a=1", "--new", "--b=2", "pos"}
		}, []string{`Deployment/x spec.template.spec.containers[c].args[]: kustomize <absent>, chart "--new"`}},
		{"reordered flags", func(o object) { container(o)["args"] = []any{"--b=2", "--a=1", "pos"} },
			[]string{`Deployment/x spec.template.spec.containers[c].args (order): kustomize ["--a=1","--b=2","pos"], chart ["--b=2","--a=1","pos"]`}},
		{"env value", func(o object) { container(o)["env"].([]any)[1].(map[string]any)["value"] = "3" },
			[]string{`Deployment/x spec.template.spec.containers[c].env[B].value: kustomize "2", chart "3"`}},
		{"env order", func(o object) {
			e := container(o)["env"].([]any)
			e[0], e[1] = e[1], e[0]
		}, []string{`Deployment/x spec.template.spec.containers[c].env (order): kustomize ["A","B"], chart ["B","A"]`}},
		{"missing volume", func(o object) {
			o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["volumes"] = []any{}
		},
			[]string{`Deployment/x spec.template.spec.volumes[v]: kustomize {"emptyDir":{},"name":"v"}, chart <absent>`}},
		{"renamed object", func(o object) { o["metadata"].(map[string]any)["name"] = "y" },
			[]string{"Deployment/x : kustomize object, chart <absent>", "Deployment/y : kustomize <absent>, chart object"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			chartObj := base()
			tt.mutate(chartObj)
			var got []string
			for _, d := range compare([]object{base()}, []object{chartObj}) {
				got = append(got, d.String())
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("compare = %q; want %q", got, tt.want)
			}
		})
	}
}

func container(o object) map[string]any {
	spec := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	return spec["containers"].([]any)[0].(map[string]any)
}
