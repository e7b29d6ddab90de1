package manifests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// object is one rendered manifest, as generic JSON values.
type object = map[string]any

// kustomizations are the directories the tests render and check.
var kustomizations = []string{"base", "overlays/cpu-sim", "overlays/gpu-example"}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitDocs parses a multi-document YAML stream, skipping empty documents.
func splitDocs(b []byte) ([]object, error) {
	var out []object
	for _, d := range docSep.Split(string(b), -1) {
		if strings.TrimSpace(stripComments(d)) == "" {
			continue
		}
		j, err := yaml.YAMLToJSONStrict([]byte(d)) // a duplicate key is an error
		if err != nil {
			return nil, err
		}
		var o object
		if err := json.Unmarshal(j, &o); err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// kubectlKustomize renders dir with kubectl's embedded kustomize, which works
// offline. ok is false when kubectl is not installed.
func kubectlKustomize(dir string) (objs []object, ok bool, err error) {
	path, err := exec.LookPath("kubectl")
	if err != nil {
		return nil, false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "kustomize", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, true, fmt.Errorf("kubectl kustomize %s: %w: %s", dir, err, stderr.String())
	}
	objs, err = splitDocs(out)
	return objs, true, err
}

// kustomization is the subset of kustomize's file format that the fallback
// renderer implements. It is decoded strictly, so a kustomization that starts
// using another feature fails here instead of rendering wrongly.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Resources  []string
	Patches    []struct {
		Path string `json:"path"`
	} `json:"patches"`
	ConfigMapGenerator []struct {
		Name    string   `json:"name"`
		Files   []string `json:"files"`
		Options struct {
			DisableNameSuffixHash bool              `json:"disableNameSuffixHash"`
			Labels                map[string]string `json:"labels"`
		} `json:"options"`
	} `json:"configMapGenerator"`
}

// renderFallback renders dir like `kubectl kustomize` for the subset of
// features in kustomization: resources (files and directories), generated
// ConfigMaps without hash suffix, and strategic-merge patches by path.
func renderFallback(dir string) ([]object, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("%s: apiVersion %q kind %q is not a Kustomization", dir, k.APIVersion, k.Kind)
	}
	var objs []object
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		var sub []object
		if st.IsDir() {
			sub, err = renderFallback(p)
		} else {
			var b []byte
			if b, err = os.ReadFile(p); err == nil {
				sub, err = splitDocs(b)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		objs = append(objs, sub...)
	}
	for _, g := range k.ConfigMapGenerator {
		if !g.Options.DisableNameSuffixHash {
			return nil, fmt.Errorf("%s: configMapGenerator %s: hash suffixes are not implemented", dir, g.Name)
		}
		data := map[string]any{}
		for _, f := range g.Files {
			key, file, ok := strings.Cut(f, "=")
			if !ok {
				key, file = filepath.Base(f), f
			}
			b, err := os.ReadFile(filepath.Join(dir, file))
			if err != nil {
				return nil, err
			}
			data[key] = string(b)
		}
		meta := object{"name": g.Name}
		if len(g.Options.Labels) > 0 {
			labels := object{}
			for k, v := range g.Options.Labels {
				labels[k] = v
			}
			meta["labels"] = labels
		}
		objs = append(objs, object{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
	}
	for _, p := range k.Patches {
		b, err := os.ReadFile(filepath.Join(dir, p.Path))
		if err != nil {
			return nil, err
		}
		patches, err := splitDocs(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.Path, err)
		}
		for _, patch := range patches {
			i := findObject(objs, patch)
			if i < 0 {
				return nil, fmt.Errorf("%s: no %s %s to patch", p.Path, patch["kind"], name(patch))
			}
			merged, err := mergePatch(objs[i], patch, "")
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.Path, err)
			}
			objs[i] = merged.(object)
		}
	}
	return objs, nil
}

func name(o object) string {
	m, _ := o["metadata"].(object)
	n, _ := m["name"].(string)
	return n
}

func findObject(objs []object, target object) int {
	for i, o := range objs {
		if o["kind"] == target["kind"] && o["apiVersion"] == target["apiVersion"] && name(o) == name(target) {
			return i
		}
	}
	return -1
}

// mergeKeys are the strategic-merge keys (patchMergeKey in k8s.io/api) of the
// lists that the patches here touch, by field name. Other lists are replaced.
var mergeKeys = map[string]string{
	"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
	"volumeMounts": "mountPath", "ports": "containerPort",
}

var errDirective = errors.New("strategic-merge directives ($patch, $retainKeys, ...) are not implemented")

// mergePatch applies a strategic-merge patch: maps merge recursively, null
// deletes, lists with a merge key merge element-wise (patched elements first,
// in patch order, then the others in original order, as kustomize orders
// them), and all other values are replaced.
func mergePatch(orig, patch any, field string) (any, error) {
	switch p := patch.(type) {
	case object:
		o, ok := orig.(object)
		if !ok {
			o = object{}
		}
		out := object{}
		for k, v := range o {
			out[k] = v
		}
		for k, v := range p {
			if strings.HasPrefix(k, "$") {
				return nil, errDirective
			}
			if v == nil {
				delete(out, k)
				continue
			}
			m, err := mergePatch(o[k], v, k)
			if err != nil {
				return nil, err
			}
			out[k] = m
		}
		return out, nil
	case []any:
		key, ok := mergeKeys[field]
		o, isList := orig.([]any)
		if !ok || !isList {
			return p, nil
		}
		used := map[int]bool{}
		var out []any
		for _, pe := range p {
			pm, _ := pe.(object)
			j := -1
			for i, oe := range o {
				if om, _ := oe.(object); om != nil && pm != nil && om[key] != nil && om[key] == pm[key] {
					j = i
				}
			}
			if j < 0 {
				out = append(out, pe)
				continue
			}
			used[j] = true
			m, err := mergePatch(o[j], pe, "")
			if err != nil {
				return nil, err
			}
			out = append(out, m)
		}
		for i, oe := range o {
			if !used[i] {
				out = append(out, oe)
			}
		}
		return out, nil
	default:
		return patch, nil
	}
}

// render renders dir with kubectl when it is installed, else with the
// fallback renderer.
func render(t *testing.T, dir string) []object {
	t.Helper()
	objs, ok, err := kubectlKustomize(dir)
	if !ok {
		objs, err = renderFallback(dir)
	}
	if err != nil {
		t.Fatalf("render %s: %v", dir, err)
	}
	return objs
}
