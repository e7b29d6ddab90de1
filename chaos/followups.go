package chaos

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/loadgen"
)

// The classes of an unservable follow-up (see Result).
const (
	ClassStoreLost        = "unservable_store_lost"
	ClassStoreLostUnclear = "unservable_store_lost_unclear"
)

// FollowUpCounts are the follow-ups about one pod's stored responses
// during one of its faults: sent, answered, unservable (their response
// went with the engine), and failed although servable.
type FollowUpCounts struct {
	Sent      int `json:"sent"`
	Served    int `json:"served"`
	StoreLost int `json:"store_lost"`
	Lost      int `json:"servable_lost"`
}

// APIRow is one API's requests and how the failed ones failed.
type APIRow struct {
	API              string `json:"api"`
	Requests         int    `json:"requests"`
	OK               int    `json:"ok"`
	FailedService    int    `json:"failed_service"`
	FailedInflight   int    `json:"failed_inflight"`
	FailedMidstream  int    `json:"failed_midstream"`
	StoreLost        int    `json:"unservable_store_lost"`
	StoreLostUnclear int    `json:"unservable_store_lost_unclear"`
	ServableLost     int    `json:"servable_lost"`
	ClientRetried    int    `json:"client_retried"`
	// UnderFault are follow-ups sent while a pod fault held the pod
	// storing their response, UnderFaultServed those answered.
	UnderFault       int `json:"under_fault"`
	UnderFaultServed int `json:"under_fault_served"`
}

// apiOrder is the order of the table's rows; other labels follow, sorted.
var apiOrder = []string{"chat", "completions", "messages", "responses", "responses previous_response_id", APIStoredGet}

// apiLabel is s's row: its API, continued requests and the prober's reads
// apart.
func apiLabel(s loadgen.Sample) string {
	if s.Continued && s.API != APIStoredGet {
		return s.API + " previous_response_id"
	}
	return s.API
}

// followUps classifies requests about stored responses against the
// faults that happened.
type followUps struct {
	log    *storeLog
	faults []FaultRecord
}

func newFollowUps(log *storeLog, faults []FaultRecord) *followUps {
	return &followUps{log: log, faults: faults}
}

// reqID is the X-Request-Id the workload or the prober sent s with.
func reqID(s loadgen.Sample) string { return loadgen.RequestID(s.Session, s.Turn) }

// lost reports whether s is a follow-up whose stored response went with
// its engine before s ended, and the fault that ended it.
func (f *followUps) lost(s loadgen.Sample) (bool, FaultRecord) {
	if !s.Continued {
		return false, FaultRecord{}
	}
	_, m, ok, known := f.log.followUp(reqID(s))
	if !ok || !known {
		return false, FaultRecord{}
	}
	fr, lost := storeLost(m, (s.Sent + s.WallE2E).Seconds(), f.faults)
	return lost, fr
}

// record is a RequestRecord of s with what the harness knows of the
// response it names.
func (f *followUps) record(class string, s loadgen.Sample, entry string) RequestRecord {
	rec := record(class, s, entry)
	rec.API = apiLabel(s)
	if !s.Continued {
		return rec
	}
	id, m, _, known := f.log.followUp(reqID(s))
	rec.Response = id
	if known {
		rec.Owner, rec.MadeS = m.Pod, m.EndS
	}
	if lost, fr := f.lost(s); lost {
		rec.Cause = fmt.Sprintf("%s on %s at %.1f s", fr.Fault, fr.Pod, fr.AtS)
	}
	return rec
}

// underFault returns the pod faults that held m's pod when s was sent.
func (f *followUps) underFault(m madeResponse, sent, end float64) []int {
	var out []int
	for k, fr := range f.faults {
		until := end
		if fr.UndoneS > 0 {
			until = fr.UndoneS
		}
		if fr.Pod == m.Pod && podFault(fr.Fault) && fr.AtS <= sent && sent < until {
			out = append(out, k)
		}
	}
	return out
}

// summarize fills res's per-API rows, follow-up figures and each fault's
// follow-ups from the workload's samples and the prober's gets; classify
// is the failure class of a failed request and its entry pod. It runs
// after res.Faults is built, in the order of f.faults.
func (f *followUps) summarize(res *Result, samples, gets []loadgen.Sample, classify func(loadgen.Sample) (string, string), end float64) {
	rows := map[string]*APIRow{}
	row := func(label string) *APIRow {
		if rows[label] == nil {
			rows[label] = &APIRow{API: label}
		}
		return rows[label]
	}
	tally := func(s loadgen.Sample, get bool) {
		a := row(apiLabel(s))
		a.Requests++
		if s.Attempts > 1 {
			a.ClientRetried++
		}
		class := ""
		if s.OK() {
			a.OK++
		} else {
			var entry string
			class, entry = classify(s)
			switch class {
			case "failed_service":
				a.FailedService++
			case "failed_inflight":
				a.FailedInflight++
			case "failed_midstream", "failed_midstream_entry":
				a.FailedMidstream++
			case ClassStoreLost:
				a.StoreLost++
				res.StoreLost++
			case ClassStoreLostUnclear:
				a.StoreLostUnclear++
				res.StoreLostUnclear++
			default:
				a.ServableLost++
				res.ServableLost++
			}
			if get && len(res.Failures) < maxListed {
				res.Failures = append(res.Failures, f.record(class, s, entry))
			}
		}
		if !s.Continued {
			return
		}
		res.FollowUps++
		if s.OK() {
			res.FollowUpsServed++
		}
		_, m, _, known := f.log.followUp(reqID(s))
		if !known {
			res.FollowUpsUnknown++
			return
		}
		sent := s.Sent.Seconds()
		if fr, lost := storeLost(m, end, f.faults); lost && s.OK() && fr.AtS < sent {
			res.StoreLostServed++
		}
		held := f.underFault(m, sent, end)
		if len(held) == 0 {
			return
		}
		res.FollowUpsUnderFault++
		a.UnderFault++
		if s.OK() {
			res.FollowUpsServedUnderFault++
			a.UnderFaultServed++
		}
		for _, k := range held {
			if k >= len(res.Faults) {
				continue
			}
			c := &res.Faults[k].FollowUps
			c.Sent++
			switch {
			case s.OK():
				c.Served++
			case class == ClassStoreLost || class == ClassStoreLostUnclear:
				c.StoreLost++
			case class != "failed_service" && class != "failed_inflight" && !strings.HasPrefix(class, "failed_midstream"):
				c.Lost++
			}
		}
	}
	for _, s := range samples {
		tally(s, false)
	}
	for _, s := range gets {
		tally(s, true)
	}
	for _, a := range rows {
		res.APIs = append(res.APIs, *a)
	}
	slices.SortFunc(res.APIs, func(x, y APIRow) int {
		i, j := slices.Index(apiOrder, x.API), slices.Index(apiOrder, y.API)
		switch {
		case i >= 0 && j >= 0:
			return i - j
		case i >= 0:
			return -1
		case j >= 0:
			return 1
		}
		return strings.Compare(x.API, y.API)
	})
}

// retryRule says how the run counts retryable answers.
func retryRule(clientRetry bool) string {
	if clientRetry {
		return "clients retry as the SDKs do (2 retries; the workload backs off 0.5 s then 1 s, the prober waits Retry-After): " +
			"a 503 with Retry-After is lost only when the retries did not get it through"
	}
	return "clients do not retry: every error answer counts, a 503 with Retry-After too"
}

// apiMarkdown renders the per-API table, the follow-up figures and each
// pod fault's follow-ups; "" when the run has no API rows.
func (r *Result) apiMarkdown() string {
	if len(r.APIs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n| API | requests | ok | failed at the Service | failed in flight | failed midstream | unservable: store lost (404 gone) | unservable: store lost (other answer) | servable lost | retried by the client | follow-ups under a fault on their pod | of them served |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, a := range r.APIs {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d | %d |\n", a.API, a.Requests, a.OK,
			a.FailedService, a.FailedInflight, a.FailedMidstream, a.StoreLost, a.StoreLostUnclear, a.ServableLost,
			a.ClientRetried, a.UnderFault, a.UnderFaultServed)
	}
	fmt.Fprintf(&b, "\nservable lost (workload and stored reads): %d; follow-ups of stored responses: %d sent, %d served, %d under a fault on their pod (%d served); unknown responses: %d; served after their store was lost: %d\n",
		r.ServableLost, r.FollowUps, r.FollowUpsServed, r.FollowUpsUnderFault, r.FollowUpsServedUnderFault, r.FollowUpsUnknown, r.StoreLostServed)
	fmt.Fprintf(&b, "\nretries: %s\n", r.RetryRule)
	if r.FollowUps == 0 {
		return b.String()
	}
	b.WriteString("\n| at (s) | fault | pod | follow-ups to its store sent during | served | unservable: store lost | servable lost |\n")
	b.WriteString("|--:|---|---|--:|--:|--:|--:|\n")
	for _, f := range r.Faults {
		if !podFault(f.Fault) && f.Fault != FaultRollingRestart {
			continue
		}
		c := f.FollowUps
		fmt.Fprintf(&b, "| %.1f | %s | %s | %d | %d | %d | %d |\n", f.AtS, f.Fault, f.Pod, c.Sent, c.Served, c.StoreLost, c.Lost)
	}
	return b.String()
}
