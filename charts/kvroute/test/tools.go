//go:build tools

// The blank import keeps Helm's command in this module's graph, so that
// `go build helm.sh/helm/v4/cmd/helm` here (make helm, used by make k8s-e2e)
// builds the same Helm v4.3.1 the tests link, from go.sum, with no
// downloaded binary. The tag keeps it out of every ordinary build.
package charttest

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
