package store

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func testPod(ns, name, rv string, lbls map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv, Labels: lbls},
		Spec: corev1.PodSpec{NodeName: "node-a"}}
}

func newPodStore() *Store {
	fl := FieldLabelsFor(schema.GroupResource{Resource: "pods"}, true, true)
	return NewStore(AttrsFor(fl, true), nil, nil)
}

// TestStoreResourceVersion: the Store's RV is the one its content is
// consistent at: a list's RV, then each applied event's, then bookmarks';
// it never runs ahead of an event it has not applied, nor goes back.
func TestStoreResourceVersion(t *testing.T) {
	s := newPodStore()
	if s.Synced() || s.ResourceVersion() != 0 {
		t.Fatalf("new store: synced %v rv %d", s.Synced(), s.ResourceVersion())
	}
	if err := s.Replace([]any{testPod("ns", "a", "5", nil)}, "10"); err != nil {
		t.Fatal(err)
	}
	check := func(step string, want uint64) {
		t.Helper()
		if got := s.ResourceVersion(); got != want {
			t.Errorf("%s: rv %d, want %d", step, got, want)
		}
	}
	check("after list", 10)
	if err := s.Add(testPod("ns", "b", "11", nil)); err != nil {
		t.Fatal(err)
	}
	check("after add", 11)
	s.UpdateResourceVersion("11")
	s.UpdateResourceVersion("15") // bookmark
	check("after bookmark", 15)
	s.UpdateResourceVersion("12") // never back
	check("after older bookmark", 15)
	if err := s.Delete(testPod("ns", "a", "16", nil)); err != nil {
		t.Fatal(err)
	}
	check("after delete", 16)
	if _, _, ok := s.Get("ns", "a"); ok {
		t.Errorf("deleted object still there")
	}
	if o, rv, ok := s.Get("ns", "b"); !ok || o.Name() != "b" || rv != 16 {
		t.Errorf("get b: %v %d %v", o, rv, ok)
	}
	if !s.Synced() || s.Len() != 1 || s.Replaces() != 1 {
		t.Errorf("synced %v len %d replaces %d", s.Synced(), s.Len(), s.Replaces())
	}
}

// TestStoreSnapshot: lists come in kube-apiserver's key order (bytewise
// namespace/name) and honour namespace, label and field selectors.
func TestStoreSnapshot(t *testing.T) {
	s := newPodStore()
	items := []any{
		testPod("a", "x", "1", map[string]string{"app": "web"}),
		testPod("a-b", "x", "2", map[string]string{"app": "db"}),
		testPod("a", "w", "3", map[string]string{"app": "web"}),
		testPod("b", "x", "4", nil),
	}
	if err := s.Replace(items, "9"); err != nil {
		t.Fatal(err)
	}
	keys := func(objs []*Object) []string {
		var out []string
		for _, o := range objs {
			out = append(out, o.Key())
		}
		return out
	}
	objs, rv := s.Snapshot(Predicate{})
	if got, want := keys(objs), []string{"a-b/x", "a/w", "a/x", "b/x"}; !equal(got, want) || rv != 9 {
		t.Errorf("all: %v at %d, want %v at 9", got, rv, want)
	}
	objs, _ = s.Snapshot(Predicate{Namespace: "a", Label: labels.SelectorFromSet(labels.Set{"app": "web"})})
	if got, want := keys(objs), []string{"a/w", "a/x"}; !equal(got, want) {
		t.Errorf("namespace a, app=web: %v, want %v", got, want)
	}
	objs, _ = s.Snapshot(Predicate{Field: fields.ParseSelectorOrDie("metadata.name=x,metadata.namespace!=a")})
	if got, want := keys(objs), []string{"a-b/x", "b/x"}; !equal(got, want) {
		t.Errorf("fields: %v, want %v", got, want)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestStoreWait: a wait ends when the Store reaches the RV, or with the
// context's error.
func TestStoreWait(t *testing.T) {
	s := newPodStore()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.WaitForResourceVersion(ctx, 1); err == nil {
		t.Fatalf("unsynced store satisfied a wait")
	}
	if err := s.Replace(nil, "10"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.WaitForResourceVersion(context.Background(), 12) }()
	s.UpdateResourceVersion("11")
	select {
	case err := <-done:
		t.Fatalf("wait ended at rv 11: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	s.UpdateResourceVersion("12")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("wait did not end at rv 12")
	}
}
