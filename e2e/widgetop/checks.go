package main

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// checkWidget checks that u is a Widget of example.com/<version>.
func checkWidget(u *unstructured.Unstructured, version string) error {
	if got, want := u.GetAPIVersion(), group+"/"+version; got != want {
		return fmt.Errorf("widget %s has apiVersion %q, want %q", u.GetName(), got, want)
	}
	if got := u.GetKind(); got != kind {
		return fmt.Errorf("widget %s has kind %q, want %q", u.GetName(), got, kind)
	}
	return nil
}

// checkLabelKeys checks that u has exactly the label keys want.
func checkLabelKeys(u *unstructured.Unstructured, want ...string) error {
	got := sortedKeys(u.GetLabels())
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		return fmt.Errorf("%s %s has label keys %v, want %v", u.GetKind(), u.GetName(), got, want)
	}
	return nil
}

// checkLabel checks that u has label key with value.
func checkLabel(u *unstructured.Unstructured, key, value string) error {
	if got, ok := u.GetLabels()[key]; !ok || got != value {
		return fmt.Errorf("%s %s has labels %v, want %s=%s", u.GetKind(), u.GetName(), u.GetLabels(), key, value)
	}
	return nil
}

// checkFinalizer checks that u has the finalizer example.com/cleanup.
func checkFinalizer(u *unstructured.Unstructured) error {
	if !slices.Contains(u.GetFinalizers(), finalizer) {
		return fmt.Errorf("widget %s has finalizers %v, want %s among them", u.GetName(), u.GetFinalizers(), finalizer)
	}
	return nil
}

// checkInt checks that the integer at path in u is want.
func checkInt(u *unstructured.Unstructured, want int64, path ...string) error {
	got, found, err := unstructured.NestedInt64(u.Object, path...)
	if err != nil || !found || got != want {
		return fmt.Errorf("widget %s has %s = %v, want %d", u.GetName(), strings.Join(path, "."), nestedValue(u, path...), want)
	}
	return nil
}

// checkString checks that the string at path in u is want.
func checkString(u *unstructured.Unstructured, want string, path ...string) error {
	got, found, err := unstructured.NestedString(u.Object, path...)
	if err != nil || !found || got != want {
		return fmt.Errorf("widget %s has %s = %v, want %q", u.GetName(), strings.Join(path, "."), nestedValue(u, path...), want)
	}
	return nil
}

// nestedValue returns the value at path in u, or "<none>".
func nestedValue(u *unstructured.Unstructured, path ...string) any {
	v, found, err := unstructured.NestedFieldNoCopy(u.Object, path...)
	if err != nil || !found {
		return "<none>"
	}
	return v
}

// checkWidgetA checks widget <prefix>-a as created: a v1 Widget with the
// labels app and example.com/tier, the annotation example.com/note, the
// finalizer and spec.size 3.
func checkWidgetA(u *unstructured.Unstructured) error {
	if err := checkWidget(u, "v1"); err != nil {
		return err
	}
	if err := checkLabelKeys(u, "app", "example.com/tier"); err != nil {
		return err
	}
	if got := u.GetAnnotations()["example.com/note"]; got != "hello" {
		return fmt.Errorf("widget %s has annotations %v, want example.com/note=hello", u.GetName(), u.GetAnnotations())
	}
	if err := checkFinalizer(u); err != nil {
		return err
	}
	return checkInt(u, 3, "spec", "size")
}

// checkOwnerRef checks that refs is one controller reference to the v1
// Widget name with uid.
func checkOwnerRef(refs []metav1.OwnerReference, name string, uid types.UID) error {
	if len(refs) != 1 {
		return fmt.Errorf("ownerReferences %v, want one", refs)
	}
	ref := refs[0]
	if ref.APIVersion != group+"/v1" || ref.Kind != kind || ref.Name != name || ref.UID != uid {
		return fmt.Errorf("ownerReference %s %s %s (uid %s), want %s/v1 %s %s (uid %s)",
			ref.APIVersion, ref.Kind, ref.Name, ref.UID, group, kind, name, uid)
	}
	if ref.Controller == nil || !*ref.Controller {
		return fmt.Errorf("ownerReference to %s is not the controller reference", name)
	}
	return nil
}

// mentionsRenamed says whether s names the renamed API, in any case.
func mentionsRenamed(s string) bool {
	return strings.Contains(strings.ToLower(s), "renamed")
}
