package cache

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// fieldLabels is what kube-apiserver supports in field selectors for one
// resource: the conversion of a requested label (the error text is
// kube-apiserver's), and the field set an object is matched against.
type fieldLabels struct {
	convert func(label, value string) (string, string, error)
	// set returns the resource-specific fields; metadata fields are added
	// by attrsFor.
	set func(runtime.Object) fields.Set
}

func notSupported(label string) error {
	return fmt.Errorf("field label not supported: %s", label)
}

// oneOf accepts exactly the given labels.
func oneOf(supported ...string) func(string, string) (string, string, error) {
	return func(label, value string) (string, string, error) {
		for _, s := range supported {
			if label == s {
				return label, value, nil
			}
		}
		return "", "", notSupported(label)
	}
}

// builtinFieldLabels are the field labels of kube-apiserver's built-in
// resources that differ from the metadata-only default (core/v1 conversion
// functions and the registries' selectable field sets).
var builtinFieldLabels = map[schema.GroupResource]fieldLabels{
	{Resource: "pods"}: {
		convert: func(label, value string) (string, string, error) {
			switch label {
			case "metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
				"spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
				"status.podIP", "status.podIPs", "status.nominatedNodeName":
				return label, value, nil
			case "spec.host": // old clients
				return "spec.nodeName", value, nil
			}
			return "", "", notSupported(label)
		},
		set: func(obj runtime.Object) fields.Set {
			pod, ok := obj.(*corev1.Pod)
			if !ok {
				return fields.Set{}
			}
			podIP := ""
			if len(pod.Status.PodIPs) > 0 {
				podIP = pod.Status.PodIPs[0].IP
			}
			return fields.Set{
				"spec.nodeName":            pod.Spec.NodeName,
				"spec.restartPolicy":       string(pod.Spec.RestartPolicy),
				"spec.schedulerName":       pod.Spec.SchedulerName,
				"spec.serviceAccountName":  pod.Spec.ServiceAccountName,
				"spec.hostNetwork":         strconv.FormatBool(pod.Spec.HostNetwork),
				"status.phase":             string(pod.Status.Phase),
				"status.podIP":             podIP,
				"status.nominatedNodeName": pod.Status.NominatedNodeName,
			}
		},
	},
	{Resource: "nodes"}: {
		convert: oneOf("metadata.name", "spec.unschedulable"),
		set: func(obj runtime.Object) fields.Set {
			node, ok := obj.(*corev1.Node)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"spec.unschedulable": strconv.FormatBool(node.Spec.Unschedulable)}
		},
	},
	{Resource: "namespaces"}: {
		convert: oneOf("status.phase", "metadata.name"),
		set: func(obj runtime.Object) fields.Set {
			ns, ok := obj.(*corev1.Namespace)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"status.phase": string(ns.Status.Phase), "name": ns.Name}
		},
	},
	{Resource: "services"}: {
		convert: oneOf("metadata.namespace", "metadata.name", "spec.clusterIP", "spec.type"),
		set: func(obj runtime.Object) fields.Set {
			svc, ok := obj.(*corev1.Service)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"spec.clusterIP": svc.Spec.ClusterIP, "spec.type": string(svc.Spec.Type)}
		},
	},
	{Resource: "secrets"}: {
		convert: oneOf("type", "metadata.namespace", "metadata.name"),
		set: func(obj runtime.Object) fields.Set {
			s, ok := obj.(*corev1.Secret)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"type": string(s.Type)}
		},
	},
}

// fieldLabelsFor returns the field labels of gr. Built-in resources not
// listed above support the metadata fields only, with the apimachinery
// default's error text; custom resources support metadata.name (and
// metadata.namespace when namespaced) with the apiextensions text.
func fieldLabelsFor(gr schema.GroupResource, builtin, namespaced bool) fieldLabels {
	if fl, ok := builtinFieldLabels[gr]; ok {
		return fl
	}
	if builtin {
		return fieldLabels{convert: runtime.DefaultMetaV1FieldSelectorConversion}
	}
	if namespaced {
		return fieldLabels{convert: oneOf("metadata.name", "metadata.namespace")}
	}
	return fieldLabels{convert: oneOf("metadata.name")}
}

// attrsFor returns the AttrsFunc of a resource: labels, the metadata
// fields (metadata.namespace only for namespaced resources) and fl's own.
func attrsFor(fl fieldLabels, namespaced bool) AttrsFunc {
	return func(obj runtime.Object) (labels.Set, fields.Set, error) {
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, nil, err
		}
		set := fields.Set{}
		if fl.set != nil {
			set = fl.set(obj)
		}
		set["metadata.name"] = m.GetName()
		if namespaced {
			set["metadata.namespace"] = m.GetNamespace()
		}
		return labels.Set(m.GetLabels()), set, nil
	}
}
