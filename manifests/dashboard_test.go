package manifests

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// requiredMetrics must each have a panel (docs/design.md D8; the manifests brief).
var requiredMetrics = []string{
	"kvroute_routing_decisions_total",
	"kvroute_cached_tokens_total",
	"kvroute_forward_duration_seconds",
	"kvroute_gossip_members",
	"kvroute_digest_staleness_seconds",
	"kvroute_kv_events_total",
	"kvroute_kv_event_gaps_total",
	"kvroute_tokenize_duration_seconds",
}

var (
	metricLit = regexp.MustCompile(`"(kvroute_[a-z0-9_]+)"`)
	// subsystemLit: a file's Subsystem: "x" puts kvroute_x_ before its names.
	subsystemLit = regexp.MustCompile(`Subsystem:\s*"([a-z0-9_]+)"`)
	snakeLit     = regexp.MustCompile(`"([a-z][a-z0-9]*(?:_[a-z0-9]+)+)"`)
	metricRef    = regexp.MustCompile(`\bkvroute_[a-z0-9_]+`)
	varUse       = regexp.MustCompile(`\$(\w+)|\$\{(\w+)\}`)
)

// codeMetrics finds the metric names the repository's Go code may register:
// every "kvroute_x" literal, and in a file that declares Namespace: "kvroute",
// every snake_case literal x as kvroute_x and, for each Subsystem: "s" in
// it, as kvroute_s_x (names also reach Opts through
// helpers such as gauge("gossip_members", ...)). It over-approximates; the
// dashboard check needs only that a name it uses is among them.
func codeMetrics(root string) (map[string]bool, error) {
	found := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "manifests") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), `Namespace: "kvroute"`) {
			subs := []string{""}
			for _, m := range subsystemLit.FindAllStringSubmatch(string(b), -1) {
				subs = append(subs, m[1]+"_")
			}
			for _, m := range snakeLit.FindAllStringSubmatch(string(b), -1) {
				for _, sub := range subs {
					found["kvroute_"+sub+m[1]] = true
				}
			}
		}
		for _, m := range metricLit.FindAllStringSubmatch(string(b), -1) {
			found[m[1]] = true
		}
		return nil
	})
	return found, err
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

func (p panel) all() []panel {
	out := []panel{p}
	for _, c := range p.Panels {
		out = append(out, c.all()...)
	}
	return out
}

// checkDashboard checks the dashboard ConfigMaps of b against the metrics the
// code registers (known).
func checkDashboard(b *bundle, known map[string]bool) []string {
	var probs []string
	errorf := func(f string, a ...any) { probs = append(probs, fmt.Sprintf(f, a...)) }
	var dashboards []string
	for _, cm := range b.ConfigMaps {
		if cm.Labels["grafana_dashboard"] != "1" {
			continue
		}
		for k, v := range cm.Data {
			if strings.HasSuffix(k, ".json") {
				dashboards = append(dashboards, v)
			}
		}
	}
	if len(dashboards) != 1 {
		return []string{fmt.Sprintf("want one dashboard in a ConfigMap labelled grafana_dashboard: \"1\", got %d", len(dashboards))}
	}
	var d dashboard
	if err := json.Unmarshal([]byte(dashboards[0]), &d); err != nil {
		return []string{"dashboard JSON: " + err.Error()}
	}
	if d.UID == "" || d.Title == "" {
		errorf("dashboard needs a uid and a title (stable links, no duplicates on re-import)")
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	var exprs []string
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		exprs = append(exprs, v.Definition)
	}
	ids := map[int]bool{}
	for _, top := range d.Panels {
		for _, p := range top.all() {
			if ids[p.ID] {
				errorf("panel %q: duplicate id %d", p.Title, p.ID)
			}
			ids[p.ID] = true
			if len(p.Targets) > 0 && (p.Datasource == nil || p.Datasource.UID != "${datasource}") {
				errorf("panel %q: datasource must be the ${datasource} variable", p.Title)
			}
			for _, t := range p.Targets {
				exprs = append(exprs, t.Expr)
			}
		}
	}
	used := map[string]bool{}
	for _, e := range exprs {
		for _, m := range varUse.FindAllStringSubmatch(e, -1) {
			if n := m[1] + m[2]; !vars[n] {
				errorf("expression %q uses undefined variable $%s", e, n)
			}
		}
		for _, m := range metricRef.FindAllString(e, -1) {
			n := m
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(m, suf); ok && known[b] {
					n = b
				}
			}
			if !known[n] {
				errorf("dashboard uses %s, which no package registers", m)
			}
			used[n] = true
		}
	}
	for _, m := range requiredMetrics {
		if !used[m] {
			errorf("dashboard has no panel for %s", m)
		}
	}
	return probs
}
