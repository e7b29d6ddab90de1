// Package charttest checks the kvroute Helm chart (charts/kvroute) offline, with Helm and
// kustomize as Go libraries: helm lint, the values schema, and a render of the chart with each
// values preset compared object by object with the kustomize overlay it stands for
// (manifests/). The differences that remain are listed, each with its reason, in
// expectedDiffs; a difference not in that table fails the test, and so does a row that no
// longer matches a difference.
//
// It is a module of its own so that the main module's build does not pull Helm's dependency
// tree. `make chart-test` runs it; `make test` includes that.
package charttest
