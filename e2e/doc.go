// Package e2e tests the kvroute sidecar end to end: simulators and sidecars
// run as separate processes on loopback (the chaos harness starts them), and
// the tests speak to them only through their public interfaces, the OpenAI
// API, the admin port and the simulator's ground truth (cached_tokens,
// /sim/cache).
//
// The multi-process tests and benchmarks carry the integration build tag:
//
//	go test -tags integration ./e2e                              # functional, ~15 s after the build
//	go test -tags integration -run '^$' -bench . -benchtime 1x ./e2e
//	go test -tags integration -run '^$' -bench Overhead -benchtime 1x ./e2e \
//	    -args -e2e.rate 200 -e2e.duration 20s
//
// What the functional tests show (the sidecar issue's "what it must show"):
//   - a request whose prefix pod X caches is served by X whichever sidecar
//     receives it, and X's vLLM reports the prefix as cached;
//   - a burst of new requests sharing a new prefix, spread over every
//     sidecar, lands on one pod (rendezvous hashing, no coordination);
//   - an SSE stream forwarded over one hop arrives byte for byte as the
//     serving pod's vLLM sent it;
//   - a killed pod stops receiving forwards once the mesh declares it dead,
//     and no request that a live pod could serve fails meanwhile;
//   - a forged hop header does not bypass routing and is counted;
//   - bad input gets the right status and an OpenAI error body.
//
// The benchmarks measure, and do not assert, the sidecar's added latency
// over calling the simulator directly (plain and streaming, local and one
// hop, side by side in one open-loop run) and its resident memory with 64
// peers holding 100k-block digests.
//
// Every cluster takes its own 127.173.y.0/24 subnet, so runs of other
// packages' integration tests do not collide with these.
package e2e
