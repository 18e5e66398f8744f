package store

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestEventEncoder: each EventEncoder embeds an object as kube-apiserver's
// serializers encode it for its media type (JSON without the trailing
// newline), or as the metadata-only get's body, whether or not the
// object's form was prepared first; a bookmark's object and an ERROR
// event's Status as Embed does (the bookmark's as PartialObjectMetadata
// for metadata); and an Encoder hands out the same EventEncoder every
// time.
func TestEventEncoder(t *testing.T) {
	k := typedResource(corev1.SchemeGroupVersion.WithResource("pods"), "Pod", true)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", ResourceVersion: "12", Labels: map[string]string{"app": "a"}},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}
	typed := pod.DeepCopy()
	typed.SetGroupVersionKind(k.gvk)
	bookmark := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "42", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	bookmark.SetGroupVersionKind(k.gvk)
	status := apierrors.NewResourceExpired("too old resource version: 1 (2)").ErrStatus
	status.SetGroupVersionKind(metav1.SchemeGroupVersion.WithKind("Status"))
	metadataOf := func(obj runtime.Object) runtime.Object {
		pm, err := AsPartialObjectMetadata(obj)
		if err != nil {
			t.Fatal(err)
		}
		return pm
	}
	want := func(m MediaType, obj runtime.Object) []byte {
		return bytes.TrimSuffix(referenceEncode(t, m, k.gvk.GroupVersion(), obj), []byte("\n"))
	}
	for _, m := range []MediaType{MediaJSON, MediaProtobuf} {
		for _, metadata := range []bool{false, true} {
			ee := k.Encoder.EventEncoder(m, metadata)
			if ee != k.Encoder.EventEncoder(m, metadata) || ee.MediaType() != m {
				t.Fatalf("%s metadata %v: not one EventEncoder of its media type", m.ContentType(), metadata)
			}
			wantObj := want(m, typed)
			wantBookmark, err := Embed(m, bookmark, k.Encoder)
			if err != nil {
				t.Fatal(err)
			}
			if metadata {
				b, err := k.Encoder.MetadataObject(m, objectsOf(t, k, pod)[0])
				if err != nil {
					t.Fatal(err)
				}
				wantObj = b.Bytes()
				if wantBookmark, err = Embed(m, metadataOf(bookmark), k.Encoder); err != nil {
					t.Fatal(err)
				}
			}
			for _, prepare := range []bool{false, true} {
				o := objectsOf(t, k, pod)[0]
				if prepare {
					if err := ee.Prepare(o); err != nil {
						t.Fatal(err)
					}
				}
				for range 2 {
					got, err := ee.Object(o)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, wantObj) {
						t.Errorf("%s metadata %v prepared %v: object\n got %q\nwant %q", m.ContentType(), metadata, prepare, got, wantObj)
					}
				}
			}
			got, err := ee.Bookmark(bookmark.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, wantBookmark) {
				t.Errorf("%s metadata %v: bookmark\n got %q\nwant %q", m.ContentType(), metadata, got, wantBookmark)
			}
			st := status
			if got, err = ee.Status(&st); err != nil {
				t.Fatal(err)
			}
			w, err := Embed(m, &status, k.Encoder)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, w) {
				t.Errorf("%s metadata %v: status\n got %q\nwant %q", m.ContentType(), metadata, got, w)
			}
		}
	}
}
