package store

import (
	"fmt"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	certificatesv1alpha1 "k8s.io/api/certificates/v1alpha1"
	certificatesv1beta1 "k8s.io/api/certificates/v1beta1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// FieldLabels is what kube-apiserver accepts in field selectors for one
// resource, and how it matches them.
//
// kube-apiserver's handler first converts each requested label with the
// conversion function registered for the request's kind (a 400 for a label
// it does not accept), then matches the converted labels against the field
// set its registry computes for each object. labels is the first half:
// every accepted label, mapped to the field it becomes (usually itself;
// pods accept the old "spec.host" for "spec.nodeName", events.k8s.io
// accepts "regarding.kind" for "involvedObject.kind"). set is the second
// half, for the fields other than metadata.name and metadata.namespace,
// which attrsFor adds.
//
// A label that is not in labels is never refused by the cache: the request
// is forwarded, so that kube-apiserver answers it (with a 400, or with the
// objects of a field a newer kube-apiserver added). The cache answers only
// the labels it knows exactly; TestFieldLabelsMatchKubeAPIServer in the e2e
// suite checks these tables against a live kube-apiserver.
type FieldLabels struct {
	Labels map[string]string
	Set    func(runtime.Object) fields.Set
}

// ErrUnknownFieldLabel is returned by Convert for a label the cache does
// not answer.
type ErrUnknownFieldLabel string

func (e ErrUnknownFieldLabel) Error() string {
	return fmt.Sprintf("field label %q is not answered from the cache", string(e))
}

// Convert maps a requested label to the field it selects, as a
// fields.TransformFunc.
func (fl FieldLabels) Convert(label, value string) (string, string, error) {
	if f, ok := fl.Labels[label]; ok {
		return f, value, nil
	}
	return "", "", ErrUnknownFieldLabel(label)
}

// Known reports whether the cache answers label.
func (fl FieldLabels) Known(label string) bool {
	_, ok := fl.Labels[label]
	return ok
}

// accept returns the identity mapping of labels.
func accept(names ...string) map[string]string {
	m := make(map[string]string, len(names))
	for _, n := range names {
		m[n] = n
	}
	return m
}

// metadataLabels is what kube-apiserver accepts for a built-in kind with no
// conversion function of its own (runtime.DefaultMetaV1FieldSelectorConversion):
// both metadata fields, even for a cluster-scoped kind, whose objects then
// have an empty metadata.namespace.
var metadataLabels = accept("metadata.name", "metadata.namespace")

// builtinFieldLabels are kube-apiserver's (v1.36) field labels for the
// built-in resources that differ from metadataLabels: the conversion
// functions registered in k8s.io/kubernetes/pkg/apis/<group>/<version> and
// the selectable field sets of k8s.io/kubernetes/pkg/registry. The values
// are formatted as the registries format them. apps/v1 replicasets and
// coordination leasecandidates have registry fields (status.replicas,
// spec.leaseName) that no served version's conversion accepts, so they are
// metadata-only here as they are in kube-apiserver.
var builtinFieldLabels = map[schema.GroupResource]FieldLabels{
	{Resource: "pods"}: {
		Labels: withAliases(accept("metadata.name", "metadata.namespace", "spec.nodeName", "spec.restartPolicy",
			"spec.schedulerName", "spec.serviceAccountName", "spec.hostNetwork", "status.phase",
			"status.podIP", "status.podIPs", "status.nominatedNodeName"),
			"spec.host", "spec.nodeName"), // old clients
		// status.podIPs is accepted but has no value in the registry's
		// set, so it matches as the empty string.
		Set: func(obj runtime.Object) fields.Set {
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
		Labels: accept("metadata.name", "spec.unschedulable"),
		Set: func(obj runtime.Object) fields.Set {
			node, ok := obj.(*corev1.Node)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"spec.unschedulable": strconv.FormatBool(node.Spec.Unschedulable)}
		},
	},
	{Resource: "namespaces"}: {
		Labels: accept("metadata.name", "status.phase"),
		Set: func(obj runtime.Object) fields.Set {
			ns, ok := obj.(*corev1.Namespace)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"status.phase": string(ns.Status.Phase)}
		},
	},
	{Resource: "services"}: {
		Labels: accept("metadata.name", "metadata.namespace", "spec.clusterIP", "spec.type"),
		Set: func(obj runtime.Object) fields.Set {
			svc, ok := obj.(*corev1.Service)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"spec.clusterIP": svc.Spec.ClusterIP, "spec.type": string(svc.Spec.Type)}
		},
	},
	{Resource: "secrets"}: {
		Labels: accept("metadata.name", "metadata.namespace", "type"),
		Set: func(obj runtime.Object) fields.Set {
			s, ok := obj.(*corev1.Secret)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"type": string(s.Type)}
		},
	},
	{Resource: "replicationcontrollers"}: {
		Labels: accept("metadata.name", "metadata.namespace", "status.replicas"),
		Set: func(obj runtime.Object) fields.Set {
			rc, ok := obj.(*corev1.ReplicationController)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"status.replicas": strconv.Itoa(int(rc.Status.Replicas))}
		},
	},
	{Resource: "events"}: {
		Labels: accept("metadata.name", "metadata.namespace", "involvedObject.kind", "involvedObject.namespace",
			"involvedObject.name", "involvedObject.uid", "involvedObject.apiVersion",
			"involvedObject.resourceVersion", "involvedObject.fieldPath", "reason", "reportingComponent",
			"source", "type"),
		Set: func(obj runtime.Object) fields.Set {
			ev, ok := obj.(*corev1.Event)
			if !ok {
				return fields.Set{}
			}
			source := ev.Source.Component
			if source == "" {
				source = ev.ReportingController
			}
			set := eventFields(ev.InvolvedObject, ev.Reason, ev.ReportingController, ev.Type)
			set["source"] = source
			return set
		},
	},
	{Group: "events.k8s.io", Resource: "events"}: {
		// The same registry as core events: its labels are converted to
		// the core field names.
		Labels: map[string]string{
			"metadata.name":             "metadata.name",
			"metadata.namespace":        "metadata.namespace",
			"reason":                    "reason",
			"type":                      "type",
			"reportingController":       "reportingComponent",
			"regarding.kind":            "involvedObject.kind",
			"regarding.namespace":       "involvedObject.namespace",
			"regarding.name":            "involvedObject.name",
			"regarding.uid":             "involvedObject.uid",
			"regarding.apiVersion":      "involvedObject.apiVersion",
			"regarding.resourceVersion": "involvedObject.resourceVersion",
			"regarding.fieldPath":       "involvedObject.fieldPath",
		},
		Set: func(obj runtime.Object) fields.Set {
			ev, ok := obj.(*eventsv1.Event)
			if !ok {
				return fields.Set{}
			}
			return eventFields(ev.Regarding, ev.Reason, ev.ReportingController, ev.Type)
		},
	},
	{Group: "batch", Resource: "jobs"}: {
		Labels: accept("metadata.name", "metadata.namespace", "status.successful"),
		Set: func(obj runtime.Object) fields.Set {
			job, ok := obj.(*batchv1.Job)
			if !ok {
				return fields.Set{}
			}
			return fields.Set{"status.successful": strconv.Itoa(int(job.Status.Succeeded))}
		},
	},
	{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}: {
		Labels: accept("metadata.name", "spec.signerName"),
		Set: func(obj runtime.Object) fields.Set {
			switch csr := obj.(type) {
			case *certificatesv1.CertificateSigningRequest:
				return fields.Set{"spec.signerName": csr.Spec.SignerName}
			case *certificatesv1beta1.CertificateSigningRequest:
				signer := ""
				if csr.Spec.SignerName != nil {
					signer = *csr.Spec.SignerName
				}
				return fields.Set{"spec.signerName": signer}
			}
			return fields.Set{}
		},
	},
	{Group: "certificates.k8s.io", Resource: "clustertrustbundles"}: {
		Labels: accept("metadata.name", "spec.signerName"),
		Set: func(obj runtime.Object) fields.Set {
			switch b := obj.(type) {
			case *certificatesv1.ClusterTrustBundle:
				return fields.Set{"spec.signerName": b.Spec.SignerName}
			case *certificatesv1beta1.ClusterTrustBundle:
				return fields.Set{"spec.signerName": b.Spec.SignerName}
			case *certificatesv1alpha1.ClusterTrustBundle:
				return fields.Set{"spec.signerName": b.Spec.SignerName}
			}
			return fields.Set{}
		},
	},
	{Group: "certificates.k8s.io", Resource: "podcertificaterequests"}: {
		// Namespaced, yet its conversion accepts no metadata.namespace.
		Labels: accept("metadata.name", "spec.signerName", "spec.podName", "spec.nodeName"),
		Set: func(obj runtime.Object) fields.Set {
			switch r := obj.(type) {
			case *certificatesv1.PodCertificateRequest:
				return fields.Set{"spec.signerName": r.Spec.SignerName, "spec.podName": r.Spec.PodName,
					"spec.nodeName": string(r.Spec.NodeName)}
			case *certificatesv1beta1.PodCertificateRequest:
				return fields.Set{"spec.signerName": r.Spec.SignerName, "spec.podName": r.Spec.PodName,
					"spec.nodeName": string(r.Spec.NodeName)}
			}
			return fields.Set{}
		},
	},
	{Group: "resource.k8s.io", Resource: "resourceslices"}: {
		Labels: accept("metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"),
		Set: func(obj runtime.Object) fields.Set {
			var node *string
			var driver, pool string
			switch s := obj.(type) {
			case *resourcev1.ResourceSlice:
				node, driver, pool = s.Spec.NodeName, s.Spec.Driver, s.Spec.Pool.Name
			case *resourcev1beta2.ResourceSlice:
				node, driver, pool = s.Spec.NodeName, s.Spec.Driver, s.Spec.Pool.Name
			case *resourcev1beta1.ResourceSlice:
				return fields.Set{"spec.nodeName": s.Spec.NodeName, "spec.driver": s.Spec.Driver, "spec.pool.name": s.Spec.Pool.Name}
			default:
				return fields.Set{}
			}
			nodeName := ""
			if node != nil {
				nodeName = *node
			}
			return fields.Set{"spec.nodeName": nodeName, "spec.driver": driver, "spec.pool.name": pool}
		},
	},
}

// withAliases adds old label names (pairs of alias, field) to m.
func withAliases(m map[string]string, pairs ...string) map[string]string {
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return m
}

// eventFields is the event registry's field set, shared by core/v1 and
// events.k8s.io/v1 events (which name the involved object "regarding").
func eventFields(ref corev1.ObjectReference, reason, reportingController, typ string) fields.Set {
	return fields.Set{
		"involvedObject.kind":            ref.Kind,
		"involvedObject.namespace":       ref.Namespace,
		"involvedObject.name":            ref.Name,
		"involvedObject.uid":             string(ref.UID),
		"involvedObject.apiVersion":      ref.APIVersion,
		"involvedObject.resourceVersion": ref.ResourceVersion,
		"involvedObject.fieldPath":       ref.FieldPath,
		"reason":                         reason,
		"reportingComponent":             reportingController,
		"type":                           typ,
	}
}

// labelsSince names the field labels that kube-apiserver accepts only
// from some minor release on, with that release: the tables above are the
// newest release's, and ForServer takes these out for an older server.
var labelsSince = map[schema.GroupResource]map[string]int{
	{Group: "resource.k8s.io", Resource: "resourceslices"}: {"spec.pool.name": 37},
}

// VersionGated reports whether some of gr's field labels depend on the
// server's release, so that the caller needs it to call ForServer.
func VersionGated(gr schema.GroupResource) bool { return labelsSince[gr] != nil }

// ForServer returns fl without the labels of gr that kube-apiserver
// 1.minor does not accept yet; minor 0 (not known) takes out all of them.
// A label taken out is forwarded, so that kube-apiserver gives its own
// answer (a 400 from a release that does not know it), never one the
// cache made up.
func ForServer(gr schema.GroupResource, fl FieldLabels, minor int) FieldLabels {
	since := labelsSince[gr]
	if since == nil {
		return fl
	}
	labels := make(map[string]string, len(fl.Labels))
	for l, f := range fl.Labels {
		if v, gated := since[l]; !gated || (minor > 0 && minor >= v) {
			labels[l] = f
		}
	}
	return FieldLabels{Labels: labels, Set: fl.Set}
}

// FieldLabelsFor returns the field labels of gr. Built-in resources not
// listed above accept the metadata fields only; custom resources accept
// metadata.name (and metadata.namespace when namespaced), to which
// crdFieldLabels adds their selectable fields.
func FieldLabelsFor(gr schema.GroupResource, builtin, namespaced bool) FieldLabels {
	if fl, ok := builtinFieldLabels[gr]; ok {
		return fl
	}
	if builtin {
		return FieldLabels{Labels: metadataLabels}
	}
	if namespaced {
		return FieldLabels{Labels: accept("metadata.name", "metadata.namespace")}
	}
	return FieldLabels{Labels: accept("metadata.name")}
}

// BuiltinFieldLabels returns the field labels the cache answers for a
// built-in resource served by kube-apiserver 1.minor, for tests that
// compare them with kube-apiserver.
func BuiltinFieldLabels(gr schema.GroupResource, minor int) []string {
	fl := ForServer(gr, FieldLabelsFor(gr, true, true), minor)
	out := make([]string, 0, len(fl.Labels))
	for l := range fl.Labels {
		out = append(out, l)
	}
	return out
}

// AttrsFor returns the AttrsFunc of a resource: labels, the metadata
// fields (metadata.namespace only for namespaced resources) and fl's own.
func AttrsFor(fl FieldLabels, namespaced bool) AttrsFunc {
	return func(obj runtime.Object) (labels.Set, fields.Set, error) {
		m, err := meta.Accessor(obj)
		if err != nil {
			return nil, nil, err
		}
		set := fields.Set{}
		if fl.Set != nil {
			set = fl.Set(obj)
		}
		set["metadata.name"] = m.GetName()
		if namespaced {
			set["metadata.namespace"] = m.GetNamespace()
		}
		return labels.Set(m.GetLabels()), set, nil
	}
}
