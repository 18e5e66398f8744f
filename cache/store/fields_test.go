package store

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// TestFieldLabels: each selector is converted and matched as kube-apiserver
// converts and matches it, and a label the cache does not know is reported
// as unknown (so the request is forwarded) instead of refused.
func TestFieldLabels(t *testing.T) {
	om := metav1.ObjectMeta{Namespace: "ns", Name: "o"}
	coreEvent := &corev1.Event{ObjectMeta: om, Reason: "Pulled", Type: "Normal", ReportingController: "kubelet",
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "p", UID: "u1"}}
	newEvent := &eventsv1.Event{ObjectMeta: om, Reason: "Pulled", Type: "Warning", ReportingController: "ctrl",
		Regarding: corev1.ObjectReference{Kind: "Pod", Name: "p", FieldPath: "spec.containers{c}"}}
	for _, tc := range []struct {
		gr         schema.GroupResource
		namespaced bool
		obj        runtime.Object
		selector   string
		// unknown: the cache forwards; otherwise match is the answer.
		unknown, match bool
	}{
		// source is the component, or the reporting controller without one.
		{schema.GroupResource{Resource: "events"}, true, coreEvent, "source=kubelet", false, true},
		{schema.GroupResource{Resource: "events"}, true, coreEvent, "reportingComponent=kubelet,reason=Pulled,type=Normal", false, true},
		{schema.GroupResource{Resource: "events"}, true, coreEvent, "involvedObject.uid=u1,involvedObject.fieldPath=", false, true},
		{schema.GroupResource{Resource: "events"}, true, coreEvent, "involvedObject.name!=p", false, false},
		{schema.GroupResource{Resource: "events"}, true, coreEvent, "regarding.name=p", true, false},
		// events.k8s.io names the same fields its own way, and has no source.
		{schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, true, newEvent, "regarding.fieldPath=spec.containers{c},reportingController=ctrl", false, true},
		{schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, true, newEvent, "type=Normal", false, false},
		{schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, true, newEvent, "involvedObject.name=p", true, false},
		{schema.GroupResource{Group: "events.k8s.io", Resource: "events"}, true, newEvent, "source=ctrl", true, false},
		{schema.GroupResource{Resource: "secrets"}, true, &corev1.Secret{ObjectMeta: om, Type: corev1.SecretTypeTLS}, "type=kubernetes.io/tls", false, true},
		{schema.GroupResource{Resource: "namespaces"}, false, &corev1.Namespace{ObjectMeta: om, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}}, "status.phase=Active", false, true},
		// The registry's field set has "name"; the conversion refuses it.
		{schema.GroupResource{Resource: "namespaces"}, false, &corev1.Namespace{ObjectMeta: om}, "name=o", true, false},
		{schema.GroupResource{Resource: "namespaces"}, false, &corev1.Namespace{ObjectMeta: om}, "metadata.namespace=", true, false},
		{schema.GroupResource{Resource: "pods"}, true, &corev1.Pod{ObjectMeta: om, Spec: corev1.PodSpec{NodeName: "n1"}}, "spec.host=n1", false, true},
		// Accepted, but absent from the registry's set: matches as "".
		{schema.GroupResource{Resource: "pods"}, true, &corev1.Pod{ObjectMeta: om, Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}}}, "status.podIPs=", false, true},
		{schema.GroupResource{Group: "batch", Resource: "jobs"}, true, &batchv1.Job{ObjectMeta: om, Status: batchv1.JobStatus{Succeeded: 3}}, "status.successful=3", false, true},
		// apps/v1 has no conversion function: metadata only.
		{schema.GroupResource{Group: "apps", Resource: "replicasets"}, true, nil, "status.replicas=1", true, false},
		// A cluster-scoped kind without a conversion function accepts
		// metadata.namespace, which is empty on its objects.
		{schema.GroupResource{Group: "storage.k8s.io", Resource: "storageclasses"}, false, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "o"}}, "metadata.namespace=", false, true},
		{schema.GroupResource{Resource: "nodes"}, false, &corev1.Node{ObjectMeta: om, Spec: corev1.NodeSpec{Unschedulable: true}}, "spec.unschedulable=true", false, true},
		{schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, false, &resourcev1.ResourceSlice{ObjectMeta: om, Spec: resourcev1.ResourceSliceSpec{Driver: "d"}}, "spec.nodeName=,spec.driver=d", false, true},
	} {
		fl := FieldLabelsFor(tc.gr, true, tc.namespaced)
		sel, err := fields.ParseSelector(tc.selector)
		if err != nil {
			t.Fatal(err)
		}
		converted, err := sel.Transform(fl.Convert)
		if _, unknown := err.(ErrUnknownFieldLabel); unknown != tc.unknown || (err != nil && !unknown) {
			t.Errorf("%s %q: conversion error %v, want unknown=%v", tc.gr, tc.selector, err, tc.unknown)
			continue
		}
		if tc.unknown {
			continue
		}
		_, set, err := AttrsFor(fl, tc.namespaced)(tc.obj)
		if err != nil {
			t.Fatal(err)
		}
		if got := converted.Matches(set); got != tc.match {
			t.Errorf("%s %q: matches %v, want %v (fields %v)", tc.gr, tc.selector, got, tc.match, set)
		}
	}
}

// TestForServer: a label kube-apiserver accepts only from some release on
// is answered for that release and later ones, and forwarded for older
// ones and when the release is not known.
func TestForServer(t *testing.T) {
	slices := schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}
	if !VersionGated(slices) || VersionGated(schema.GroupResource{Resource: "pods"}) {
		t.Fatal("VersionGated: want resourceslices only")
	}
	for _, tc := range []struct {
		minor int
		want  bool
	}{{0, false}, {34, false}, {36, false}, {37, true}, {38, true}} {
		fl := ForServer(slices, FieldLabelsFor(slices, true, false), tc.minor)
		if _, ok := fl.Labels["spec.pool.name"]; ok != tc.want {
			t.Errorf("1.%d: spec.pool.name answered %v, want %v", tc.minor, ok, tc.want)
		}
		if _, ok := fl.Labels["spec.driver"]; !ok {
			t.Errorf("1.%d: spec.driver not answered", tc.minor)
		}
	}
	pods := FieldLabelsFor(schema.GroupResource{Resource: "pods"}, true, true)
	if got := ForServer(schema.GroupResource{Resource: "pods"}, pods, 0); len(got.Labels) != len(pods.Labels) {
		t.Errorf("pods: %d labels for an unknown release, want all %d", len(got.Labels), len(pods.Labels))
	}
}

// TestFieldSetsEveryServedVersion: every version client-go knows of a
// resource with field labels of its own has its fields computed, so that
// a version kube-apiserver starts preferring (a beta going GA) is not
// matched against an empty field set.
func TestFieldSetsEveryServedVersion(t *testing.T) {
	// Versions no supported kube-apiserver (1.30 on) serves any more.
	removed := map[schema.GroupVersion]bool{{Group: "events.k8s.io", Version: "v1beta1"}: true}
	checked := 0
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if strings.HasSuffix(gvk.Kind, "List") || gvk.Version == runtime.APIVersionInternal || removed[gvk.GroupVersion()] {
			continue
		}
		gvr, _ := meta.UnsafeGuessKindToResource(gvk)
		fl, ok := builtinFieldLabels[gvr.GroupResource()]
		if !ok || fl.Set == nil {
			continue
		}
		obj, err := scheme.Scheme.New(gvk)
		if err != nil {
			t.Fatal(err)
		}
		if len(fl.Set(obj)) == 0 {
			t.Errorf("%s: no fields computed for its field labels", gvk)
		}
		checked++
	}
	if checked < 10 {
		t.Fatalf("checked %d kinds, want every version of the resources with field labels", checked)
	}
}
