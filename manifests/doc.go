// Package manifests holds kvroute's Kubernetes manifests (a kustomize base,
// overlays, a Grafana dashboard) and, in its tests, their offline validation.
//
// The tests render each kustomization with `kubectl kustomize` when kubectl is
// installed, and otherwise with a small renderer of the kustomize subset these
// files use (resources, strategic-merge patches by path, configMapGenerator
// without hash suffixes); when kubectl is present they also check that both
// renderers agree. Every rendered object is strictly decoded into its k8s.io/api
// type, and then the properties a working kvroute deployment depends on are
// asserted: the sidecar is a native sidecar, its flags exist in cmd/sidecar, ports
// agree between flags, containers, Services, probes, the preStop hook and the
// NetworkPolicy, the grace period covers the drain, and the dashboard's metrics
// exist. The package has no non-test code.
package manifests
