package charttest

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// absent stands for a field, list element or object that one side does not have.
const absent = "<absent>"

// difference is one way a chart object differs from its kustomize counterpart. Path is empty
// for a whole object that only one side has; Kustomize and Chart are JSON texts or absent.
type difference struct {
	Object    string // Kind/name
	Path      string // e.g. spec.template.spec.containers[vllm].image
	Kustomize string
	Chart     string
}

func (d difference) String() string {
	return fmt.Sprintf("%s %s: kustomize %s, chart %s", d.Object, d.Path, d.Kustomize, d.Chart)
}

func text(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return string(b)
}

// compare lists every difference between two renderings, object by object.
func compare(kust, chart []object) []difference {
	k, c := byID(kust), byID(chart)
	var out []difference
	for _, name := range unionKeys(k, c) {
		ko, kok := k[name]
		co, cok := c[name]
		switch {
		case !kok:
			out = append(out, difference{Object: name, Kustomize: absent, Chart: "object"})
		case !cok:
			out = append(out, difference{Object: name, Kustomize: "object", Chart: absent})
		default:
			walk(name, "", ko, co, &out)
		}
	}
	return out
}

func unionKeys[V any](a, b map[string]V) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range []map[string]V{a, b} {
		for k := range m {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
	}
	sort.Strings(out)
	return out
}

// field appends a map key to a path; keys with dots or slashes (labels) are bracketed.
func field(path, key string) string {
	if strings.ContainsAny(key, "./") {
		return fmt.Sprintf("%s[%q]", path, key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// walk compares two values. Maps compare key by key. Lists of objects that all carry a name
// (containers, env, volumes, ports, ...) or a mountPath compare element by that key, as the
// API server merges them, plus their order; lists of strings (args, command) compare as
// multisets plus the order of the common elements, so that one added flag is one difference;
// other lists compare index by index.
func walk(obj, path string, k, c any, out *[]difference) {
	add := func(path string, k, c string) {
		*out = append(*out, difference{Object: obj, Path: path, Kustomize: k, Chart: c})
	}
	km, kIsMap := k.(map[string]any)
	cm, cIsMap := c.(map[string]any)
	if kIsMap && cIsMap {
		for _, key := range unionKeys(km, cm) {
			kv, kok := km[key]
			cv, cok := cm[key]
			switch {
			case !kok:
				add(field(path, key), absent, text(cv))
			case !cok:
				add(field(path, key), text(kv), absent)
			default:
				walk(obj, field(path, key), kv, cv, out)
			}
		}
		return
	}
	kl, kIsList := k.([]any)
	cl, cIsList := c.([]any)
	if kIsList && cIsList {
		if key := listKey(kl, cl); key != "" {
			walkKeyed(obj, path, key, kl, cl, out)
			return
		}
		if allStrings(kl) && allStrings(cl) {
			walkStrings(obj, path, kl, cl, out)
			return
		}
		if len(kl) == len(cl) {
			for i := range kl {
				walk(obj, fmt.Sprintf("%s[%d]", path, i), kl[i], cl[i], out)
			}
			return
		}
	}
	if !reflect.DeepEqual(k, c) {
		add(path, text(k), text(c))
	}
}

// listKey is the key a list's elements are matched by, or "" to match by index.
func listKey(lists ...[]any) string {
	for _, key := range []string{"name", "mountPath"} {
		ok := true
		for _, l := range lists {
			for _, e := range l {
				m, isMap := e.(map[string]any)
				if _, has := m[key].(string); !isMap || !has {
					ok = false
				}
			}
		}
		if ok {
			return key
		}
	}
	return ""
}

func walkKeyed(obj, path, key string, kl, cl []any, out *[]difference) {
	index := func(l []any) (map[string]any, []string) {
		m := map[string]any{}
		var order []string
		for _, e := range l {
			name := e.(map[string]any)[key].(string)
			m[name] = e
			order = append(order, name)
		}
		return m, order
	}
	km, korder := index(kl)
	cm, corder := index(cl)
	for _, name := range unionKeys(km, cm) {
		p := fmt.Sprintf("%s[%s]", path, name)
		kv, kok := km[name]
		cv, cok := cm[name]
		switch {
		case !kok:
			*out = append(*out, difference{obj, p, absent, text(cv)})
		case !cok:
			*out = append(*out, difference{obj, p, text(kv), absent})
		default:
			walk(obj, p, kv, cv, out)
		}
	}
	ko, co := shared(korder, cm), shared(corder, km)
	if !reflect.DeepEqual(ko, co) {
		*out = append(*out, difference{obj, path + " (order)", text(ko), text(co)})
	}
}

// shared keeps the names of order that other also has.
func shared[V any](order []string, other map[string]V) []string {
	var out []string
	for _, n := range order {
		if _, ok := other[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

func allStrings(l []any) bool {
	for _, e := range l {
		if _, ok := e.(string); !ok {
			return false
		}
	}
	return true
}

func walkStrings(obj, path string, kl, cl []any, out *[]difference) {
	count := func(l []any) map[string]int {
		m := map[string]int{}
		for _, e := range l {
			m[e.(string)]++
		}
		return m
	}
	kc, cc := count(kl), count(cl)
	for _, s := range unionKeys(kc, cc) {
		for n := kc[s]; n < cc[s]; n++ {
			*out = append(*out, difference{obj, path + "[]", absent, text(s)})
		}
		for n := cc[s]; n < kc[s]; n++ {
			*out = append(*out, difference{obj, path + "[]", text(s), absent})
		}
	}
	ko, co := commonStrings(kl, cc), commonStrings(cl, kc)
	if !reflect.DeepEqual(ko, co) {
		*out = append(*out, difference{obj, path + " (order)", text(ko), text(co)})
	}
}

func commonStrings(l []any, other map[string]int) []string {
	var out []string
	for _, e := range l {
		if other[e.(string)] > 0 {
			out = append(out, e.(string))
		}
	}
	return out
}
