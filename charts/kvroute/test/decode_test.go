package charttest

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

// podMonitor is the part of the prometheus-operator's PodMonitor the chart writes; strict
// decoding catches a field outside it.
type podMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name   string            `json:"name"`
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		PodMetricsEndpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// bundle is one rendering, strictly decoded into the API types.
type bundle struct {
	Deployments     []*appsv1.Deployment
	Services        []*corev1.Service
	ConfigMaps      []*corev1.ConfigMap
	Secrets         []*corev1.Secret
	ServiceAccounts []*corev1.ServiceAccount
	NetworkPolicies []*networkingv1.NetworkPolicy
	PDBs            []*policyv1.PodDisruptionBudget
	PodMonitors     []*podMonitor
}

// decode decodes every object strictly, as the API server would read it: an unknown or
// miscased field, a wrong type or an unexpected kind is an error (Helm itself checks none of
// that before it sends the objects).
func decode(objs []object) (*bundle, error) {
	b := &bundle{}
	for _, o := range objs {
		raw, err := json.Marshal(o)
		if err != nil {
			return nil, err
		}
		var target any
		switch gvk := fmt.Sprintf("%v/%v", o["apiVersion"], o["kind"]); gvk {
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
		case "monitoring.coreos.com/v1/PodMonitor":
			x := &podMonitor{}
			b.PodMonitors, target = append(b.PodMonitors, x), x
		default:
			return nil, fmt.Errorf("%s %s: kind not expected from the chart", gvk, objName(o))
		}
		strict, err := sjson.UnmarshalStrict(raw, target, sjson.DisallowDuplicateFields, sjson.DisallowUnknownFields)
		if err == nil && len(strict) > 0 {
			err = errors.Join(strict...)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id(o), err)
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

func (b *bundle) configMap(name string) *corev1.ConfigMap {
	for _, c := range b.ConfigMaps {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func findContainer(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// selects reports whether a selector's labels are all among a pod's.
func selects(selector, pod map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if pod[k] != v {
			return false
		}
	}
	return true
}
