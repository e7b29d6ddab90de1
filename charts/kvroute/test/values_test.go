package charttest

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
)

// schemaNode is the part of a JSON schema the documentation check walks.
type schemaNode struct {
	Type       string                 `json:"type"`
	Properties map[string]*schemaNode `json:"properties"`
}

// schemaPaths lists the dotted paths of the schema's named properties; an object without
// named properties (resources, labels, affinity) is one value.
func schemaPaths(prefix string, n *schemaNode, out *[]string) {
	for name, p := range n.Properties {
		path := strings.TrimPrefix(prefix+"."+name, ".")
		if len(p.Properties) > 0 && path != "vllm.resources" && path != "sidecar.resources" {
			schemaPaths(path, p, out)
			continue
		}
		*out = append(*out, path)
	}
}

// valuePaths lists the dotted paths of values.yaml the same way, descending only where the
// schema names properties.
func valuePaths(prefix string, v map[string]any, schema *schemaNode, out *[]string) {
	for name, x := range v {
		path := strings.TrimPrefix(prefix+"."+name, ".")
		sub := schema.Properties[name]
		if m, ok := x.(map[string]any); ok && sub != nil && len(sub.Properties) > 0 && path != "vllm.resources" && path != "sidecar.resources" {
			valuePaths(path, m, sub, out)
			continue
		}
		*out = append(*out, path)
	}
}

// TestValuesDocumented: values.yaml, values.schema.json and the README's table name the same
// values, so none is undocumented, unchecked or without a default.
func TestValuesDocumented(t *testing.T) {
	var schema schemaNode
	if err := json.Unmarshal(readFile(t, filepath.Join(chartDir, "values.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	vals, err := common.ReadValuesFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var inSchema, inValues []string
	schemaPaths("", &schema, &inSchema)
	valuePaths("", vals, &schema, &inValues)
	sort.Strings(inSchema)
	sort.Strings(inValues)
	for _, p := range inSchema {
		if !slices.Contains(inValues, p) {
			t.Errorf("values.schema.json has %s, values.yaml has no default for it", p)
		}
	}
	for _, p := range inValues {
		if !slices.Contains(inSchema, p) {
			t.Errorf("values.yaml has %s, values.schema.json does not check it", p)
		}
	}
	readme := string(readFile(t, filepath.Join(chartDir, "README.md")))
	for _, p := range inValues {
		if !strings.Contains(readme, "| `"+p+"` |") {
			t.Errorf("README.md's values table has no row for `%s`", p)
		}
	}
	if len(inValues) < 50 {
		t.Errorf("found %d values; the walk has lost its way", len(inValues))
	}
}

// TestPresetsValid: every key a preset sets is a value of the chart (the schema would refuse a
// misspelt one at install; this names the file).
func TestPresetsValid(t *testing.T) {
	ch := loadChart(t)
	for _, p := range presets[1:] {
		if _, err := helmTemplate(ch, presetValues(t, p.Values), releaseName); err != nil {
			t.Errorf("%s: %v", p.Values, err)
		}
	}
}
