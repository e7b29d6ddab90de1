// Package engine decides whether the pod's vLLM can serve, as its sidecar
// sees it (docs/design.md D10): starting, serving or down.
//
// Tracker is the rule, a pure state machine: health probes and failed local
// requests go in, state transitions come out, time is an argument. Watcher
// is the loop around it: it probes vLLM's /health every ProbeInterval, takes
// the front's reports of failed local requests, and hands each transition
// to its caller, which carries it out (withdraw the digest, fail /readyz,
// start a new epoch before advertising the engine again). Silence is a
// second small rule: an engine that serves while no KV event ever arrives
// is a misconfigured event path.
//
// The loop a caller writes:
//
//	w := engine.NewWatcher(cfg, vllm)           // vllm.Health(ctx) error
//	go w.Run(ctx)                               // exits when ctx ends
//	for tr := range w.Transitions() { apply(tr) }
//	// the front, on a connection error to the local vLLM: w.Report(err)
package engine
