// Package loadgen is kvroute's load generator: workload schedules, an
// open-loop runner that speaks the OpenAI API, and the results (percentiles,
// hit rate, load balance) as JSON, a markdown table and PNG plots.
//
// The split follows the project's style: a workload is a pure function of
// its parameters and a *rand.Rand that returns a Schedule, so every policy
// under test gets exactly the same sessions, arrival offsets and prompts.
// Only Run does I/O:
//
//	s, err := loadgen.Generate("shared-prefix", cfg, rand.New(rand.NewPCG(seed, 0)))
//	samples, err := loadgen.Run(ctx, loadgen.RunConfig{Endpoints: eps, Client: loadgen.NewClient(nil, model)}, s)
//	res := loadgen.Summarize("kvroute", samples, podNames, 1) // one Sample per request sent
//	rep := loadgen.Report{Workload: s.Workload, Pods: len(podNames), Policies: []loadgen.PolicyResult{res}}
//	loadgen.WriteJSON(w, rep); loadgen.Markdown(rep); loadgen.PlotCDF(path, title, rep.Policies)
//
// Sessions speak one API each (Kind): token-id completions, chat, and the
// agent APIs, Anthropic Messages and OpenAI Responses, as vLLM serves them
// (apis.go builds their bodies and reads their answers and SSE events).
// The agentic workload's sessions are agent tool loops run by agent.go:
// each turn's request carries the history grown by the actual answers,
// the tool call the schedule scripted after each answer and the tool's
// result; a turn may start sub-agents that fork the conversation; a
// Responses session may continue stored responses by previous_response_id.
// Summarize breaks a run that mixes APIs down per API (PolicyResult.ByAPI).
//
// A Mooncake trace replays through ParseMooncake and Mooncake: each hash id
// of a 512-token block stands for a fixed pseudo-random block of token ids
// (BlockTokens), so requests sharing leading hash ids share a token prefix.
//
// Times in results are simulated seconds as the vLLM simulator reports them
// (the "sim" object of its responses), so they do not depend on how busy the
// benchmarking machine is; client wall-clock times are kept beside them.
// Against a server without the "sim" object the wall-clock times are used.
package loadgen
