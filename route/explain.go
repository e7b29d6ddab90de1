package route

import (
	"fmt"
	"strconv"
	"strings"
)

// Table renders the Decision as fixed-width text, one row per candidate in
// peer order, with the chosen row marked '*'. It is what /debug/route
// prints and what the scenario scripts in testdata compare, so its layout
// changes only with a reviewed golden diff. It never contains a blank line.
func (d Decision) Table() string {
	var b strings.Builder
	target := d.Target
	if target == "" {
		target = "-"
	}
	fmt.Fprintf(&b, "target %s  reason %s  local %t\n", target, d.Reason, d.Local)
	fmt.Fprintf(&b, "eligible %d/%d  mean %s  bound %s\n",
		d.Eligible, len(d.Candidates)+d.Omitted, num(d.Mean, 2), num(d.Bound, 2))
	if d.Omitted > 0 {
		fmt.Fprintf(&b, "listed %d, omitted %d (route.ListPeers)\n", len(d.Candidates), d.Omitted)
	}
	if d.Note != "" {
		fmt.Fprintf(&b, "note %s\n", d.Note)
	}
	if len(d.Attempts) > 0 {
		fmt.Fprintf(&b, "attempts %s\n", strings.Join(d.Attempts, " > "))
	}
	w := len("peer")
	for _, c := range d.Candidates {
		w = max(w, len(c.ID))
	}
	row := func(mark, id, keys, tokens, load, queued, ttft, score, status string) {
		line := fmt.Sprintf("%s %-*s %6s %7s %7s %7s %7s %10s  %s", mark, w, id, keys, tokens, load, queued, ttft, score, status)
		b.WriteString(strings.TrimRight(line, " "))
		b.WriteByte('\n')
	}
	row(" ", "peer", "keys", "tokens", "load", "queued", "ttft", "score", "status")
	for _, c := range d.Candidates {
		mark := " "
		if c.Chosen {
			mark = "*"
		}
		var status []string
		if c.Local {
			status = append(status, "local")
		}
		if !c.Eligible {
			status = append(status, "excluded: "+c.Excluded)
			row(mark, c.ID, "-", "-", "-", "-", "-", "-", strings.Join(status, ", "))
			continue
		}
		if c.Over {
			status = append(status, "over bound")
		}
		if c.Note != "" {
			status = append(status, c.Note)
		}
		if c.Ahead > 0 {
			status = append(status, plural(c.Ahead, "request")+" ahead")
		}
		if t := tierNote(c); t != "" {
			status = append(status, t)
		}
		score := "-"
		if c.Scored {
			score = num(c.Score, 3)
		}
		ttft := "-"
		if c.TTFT > 0 {
			ttft = strconv.FormatFloat(c.TTFT*1000, 'f', 0, 64) + "ms"
		}
		row(mark, c.ID, strconv.Itoa(c.MatchedKeys), strconv.Itoa(c.MatchedTokens),
			num(c.Load, 2), strconv.Itoa(c.Queued), ttft, score, strings.Join(status, ", "))
	}
	return b.String()
}

// tierNote says where a candidate's match is held, when not all of it is
// on one rank's GPU: "gpu 128 cpu 512", "gpu 0 disk 256", "rank 1/2" (the
// request pinned to rank 1 of 2), "rank any/2" (the engine chooses: no rank
// holds more), "rank 1/2 unpinned" (a pod that does not advertise its rank
// count: the count is its digest's, and nothing is pinned). Empty for a
// pod of one rank with a GPU match alone, so tables of such pods read as
// before tiers.
func tierNote(c Candidate) string {
	var parts []string
	if c.CPUTokens > 0 || c.DiskTokens > 0 {
		parts = append(parts, "gpu "+strconv.Itoa(c.GPUTokens))
	}
	if c.CPUTokens > 0 {
		parts = append(parts, "cpu "+strconv.Itoa(c.CPUTokens))
	}
	if c.DiskTokens > 0 {
		parts = append(parts, "disk "+strconv.Itoa(c.DiskTokens))
	}
	if c.Ranks > 1 {
		r := "any"
		if c.Rank >= 0 {
			r = strconv.Itoa(c.Rank)
		}
		r = "rank " + r + "/" + strconv.Itoa(c.Ranks)
		if c.Rank >= 0 && !c.Pinned {
			r += " unpinned"
		}
		parts = append(parts, r)
	}
	return strings.Join(parts, " ")
}

func num(x float64, prec int) string { return strconv.FormatFloat(x, 'f', prec, 64) }
