// Package chaos runs a kvroute cluster on one machine and breaks it on
// purpose: N simulated pods, each a vllm-sim plus (optionally) a sidecar, on
// their own loopback address, joined into one mesh, with a Service in front.
//
// A pod i (0-based) is named "pod<i+1>" and lives on Subnet.<i+2>, with the
// ports a Kubernetes pod would use: the sidecar's API on :8000, its admin
// port on :9090 and gossip on :7946, vLLM (the simulator) on :8001. The
// KV-event sockets are ipc:// paths under Dir, one pair per pod, since every
// pod would otherwise need the same TCP port 5557. Subnet.1 is left for the
// Service or a central proxy.
//
// The life of a cluster:
//
//	c, err := chaos.Start(ctx, cfg) // builds binaries if needed, waits ready
//	if err != nil { ... }           // Start cleans up after itself on error
//	defer c.Stop()
//	svc, err := chaos.ListenService(chaos.ServiceConfig{
//		Addr: c.ServiceAddr(8000), Backends: c.APIAddrs(), Seed: 1})
//	defer svc.Close()
//	// ... send requests to svc.Addr(); c.Kill(1); c.Restart(ctx, 1) ...
//
// Every process runs in its own process group with its output in
// Dir/logs/<pod>-{sim,sidecar}.log; Stop sends SIGTERM, waits
// ClusterConfig.StopGrace, then SIGKILLs, reaps every process and removes
// the sockets, whatever state the fault hooks left the pods in.
//
// Two network modes. Loopback (the default, no privileges): the pods share
// the machine's network stack on 127.x.y.z addresses; kills, engine faults,
// replacements and drains work, partitions and gossip faults do not.
// Netns (ClusterConfig.Netns, root): each pod gets its own network
// namespace with one address on a bridge the harness creates (Netns), so a
// killed pod's address really goes, a partition cuts real links and
// gossip loss and delay hit only gossip packets. An egress guard drops and
// counts anything of the test range that would leave through another
// interface; Stop removes namespaces, bridge and rules, and CleanupNetns
// removes what a crashed run left (by name prefix).
//
// A chaos run on top (RunScenario) puts a Service in front that behaves
// like Kubernetes' (readiness probes on the sidecars' /readyz, random per
// connection, keep-alive connections pinned), sends a loadgen workload
// through it, applies a Scenario's faults on a timeline, polls every
// sidecar's /debug/peers to time detection, and classifies every failed
// request (Result). cmd/chaos is its command line.
//
// With the agentic workload the simulators keep stored responses
// (VLLM_ENABLE_RESPONSES_API_STORE=1, --enable-scale-out) and the harness
// follows them: the clients' transport notes which response each
// follow-up names and which pod made it (storeTap), a prober reads stored
// responses through the Service during the run (probeStored), and a
// follow-up whose response's engine died is counted unservable, not lost
// (stored.go, followups.go).
//
// A scenario's Burst overloads the pods on top of the workload (long
// unique chats at a multiple of what the engines can prefill) and the
// report gets the burst's verdict (overload.go): every request served or
// refused retryably and early, no sidecar retries or second hops, every
// sidecar's RSS under a bound, the workload's TTFT back within a bound.
package chaos
