package main

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// jsonPatchA is the JSON patch of the step jsonpatch: its paths name the
// original label keys.
const jsonPatchA = `[` +
	`{"op":"test","path":"/metadata/labels/example.com~1tier","value":"gold"},` +
	`{"op":"replace","path":"/spec/size","value":4},` +
	`{"op":"add","path":"/metadata/labels/example.com~1zone","value":"east"}` +
	`]`

// jsonPatch is the step jsonpatch: a JSON patch that tests and adds
// labels by their original keys applies to widget <prefix>-a.
func (r *runner) jsonPatch(ctx context.Context) (string, error) {
	name := r.name("a")
	got, err := r.widgets.Patch(ctx, name, types.JSONPatchType, []byte(jsonPatchA), metav1.PatchOptions{})
	if err != nil {
		return "", fmt.Errorf("JSON-patching widget %s: %w", name, err)
	}
	if err := checkWidget(got, "v1"); err != nil {
		return "", fmt.Errorf("the patched widget: %w", err)
	}
	if err := checkInt(got, 4, "spec", "size"); err != nil {
		return "", fmt.Errorf("the patched widget: %w", err)
	}
	if err := checkLabelKeys(got, "app", "example.com/tier", "example.com/zone"); err != nil {
		return "", fmt.Errorf("the patched widget: %w", err)
	}
	if err := checkLabel(got, "example.com/zone", "east"); err != nil {
		return "", fmt.Errorf("the patched widget: %w", err)
	}
	return fmt.Sprintf("%s size=4 labels=%s", name, strings.Join(sortedKeys(got.GetLabels()), ",")), nil
}

// apply is the step apply: a server-side apply of widget <prefix>-b with
// an original label key comes back with it, and its managed fields
// name example.com/v1 and the original key.
func (r *runner) apply(ctx context.Context) (string, error) {
	name := r.name("b")
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": r.gvr.GroupVersion().String(),
		"kind":       kind,
		"metadata": map[string]any{
			"name":      name,
			"namespace": r.ns,
			"labels":    map[string]any{"example.com/tier": "gold"},
		},
		"spec": map[string]any{"size": int64(5), "color": "green"},
	}}
	got, err := r.widgets.Apply(ctx, name, obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return "", fmt.Errorf("applying widget %s: %w", name, err)
	}
	if err := checkWidget(got, "v1"); err != nil {
		return "", fmt.Errorf("the applied widget: %w", err)
	}
	if err := checkLabelKeys(got, "example.com/tier"); err != nil {
		return "", fmt.Errorf("the applied widget: %w", err)
	}
	if err := checkInt(got, 5, "spec", "size"); err != nil {
		return "", fmt.Errorf("the applied widget: %w", err)
	}
	if err := checkString(got, "green", "spec", "color"); err != nil {
		return "", fmt.Errorf("the applied widget: %w", err)
	}
	entry, err := applyEntry(got)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s managedFields %s %s %s", name, entry.Manager, entry.Operation, entry.APIVersion), nil
}

// applyEntry returns the managed fields entry of the run's applies of u
// and checks it: apiVersion example.com/v1, fields that name the label
// example.com/tier and nothing renamed.
func applyEntry(u *unstructured.Unstructured) (metav1.ManagedFieldsEntry, error) {
	var managers []string
	for _, e := range u.GetManagedFields() {
		managers = append(managers, fmt.Sprintf("%s/%s/%s", e.Manager, e.Operation, e.APIVersion))
		if e.Manager != fieldManager || e.Operation != metav1.ManagedFieldsOperationApply {
			continue
		}
		if e.APIVersion != group+"/v1" {
			return e, fmt.Errorf("the managed fields of %s by %s have apiVersion %q, want %s/v1", u.GetName(), fieldManager, e.APIVersion, group)
		}
		if e.FieldsV1 == nil {
			return e, fmt.Errorf("the managed fields of %s by %s have no fieldsV1", u.GetName(), fieldManager)
		}
		fields := string(e.FieldsV1.Raw)
		if !strings.Contains(fields, `"f:example.com/tier"`) || mentionsRenamed(fields) {
			return e, fmt.Errorf("the managed fields of %s by %s are %s, want f:example.com/tier and nothing renamed", u.GetName(), fieldManager, fields)
		}
		return e, nil
	}
	return metav1.ManagedFieldsEntry{}, fmt.Errorf("widget %s has no managed fields applied by %s (entries: %v)", u.GetName(), fieldManager, managers)
}
