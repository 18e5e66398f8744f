package store

import (
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func podStoreWithGVK() *Store {
	fl := FieldLabelsFor(schema.GroupResource{Resource: "pods"}, true, true)
	gvk := corev1.SchemeGroupVersion.WithKind("Pod")
	return NewStore(AttrsFor(fl, true), func(obj runtime.Object) runtime.Object {
		obj.GetObjectKind().SetGroupVersionKind(gvk)
		return obj
	}, nil)
}

// TestStoreKeepsBuiltinAsProtobuf: a built-in object is stored as its
// protobuf message, not as the decoded object; decoding it gives back the
// object the watch delivered, kind and apiVersion included, and the
// protobuf answer is the stored message itself.
func TestStoreKeepsBuiltinAsProtobuf(t *testing.T) {
	s := podStoreWithGVK()
	in := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "5", Labels: map[string]string{"app": "x"},
			Annotations: map[string]string{"note": "kept"}},
		Spec:   corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}},
	}
	want := in.DeepCopy()
	want.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Pod"))
	if err := s.Replace([]any{in}, "10"); err != nil {
		t.Fatal(err)
	}
	o, _, ok := s.Get("ns", "a")
	if !ok {
		t.Fatal("pod not stored")
	}
	if o.obj != nil || o.raw == nil {
		t.Fatalf("stored decoded (%T) instead of as protobuf", o.obj)
	}
	got, err := o.Decoded()
	if err != nil {
		t.Fatal(err)
	}
	if !apiequality.Semantic.DeepEqual(got, want) {
		t.Errorf("decoded object differs (-want +got):\n%s", cmp.Diff(want, got))
	}
	wantRaw, err := want.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := o.Encoded(EncodingProtobuf, func(runtime.Object) ([]byte, error) {
		t.Error("protobuf form encoded again")
		return nil, nil
	})
	if err != nil || string(raw) != string(wantRaw) {
		t.Errorf("protobuf form: %v, equal %v", err, string(raw) == string(wantRaw))
	}
	if o.Namespace() != "ns" || o.Name() != "a" || o.Key() != "ns/a" {
		t.Errorf("key: %q %q %q", o.Namespace(), o.Name(), o.Key())
	}
}

// TestObjectSelectors: label and field selectors match a stored object
// exactly as they match the sets kube-apiserver computes from the decoded
// object, for namespaced and cluster-scoped objects.
func TestObjectSelectors(t *testing.T) {
	s := podStoreWithGVK()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a", ResourceVersion: "5",
			Labels: map[string]string{"app": "web", "tier": "front", "empty": ""}},
		Spec:   corev1.PodSpec{NodeName: "node-a", RestartPolicy: corev1.RestartPolicyAlways, HostNetwork: true},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}},
	}
	ls, fs, err := s.attrs(pod.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Replace([]any{pod}, "10"); err != nil {
		t.Fatal(err)
	}
	o, _, _ := s.Get("ns", "a")
	gotLabels, gotFields := o.selectable(s.attrs)
	for _, sel := range []string{"app=web", "app!=web", "app in (web,api)", "app notin (web)", "tier", "!tier", "missing",
		"!missing", "empty=", "empty", "app=web,tier=back", "app=we", "ap=web"} {
		parsed, err := labels.Parse(sel)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := parsed.Matches(gotLabels), parsed.Matches(ls); got != want {
			t.Errorf("label selector %q: matched %v, kube-apiserver's set %v", sel, got, want)
		}
	}
	for _, sel := range []string{"metadata.name=a", "metadata.name!=a", "metadata.namespace=ns", "metadata.namespace=other",
		"spec.nodeName=node-a", "spec.nodeName=node-b", "status.phase=Running", "status.podIP=10.0.0.1",
		"spec.hostNetwork=true", "spec.restartPolicy!=Always", "status.nominatedNodeName=", "spec.schedulerName="} {
		parsed, err := fields.ParseSelector(sel)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := parsed.Matches(gotFields), parsed.Matches(fs); got != want {
			t.Errorf("field selector %q: matched %v, kube-apiserver's set %v", sel, got, want)
		}
	}

	// A cluster-scoped object has no metadata.namespace.
	nodes := NewStore(AttrsFor(FieldLabelsFor(schema.GroupResource{Resource: "nodes"}, true, false), false), nil, nil)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "3"}, Spec: corev1.NodeSpec{Unschedulable: true}}
	if err := nodes.Replace([]any{node}, "3"); err != nil {
		t.Fatal(err)
	}
	n, _, ok := nodes.Get("", "node-a")
	if !ok || n.Namespace() != "" || n.Name() != "node-a" {
		t.Fatalf("node: %v %q %q", ok, n.Namespace(), n.Name())
	}
	_, nf := n.selectable(nodes.attrs)
	if nf.Has("metadata.namespace") || nf.Get("metadata.name") != "node-a" || nf.Get("spec.unschedulable") != "true" {
		t.Errorf("node fields: namespace %v, name %q, unschedulable %q", nf.Has("metadata.namespace"), nf.Get("metadata.name"), nf.Get("spec.unschedulable"))
	}
}

// TestStoreSharesFieldKeys: objects of one Store share one copy of their
// field-label names.
func TestStoreSharesFieldKeys(t *testing.T) {
	s := podStoreWithGVK()
	if err := s.Replace([]any{testPod("ns", "a", "1", nil), testPod("ns", "b", "2", nil)}, "2"); err != nil {
		t.Fatal(err)
	}
	a, _, _ := s.Get("ns", "a")
	b, _, _ := s.Get("ns", "b")
	if a.fieldKeys == "" || unsafe.StringData(a.fieldKeys) != unsafe.StringData(b.fieldKeys) {
		t.Errorf("field keys not shared: %q at %p, %q at %p", a.fieldKeys, unsafe.StringData(a.fieldKeys), b.fieldKeys, unsafe.StringData(b.fieldKeys))
	}
}

// TestStoreKeepsUnpackableDecoded: an object whose selector values cannot
// be packed (a NUL in a value) is kept decoded and still matches
// correctly.
func TestStoreKeepsUnpackableDecoded(t *testing.T) {
	s := podStoreWithGVK()
	pod := testPod("ns", "a", "1", map[string]string{"app": "x"})
	pod.Spec.SchedulerName = "odd\x00name"
	if err := s.Replace([]any{pod}, "1"); err != nil {
		t.Fatal(err)
	}
	o, _, _ := s.Get("ns", "a")
	if o.obj == nil {
		t.Fatal("unpackable object stored packed")
	}
	objs, _ := s.Snapshot(Predicate{Field: fields.OneTermEqualSelector("spec.schedulerName", "odd\x00name"), Label: labels.SelectorFromSet(labels.Set{"app": "x"})})
	if len(objs) != 1 {
		t.Errorf("selected %d objects, want 1", len(objs))
	}
}

// TestStoreGetLongKey: names whose key does not fit the lookup's stack
// buffer are found too.
func TestStoreGetLongKey(t *testing.T) {
	s := podStoreWithGVK()
	ns, name := strings.Repeat("n", 63), strings.Repeat("p", 253)
	if err := s.Replace([]any{testPod(ns, name, "1", nil)}, "1"); err != nil {
		t.Fatal(err)
	}
	if o, _, ok := s.Get(ns, name); !ok || o.Name() != name || o.Namespace() != ns {
		t.Errorf("long key not found")
	}
	if _, _, ok := s.Get(ns, name[1:]); ok {
		t.Errorf("found a name that is not stored")
	}
}
