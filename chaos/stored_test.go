package chaos

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/loadgen"
)

func TestResponseID(t *testing.T) {
	tests := []struct {
		name string
		body string
		sse  bool
		want string
	}{
		{"plain answer", `{"id":"resp_1","object":"response","output":[{"id":"msg_2"}]}`, false, "resp_1"},
		{"plain answer, id later", `{"object":"response","output":[],"id":"resp_1"}`, false, "resp_1"},
		{"plain answer cut short", `{"id":"resp_1","object":"resp`, false, ""},
		{"stream", "event: response.created\ndata: {\"response\":{\"background\":false,\"id\":\"resp_9\"},\"sequence_number\":0,\"type\":\"response.created\"}\n\n" +
			"event: response.in_progress\ndata: {\"response\":{\"id\":\"resp_9\"}}\n\n", true, "resp_9"},
		{"stream whose first event is not JSON", "data: {oops\n\n", true, ""},
		{"no data", "event: x\n\n", true, ""},
	}
	for _, tc := range tests {
		if got := responseID([]byte(tc.body), tc.sse); got != tc.want {
			t.Errorf("%s: responseID = %q; want %q", tc.name, got, tc.want)
		}
	}
}

// The tap notes what each request names and each stored response made,
// with the pod that served it; an answer cut short, or not stored, made
// nothing to continue.
func TestStoreTap(t *testing.T) {
	stream := "event: response.created\ndata: {\"response\":{\"id\":\"resp_s\"},\"type\":\"response.created\"}\n\n" +
		"event: response.completed\ndata: {\"response\":{\"id\":\"resp_s\"},\"type\":\"response.completed\"}\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set(loadgen.ServedByHeader, "pod3")
		switch {
		case strings.Contains(string(b), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, stream)
		case strings.Contains(string(b), `"cut":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, stream[:strings.Index(stream, "event: response.completed")])
		case strings.Contains(string(b), `"fail":true`):
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"resp_p","object":"response"}`)
		}
	}))
	defer srv.Close()
	log := newStoreLog(time.Now())
	hc := &http.Client{Transport: storeTap{base: http.DefaultTransport, log: log}}
	post := func(req, body string, readAll bool) {
		t.Helper()
		hr, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/responses", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		hr.Header.Set("X-Request-Id", req)
		resp, err := hc.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		if readAll {
			io.Copy(io.Discard, resp.Body)
		} else {
			// As loadgen reads a stream: up to response.completed.
			b := make([]byte, len(stream))
			io.ReadFull(resp.Body, b)
		}
		resp.Body.Close()
	}
	post("a.0", `{"store":true}`, true)
	post("a.1", `{"store":true,"stream":true,"previous_response_id":"resp_p"}`, false)
	post("b.0", `{"store":false}`, true)
	post("c.0", `{"store":true,"cut":true,"previous_response_id":"resp_x"}`, true)
	post("d.0", `{"store":true,"fail":true}`, true)

	pods := map[string]string{}
	for id, m := range log.made {
		pods[id] = m.Pod + " " + m.Req
	}
	if d := cmp.Diff(map[string]string{"resp_p": "pod3 a.0", "resp_s": "pod3 a.1"}, pods); d != "" {
		t.Errorf("made (-want +got):\n%s", d)
	}
	if id, m, ok, known := log.followUp("a.1"); id != "resp_p" || !ok || !known || m.Req != "a.0" {
		t.Errorf("followUp(a.1) = %q, %+v, %v, %v; want resp_p made by a.0", id, m, ok, known)
	}
	if id, _, ok, known := log.followUp("c.0"); id != "resp_x" || !ok || known {
		t.Errorf("followUp(c.0) = %q, %v, %v; want resp_x, named but never seen made", id, ok, known)
	}
	if _, _, ok, _ := log.followUp("a.0"); ok {
		t.Error("followUp(a.0): a request naming no response is a follow-up")
	}
}

func TestStoreLost(t *testing.T) {
	faults := []FaultRecord{
		{Fault: FaultKillEngine, Pod: "pod2", AtS: 10, UndoneS: 15},
		{Fault: FaultKillSidecar, Pod: "pod3", AtS: 20, UndoneS: 24},
		{Fault: FaultHangEngine, Pod: "pod3", AtS: 30, UndoneS: 34},
		{Fault: FaultReplacePod, Pod: "pod4", AtS: 40, UndoneS: 42, NewPod: "pod4-r1"},
		{Fault: FaultKillEngine, Pod: "pod1", AtS: 50, Err: "kill failed"},
		{Fault: FaultRollingRestart, Pod: "pod5", AtS: 60, UndoneS: 64, NewPod: "pod5-r1"},
	}
	tests := []struct {
		name  string
		m     madeResponse
		end   float64
		fault string
	}{
		{"made before the engine died, followed after", madeResponse{Pod: "pod2", SentS: 5}, 12, FaultKillEngine},
		{"followed after the engine came back empty", madeResponse{Pod: "pod2", SentS: 5}, 30, FaultKillEngine},
		{"made by the new engine", madeResponse{Pod: "pod2", SentS: 16}, 30, ""},
		{"followed before the engine died", madeResponse{Pod: "pod2", SentS: 5}, 9, ""},
		{"its sidecar died, its engine lived", madeResponse{Pod: "pod3", SentS: 5}, 22, ""},
		{"its engine hung", madeResponse{Pod: "pod3", SentS: 5}, 33, ""},
		{"its pod was replaced", madeResponse{Pod: "pod4", SentS: 35}, 41, FaultReplacePod},
		{"a fault that did not happen", madeResponse{Pod: "pod1", SentS: 35}, 55, ""},
		{"another pod's fault", madeResponse{Pod: "pod1", SentS: 5}, 30, ""},
		{"made before its pod was rolled, followed after", madeResponse{Pod: "pod5", SentS: 55}, 65, FaultRollingRestart},
		{"made while its pod drained, followed after", madeResponse{Pod: "pod5", SentS: 61}, 66, FaultRollingRestart},
		{"followed while its pod drained: it may still serve", madeResponse{Pod: "pod5", SentS: 55}, 62, ""},
		{"made by the new pod's name", madeResponse{Pod: "pod5-r1", SentS: 65}, 70, ""},
	}
	for _, tc := range tests {
		f, ok := storeLost(tc.m, tc.end, faults)
		if got := map[bool]string{true: f.Fault}[ok]; got != tc.fault {
			t.Errorf("%s: storeLost = %q, %v; want %q", tc.name, f.Fault, ok, tc.fault)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for in, want := range map[string]time.Duration{"1": time.Second, " 2 ": 2 * time.Second, "0.5": 500 * time.Millisecond,
		"0": 0, "-1": 0, "61": 0, "": 0, "Wed, 21 Oct 2015 07:28:00 GMT": 0} {
		if got := retryAfter(in); got != want {
			t.Errorf("retryAfter(%q) = %v; want %v", in, got, want)
		}
	}
}

// The prober reads every pod's store in turn, and only recent responses.
func TestPickTakesTurns(t *testing.T) {
	log := newStoreLog(time.Now().Add(-100 * time.Second))
	log.madeBy("old", madeResponse{Pod: "pod9", EndS: 10})
	for i, p := range []string{"pod2", "pod1", "pod2", "pod3", "pod2"} {
		log.madeBy(p+"-"+string(rune('a'+i)), madeResponse{Pod: p, EndS: 95 + float64(i)})
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var got []string
	for n := range 6 {
		id, ok := log.pick(n, rng, 20, nil)
		if !ok {
			t.Fatalf("pick(%d) found nothing", n)
		}
		got = append(got, id[:4])
	}
	if d := cmp.Diff([]string{"pod1", "pod2", "pod3", "pod1", "pod2", "pod3"}, got); d != "" {
		t.Errorf("pods read (-want +got):\n%s", d)
	}
	// A pod a fault holds takes its turn with its old responses: the
	// reads that matter are those of a faulted pod's store.
	got = nil
	for n := range 4 {
		id, _ := log.pick(n, rng, 20, []string{"pod9"})
		got = append(got, id)
	}
	if d := cmp.Diff([]string{"pod1-b", got[1], "pod3-d", "old"}, got); d != "" || got[1][:4] != "pod2" {
		t.Errorf("reads with pod9 held (-want +got):\n%s", d)
	}
	if _, ok := newStoreLog(time.Now()).pick(0, rng, 20, []string{"pod1"}); ok {
		t.Error("pick on an empty log found a response")
	}
}

// The prober retries a 503 after its Retry-After, as the SDKs do, and
// records where the read entered and what it got.
func TestGetStoredRetries(t *testing.T) {
	calls := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if r.URL.Path != "/v1/responses/resp_1" || r.Header.Get("X-Request-Id") != "stored-get.7" {
			t.Errorf("got %s with id %q", r.URL.Path, r.Header.Get("X-Request-Id"))
		}
		if calls == 1 {
			w.Header().Set("Retry-After", "0.01")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"message":"the pod that stores this response cannot be reached"}}`)
			return
		}
		w.Header().Set(loadgen.ServedByHeader, "pod2")
		io.WriteString(w, `{"id":"resp_1","object":"response"}`)
	}))
	defer srv.Close()
	log := newStoreLog(time.Now())
	c := probeConfig{URL: srv.URL, Retry: true, Timeout: 5 * time.Second}
	s := getStored(context.Background(), srv.Client(), log, c, "stored-get.7", "resp_1")
	if !s.OK() || s.Attempts != 2 || s.Pod != "pod2" || s.Turn != 7 || s.LocalAddr == "" || !s.Continued || s.API != APIStoredGet {
		t.Errorf("getStored = %+v; want served by pod2 on the second attempt, turn 7, with its local address", s)
	}
	c.Retry = false
	calls = 0
	if s := getStored(context.Background(), srv.Client(), log, c, "stored-get.7", "resp_1"); s.OK() || s.Status != 503 || s.Attempts != 1 {
		t.Errorf("without retries getStored = %+v; want the 503, once", s)
	}
}

// Follow-ups are classified by what happened to the engine holding their
// response: gone with it (clear 404 or not), or servable and lost; a pod
// whose engine alone died still has a sidecar to enter through.
func TestSummarizeFollowUps(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	log := newStoreLog(t0)
	log.madeBy("resp_a", madeResponse{Pod: "pod2", Req: "r.0", SentS: 4, EndS: 5})
	log.madeBy("resp_b", madeResponse{Pod: "pod3", Req: "q.0", SentS: 4, EndS: 5})
	log.madeBy("resp_c", madeResponse{Pod: "pod2", Req: "r2.0", SentS: 16, EndS: 17})
	r := &runState{
		cfg:   RunConfig{Scenario: Scenario{Name: "t"}, Pods: 3, Duration: 40 * time.Second}.withDefaults(),
		start: t0,
		faults: []*FaultRecord{
			{Fault: FaultKillEngine, Pod: "pod2", AtS: 10, UndoneS: 15, slot: 1, down: true},
			{Fault: FaultKillSidecar, Pod: "pod3", AtS: 20, UndoneS: 24, slot: 2, down: true},
		},
		stored: log,
	}
	conns := []ConnRecord{{Client: "c1", At: t0.Add(time.Second), Name: "pod1"}, {Client: "c2", At: t0.Add(time.Second), Name: "pod2"}}
	fu := func(session string, sent float64, prev string, status int, errText string) loadgen.Sample {
		s := loadgen.Sample{Session: session, Turn: 1, Sent: sec(sent), WallE2E: sec(0.5), LocalAddr: "c1",
			API: "responses", Continued: true, Status: status, Err: errText, Attempts: 1, PromptTokens: 10}
		log.named(reqID(s), prev)
		return s
	}
	gone := "status 404: {\"error\":{\"message\":\"Response with id 'resp_a' not found: it was stored on pod pod2, which is gone\"}}"
	samples := []loadgen.Sample{
		fu("r", 12, "resp_a", 404, gone),                            // store lost, said so
		fu("s", 16, "resp_a", 404, "status 404: ... not found."),    // store lost, the new engine's own 404
		fu("q", 21, "resp_b", 503, "status 503: cannot be reached"), // its engine lives: servable, lost
		fu("q2", 22, "resp_b", 200, ""),                             // served under the fault
		fu("r2", 18, "resp_c", 200, ""),                             // the new engine's response
		{Session: "m", Sent: sec(12), WallE2E: sec(1), LocalAddr: "c2", API: "messages", Status: 502, Err: "x", Attempts: 1},
	}
	get := fu(getSession, 30, "resp_a", 404, gone)
	get.API = APIStoredGet
	r.gets = []loadgen.Sample{get}
	res := summarize(r, samples, conns, nil, nil, 40)
	checks := []struct {
		name      string
		got, want int
	}{
		{"failed_servable (the messages request entered pod2's live sidecar, the lost follow-up)", res.FailedServable, 2},
		{"failed_service", res.FailedService, 0},
		{"servable_lost", res.ServableLost, 2},
		{"unservable_store_lost (a continued request and a GET)", res.StoreLost, 2},
		{"unservable_store_lost_unclear", res.StoreLostUnclear, 1},
		{"follow_ups", res.FollowUps, 6},
		{"follow_ups_served", res.FollowUpsServed, 2},
		{"follow_ups_under_fault", res.FollowUpsUnderFault, 3},
		{"follow_ups_served_under_fault", res.FollowUpsServedUnderFault, 1},
		{"follow_ups_unknown", res.FollowUpsUnknown, 0},
		{"store_lost_served", res.StoreLostServed, 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d; want %d", c.name, c.got, c.want)
		}
	}
	wantFaults := []FollowUpCounts{{Sent: 1, StoreLost: 1}, {Sent: 2, Served: 1, Lost: 1}}
	for k, w := range wantFaults {
		if got := res.Faults[k].FollowUps; got != w {
			t.Errorf("fault %s follow-ups = %+v; want %+v", res.Faults[k].Fault, got, w)
		}
	}
	var rows []string
	for _, a := range res.APIs {
		rows = append(rows, a.API)
	}
	if d := cmp.Diff([]string{"messages", "responses previous_response_id", APIStoredGet}, rows); d != "" {
		t.Errorf("API rows (-want +got):\n%s", d)
	}
	if a := res.APIs[1]; a.StoreLost != 1 || a.StoreLostUnclear != 1 || a.ServableLost != 1 || a.OK != 2 || a.Requests != 5 || a.UnderFault != 3 {
		t.Errorf("previous_response_id row = %+v", a)
	}
	causes := map[string]string{}
	for _, f := range res.Failures {
		causes[f.Session+" "+f.Class] = f.Owner + " " + f.Cause
	}
	want := map[string]string{
		"r " + ClassStoreLost:             "pod2 kill-engine on pod2 at 10.0 s",
		"s " + ClassStoreLostUnclear:      "pod2 kill-engine on pod2 at 10.0 s",
		"q failed_servable":               "pod3 ",
		"m failed_servable":               " ",
		getSession + " " + ClassStoreLost: "pod2 kill-engine on pod2 at 10.0 s",
	}
	if d := cmp.Diff(want, causes); d != "" {
		t.Errorf("failures (-want +got):\n%s", d)
	}
	md := res.Markdown()
	for _, s := range []string{"| responses previous_response_id | 5 | 2 |", "servable lost (workload and stored reads): 2", "| 20.0 | kill-sidecar | pod3 | 2 | 1 | 0 | 1 |"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q:\n%s", s, md)
		}
	}
}

func TestScenarioRestartSidecar(t *testing.T) {
	s, err := ParseScenario([]byte(`{"client_retry": true, "faults": [{"at": "5s", "fault": "restart-sidecar", "pod": 1, "for": "1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(2, 10*time.Second); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if !s.ClientRetry || !podFault(FaultRestartSidecar) || engineEnds(FaultRestartSidecar) || !takesSidecar(FaultRestartSidecar) {
		t.Errorf("restart-sidecar: client_retry %v, pod fault %v, ends the engine %v, takes the sidecar %v",
			s.ClientRetry, podFault(FaultRestartSidecar), engineEnds(FaultRestartSidecar), takesSidecar(FaultRestartSidecar))
	}
	if c := (RunConfig{Scenario: s}).withDefaults(); !c.ClientRetry {
		t.Error("a scenario's client_retry does not reach the run")
	}
	if env, args := simSetup("agentic"); len(env) != 1 || env[0] != "VLLM_ENABLE_RESPONSES_API_STORE=1" || len(args) != 1 || args[0] != "--enable-scale-out" {
		t.Errorf("simSetup(agentic) = %v, %v", env, args)
	}
	if env, args := simSetup("multi-turn-chat"); env != nil || args != nil {
		t.Errorf("simSetup(multi-turn-chat) = %v, %v; want nothing", env, args)
	}
}
