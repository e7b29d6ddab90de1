package manifests

import (
	"encoding/json"
	"errors"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	sjson "sigs.k8s.io/json"
)

// bundle is one rendered kustomization, strictly decoded into k8s.io/api types.
type bundle struct {
	Deployments     []*appsv1.Deployment
	Services        []*corev1.Service
	ConfigMaps      []*corev1.ConfigMap
	Secrets         []*corev1.Secret
	ServiceAccounts []*corev1.ServiceAccount
	NetworkPolicies []*networkingv1.NetworkPolicy
	PDBs            []*policyv1.PodDisruptionBudget
}

// decodeBundle decodes every object strictly: an unknown or miscased field, a
// wrong type or an unknown apiVersion/kind is an error.
func decodeBundle(objs []object) (*bundle, error) {
	b := &bundle{}
	for _, o := range objs {
		raw, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		gvk := fmt.Sprintf("%v/%v", o["apiVersion"], o["kind"])
		var target any
		switch gvk {
		case "apps/v1/Deployment":
			x := &appsv1.Deployment{}
			b.Deployments, target = append(b.Deployments, x), x
		case "v1/Service":
			x := &corev1.Service{}
			b.Services, target = append(b.Services, x), x
		case "v1/ConfigMap":
			x := &corev1.ConfigMap{}
			b.ConfigMaps, target = append(b.ConfigMaps, x), x
		case "v1/Secret":
			x := &corev1.Secret{}
			b.Secrets, target = append(b.Secrets, x), x
		case "v1/ServiceAccount":
			x := &corev1.ServiceAccount{}
			b.ServiceAccounts, target = append(b.ServiceAccounts, x), x
		case "networking.k8s.io/v1/NetworkPolicy":
			x := &networkingv1.NetworkPolicy{}
			b.NetworkPolicies, target = append(b.NetworkPolicies, x), x
		case "policy/v1/PodDisruptionBudget":
			x := &policyv1.PodDisruptionBudget{}
			b.PDBs, target = append(b.PDBs, x), x
		default:
			return nil, fmt.Errorf("%s %s: kind not expected in kvroute's manifests", gvk, name(o))
		}
		// Case-sensitive, like the API server: encoding/json would accept clusterIp.
		strict, err := sjson.UnmarshalStrict(raw, target, sjson.DisallowDuplicateFields, sjson.DisallowUnknownFields)
		if err == nil && len(strict) > 0 {
			err = errors.Join(strict...)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", gvk, name(o), err)
		}
	}
	return b, nil
}

func (b *bundle) service(name string) *corev1.Service {
	for _, s := range b.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}
