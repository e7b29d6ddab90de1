package charttest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Paths from this directory.
const (
	chartDir     = ".."
	manifestsDir = "../../../manifests"
	repoRoot     = "../../.."
)

// The release the comparisons render: with the name "kvroute" the chart's objects carry the
// kustomize base's names.
const (
	releaseName = "kvroute"
	namespace   = "llm"
	// kubeVersion is the oldest Kubernetes the chart supports (Chart.yaml kubeVersion): native
	// sidecars and the preStop sleep action are on by default from 1.30.
	kubeVersion = "v1.30.0"
)

// object is one rendered manifest, as generic JSON values.
type object = map[string]any

// preset pairs a values file of the chart with the kustomization it stands for.
type preset struct {
	Name          string
	Values        string // file in the chart directory; "" for the defaults alone
	Kustomization string // directory under manifests/
}

var presets = []preset{
	{"defaults", "", "base"},
	{"sim", "values-sim.yaml", "overlays/cpu-sim"},
	{"gpu", "values-gpu.yaml", "overlays/gpu-example"},
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	ch, err := loader.LoadDir(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	return ch
}

// presetValues reads a preset's values file as `helm install -f` does.
func presetValues(t *testing.T, file string) map[string]any {
	t.Helper()
	if file == "" {
		return map[string]any{}
	}
	v, err := common.ReadValuesFile(filepath.Join(chartDir, file))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return v
}

// withValue returns a copy of vals with the dotted path set, as `--set path=v` would (v typed).
func withValue(vals map[string]any, path string, v any) map[string]any {
	out := deepCopy(vals).(map[string]any)
	m := out
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
	return out
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	default:
		return v
	}
}

// rendering is what `helm template` (a client-only install) makes of the chart.
type rendering struct {
	Objects []object
	Notes   string
}

// helmTemplate renders the chart as `helm install --dry-run=client` does: the values schema
// is enforced and lookup finds nothing.
func helmTemplate(ch *chart.Chart, vals map[string]any, name string) (rendering, error) {
	return helmTemplateOn(ch, vals, name, kubeVersion)
}

func helmTemplateOn(ch *chart.Chart, vals map[string]any, name, kube string) (rendering, error) {
	kv, err := common.ParseKubeVersion(kube)
	if err != nil {
		return rendering{}, err
	}
	inst := action.NewInstall(action.NewConfiguration())
	inst.KubeVersion = kv
	inst.DryRunStrategy = action.DryRunClient
	inst.ReleaseName = name
	inst.Namespace = namespace
	inst.Replace = true
	r, err := inst.Run(ch, vals)
	if err != nil {
		return rendering{}, err
	}
	rel, ok := r.(*release.Release)
	if !ok {
		return rendering{}, fmt.Errorf("install returned a %T", r)
	}
	objs, err := splitDocs([]byte(rel.Manifest))
	if err != nil {
		return rendering{}, fmt.Errorf("rendered manifest: %w", err)
	}
	return rendering{Objects: objs, Notes: rel.Info.Notes}, nil
}

func mustTemplate(t *testing.T, ch *chart.Chart, vals map[string]any) rendering {
	t.Helper()
	r, err := helmTemplate(ch, vals, releaseName)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return r
}

// kustomize renders a directory under manifests/ as `kubectl kustomize` does.
func kustomize(t *testing.T, dir string) []object {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(manifestsDir, dir))
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	b, err := res.AsYaml()
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	objs, err := splitDocs(b)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	return objs
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitDocs parses a multi-document YAML stream strictly (a duplicate key is an error),
// skipping documents that hold only comments.
func splitDocs(b []byte) ([]object, error) {
	var out []object
	for _, d := range docSep.Split(string(b), -1) {
		j, err := yaml.YAMLToJSONStrict([]byte(d))
		if err != nil {
			return nil, fmt.Errorf("%w in:\n%s", err, d)
		}
		if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
			continue
		}
		var o object
		if err := json.Unmarshal(j, &o); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func objName(o object) string {
	m, _ := o["metadata"].(map[string]any)
	n, _ := m["name"].(string)
	return n
}

// id names an object in messages and in expectedDiffs: Kind/name.
func id(o object) string { return fmt.Sprintf("%v/%s", o["kind"], objName(o)) }

func byID(objs []object) map[string]object {
	m := make(map[string]object, len(objs))
	for _, o := range objs {
		m[id(o)] = o
	}
	return m
}

func find(objs []object, kind, name string) object {
	return byID(objs)[kind+"/"+name]
}

func ids(objs []object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, id(o))
	}
	sort.Strings(out)
	return out
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
