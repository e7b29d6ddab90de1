package charttest

import (
	"encoding/base64"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/engine"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

// cluster answers the chart's lookup calls from a fake API server holding objs.
type cluster struct {
	client *dynamicfake.FakeDynamicClient
}

func newCluster(t *testing.T, objs ...runtime.Object) cluster {
	t.Helper()
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return cluster{dynamicfake.NewSimpleDynamicClient(s, objs...)}
}

func (c cluster) GetClientFor(apiVersion, kind string) (dynamic.NamespaceableResourceInterface, bool, error) {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return nil, false, err
	}
	// The chart looks up only Secrets.
	return c.client.Resource(gv.WithResource("secrets")), true, nil
}

// renderSecret renders the chart's Secret as an install or upgrade against the cluster, and
// returns its decoded data ("" when the chart makes no Secret).
func renderSecret(t *testing.T, ch *chart.Chart, c cluster, vals map[string]any, upgrade bool) map[string][]byte {
	t.Helper()
	rv, err := util.ToRenderValuesWithSchemaValidation(ch, vals,
		common.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: !upgrade, IsUpgrade: upgrade},
		common.DefaultCapabilities, false)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.RenderWithClientProvider(ch, rv, c)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	objs, err := splitDocs([]byte(files["kvroute/templates/secret.yaml"]))
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) == 0 {
		return nil
	}
	b, err := decode(objs)
	if err != nil {
		t.Fatal(err)
	}
	return b.Secrets[0].Data
}

// TestSecretGenerated: an install generates a secret the sidecar accepts (clusterkey wants at
// least 16 bytes), as `head -c 32 /dev/urandom | base64` would, and a new one each time.
func TestSecretGenerated(t *testing.T) {
	ch := loadChart(t)
	a := renderSecret(t, ch, newCluster(t), nil, false)["secret"]
	b := renderSecret(t, ch, newCluster(t), nil, false)["secret"]
	raw, err := base64.StdEncoding.DecodeString(string(a))
	if err != nil || len(raw) != 32 {
		t.Errorf("generated secret %q decodes to %d bytes (%v); want the base64 text of 32 random bytes", a, len(raw), err)
	}
	if string(a) == string(b) {
		t.Errorf("two installs generated the same secret %q", a)
	}
}

// TestSecretKept: an upgrade (or a re-install) finds the Secret and keeps its value; a new one
// would split the mesh in two for the length of the rollout.
func TestSecretKept(t *testing.T) {
	ch := loadChart(t)
	live := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "kvroute-cluster-secret", Namespace: namespace},
		Data:       map[string][]byte{"secret": []byte("the-secret-from-the-install-0123")},
	}
	got := renderSecret(t, ch, newCluster(t, live), nil, true)
	if string(got["secret"]) != "the-secret-from-the-install-0123" {
		t.Errorf("upgrade renders secret %q; want the live one kept", got["secret"])
	}
	other := live.DeepCopy()
	other.Namespace = "elsewhere"
	if got := renderSecret(t, ch, newCluster(t, other), nil, true); string(got["secret"]) == "the-secret-from-the-install-0123" {
		t.Errorf("upgrade in %s took the secret of namespace %s", namespace, other.Namespace)
	}
}

// TestExistingSecret: with a Secret of the user's, the chart makes none and mounts that one.
func TestExistingSecret(t *testing.T) {
	ch := loadChart(t)
	vals := withValue(withValue(nil, "clusterSecret.existingSecret", "mesh-key"), "clusterSecret.key", "k")
	if got := renderSecret(t, ch, newCluster(t), vals, false); got != nil {
		t.Errorf("existingSecret set, the chart still renders a Secret: %v", got)
	}
	b, err := decode(mustTemplate(t, ch, vals).Objects)
	if err != nil {
		t.Fatal(err)
	}
	v := b.Deployments[0].Spec.Template.Spec.Volumes[0].Secret
	if v.SecretName != "mesh-key" || v.Items[0].Key != "k" || v.Items[0].Path != "secret" || *v.Optional {
		t.Errorf("secret volume %+v; want mesh-key's key k as the file secret, not optional", v)
	}
	if len(b.Secrets) != 0 {
		t.Errorf("rendered %d Secrets; want none", len(b.Secrets))
	}
	b, err = decode(mustTemplate(t, ch, withValue(nil, "clusterSecret.create", false)).Objects)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Secrets) != 0 || b.Deployments[0].Spec.Template.Spec.Volumes[0].Secret.SecretName != "kvroute-cluster-secret" {
		t.Errorf("clusterSecret.create=false: want no Secret and the kustomize base's name kvroute-cluster-secret mounted")
	}
}
