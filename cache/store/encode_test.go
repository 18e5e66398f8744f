package store

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
)

// referenceEncode encodes obj the way kube-apiserver does: the versioning
// codec over the JSON or protobuf serializer for the object's version.
func referenceEncode(t *testing.T, m MediaType, gv schema.GroupVersion, obj runtime.Object) []byte {
	t.Helper()
	var s runtime.Serializer
	if m == MediaProtobuf {
		s = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	} else {
		info, _ := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
		s = info.Serializer
	}
	var buf bytes.Buffer
	if err := scheme.Codecs.EncoderForVersion(s, gv).Encode(obj.DeepCopyObject(), &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// testKind is a resource's kind as its Store and encoder see it.
type testKind struct {
	gvk        schema.GroupVersionKind
	namespaced bool
	fields     FieldLabels
	Encoder    *Encoder
}

func typedResource(gvr schema.GroupVersionResource, kind string, namespaced bool) *testKind {
	gvk := gvr.GroupVersion().WithKind(kind)
	return &testKind{gvk: gvk, namespaced: namespaced, fields: FieldLabelsFor(gvr.GroupResource(), true, namespaced),
		Encoder: NewEncoder(gvk, true)}
}

// objectsOf returns items as a Store of k keeps them, with apiVersion and
// kind set on typed objects, as an informer's Store does.
func objectsOf(t *testing.T, k *testKind, items ...runtime.Object) []*Object {
	t.Helper()
	st := NewStore(AttrsFor(k.fields, k.namespaced), func(obj runtime.Object) runtime.Object {
		if _, ok := obj.(*unstructured.Unstructured); !ok {
			obj.GetObjectKind().SetGroupVersionKind(k.gvk)
		}
		return obj
	}, nil)
	var out []*Object
	for _, it := range items {
		o, _, err := st.newObject(it.DeepCopyObject())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

func body2bytes(t *testing.T, f func() (*Body, error)) []byte {
	t.Helper()
	b, err := f()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := b.WriteAll(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestEncodingMatchesKubeAPIServer: objects and lists written from the
// cached per-object bytes are byte for byte what kube-apiserver's
// serializers write, in JSON and protobuf, for each default resource type.
func TestEncodingMatchesKubeAPIServer(t *testing.T) {
	pod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: "12", Labels: map[string]string{"app": name}},
			Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}},
		}
	}
	cases := []struct {
		name  string
		res   *testKind
		items []runtime.Object
		list  runtime.Object
	}{
		{
			name:  "pods",
			res:   typedResource(corev1.SchemeGroupVersion.WithResource("pods"), "Pod", true),
			items: []runtime.Object{pod("a"), pod("b")},
			list:  &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "42"}, Items: []corev1.Pod{*pod("a"), *pod("b")}},
		},
		{
			name: "services",
			res:  typedResource(corev1.SchemeGroupVersion.WithResource("services"), "Service", true),
			items: []runtime.Object{&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", ResourceVersion: "7"},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Port: 53}}}}},
			list: &corev1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "42"}, Items: []corev1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", ResourceVersion: "7"},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Port: 53}}}}}},
		},
		{
			name:  "namespaces, empty list",
			res:   typedResource(corev1.SchemeGroupVersion.WithResource("namespaces"), "Namespace", false),
			items: nil,
			list:  &corev1.NamespaceList{ListMeta: metav1.ListMeta{ResourceVersion: "42"}, Items: []corev1.Namespace{}},
		},
		{
			name: "endpointslices",
			res:  typedResource(discoveryv1.SchemeGroupVersion.WithResource("endpointslices"), "EndpointSlice", true),
			items: []runtime.Object{&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ns", ResourceVersion: "9"},
				AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}}},
			list: &discoveryv1.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "42"}, Items: []discoveryv1.EndpointSlice{{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "ns", ResourceVersion: "9"},
				AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}}}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := objectsOf(t, tc.res, tc.items...)
			gv := tc.res.gvk.GroupVersion()
			for _, m := range []MediaType{MediaJSON, MediaProtobuf} {
				got := body2bytes(t, func() (*Body, error) { return tc.res.Encoder.List(m, objs, 42) })
				want := referenceEncode(t, m, gv, tc.list)
				if !bytes.Equal(got, want) {
					t.Errorf("%s list:\n got %q\nwant %q", m.ContentType(), got, want)
				}
				for i, o := range objs {
					got := body2bytes(t, func() (*Body, error) { return tc.res.Encoder.Object(m, o) })
					want := referenceEncode(t, m, gv, tc.items[i])
					if !bytes.Equal(got, want) {
						t.Errorf("%s object:\n got %q\nwant %q", m.ContentType(), got, want)
					}
				}
			}
		})
	}
}

// TestEncodingCustomResource: custom resources are JSON with apiVersion and
// kind on every item, as kube-apiserver lists them.
func TestEncodingCustomResource(t *testing.T) {
	gvr := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	gvk := gvr.GroupVersion().WithKind("Widget")
	r := &testKind{gvk: gvk, namespaced: true, fields: FieldLabelsFor(gvr.GroupResource(), false, true),
		Encoder: NewEncoder(gvk, false)}
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w", "namespace": "ns", "resourceVersion": "5"},
		"spec":     map[string]any{"size": int64(3)},
	}}
	objs := objectsOf(t, r, w)
	got := string(body2bytes(t, func() (*Body, error) { return r.Encoder.List(MediaJSON, objs, 8) }))
	want := `{"kind":"WidgetList","apiVersion":"example.com/v1","metadata":{"resourceVersion":"8"},"items":[` +
		`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns","resourceVersion":"5"},"spec":{"size":3}}]}` + "\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("custom resource list (-want +got):\n%s", diff)
	}
}

// TestObjectEncodedOnce: the bytes of an object are made once and reused.
func TestObjectEncodedOnce(t *testing.T) {
	o := &Object{key: "ns/p", obj: &corev1.Pod{}}
	calls := 0
	enc := func(runtime.Object) ([]byte, error) { calls++; return []byte("x"), nil }
	for i := 0; i < 3; i++ {
		if _, err := o.Encoded(EncodingJSON, enc); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 {
		t.Errorf("encoded %d times, want 1", calls)
	}
}
