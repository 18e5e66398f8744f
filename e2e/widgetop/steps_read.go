package main

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// widgetA returns widget <prefix>-a as the step create writes it.
func (r *runner) widgetA() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": r.gvr.GroupVersion().String(),
		"kind":       kind,
		"metadata": map[string]any{
			"name":        r.name("a"),
			"namespace":   r.ns,
			"labels":      map[string]any{"app": "widgetop", "example.com/tier": "gold"},
			"annotations": map[string]any{"example.com/note": "hello"},
			"finalizers":  []any{finalizer},
		},
		"spec": map[string]any{"size": int64(3), "color": "red"},
	}}
}

// create is the step create: widget <prefix>-a is created and comes back
// under its original names.
func (r *runner) create(ctx context.Context) (string, error) {
	name := r.name("a")
	got, err := r.widgets.Create(ctx, r.widgetA(), metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating widget %s: %w", name, err)
	}
	if err := checkWidgetA(got); err != nil {
		return "", fmt.Errorf("the created widget: %w", err)
	}
	r.uidA = got.GetUID()
	return fmt.Sprintf("%s uid=%s rv=%s", name, got.GetUID(), got.GetResourceVersion()), nil
}

// get is the step get: widget <prefix>-a reads back as created.
func (r *runner) get(ctx context.Context) (string, error) {
	name := r.name("a")
	got, err := r.widgets.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("getting widget %s: %w", name, err)
	}
	if err := checkWidgetA(got); err != nil {
		return "", fmt.Errorf("the widget read back: %w", err)
	}
	return fmt.Sprintf("%s rv=%s", name, got.GetResourceVersion()), nil
}

// list is the step list: label selectors with original keys and a field
// selector on the name find widget <prefix>-a, in a v1 WidgetList of
// Widgets.
func (r *runner) list(ctx context.Context) (string, error) {
	name := r.name("a")
	gold, err := r.listWidgets(ctx, metav1.ListOptions{LabelSelector: "example.com/tier=gold"})
	if err != nil {
		return "", err
	}
	if len(gold.Items) != 1 || gold.Items[0].GetName() != name {
		return "", fmt.Errorf("listing with example.com/tier=gold found %v, want just %s", itemNames(gold), name)
	}
	app, err := r.listWidgets(ctx, metav1.ListOptions{LabelSelector: "app=widgetop"})
	if err != nil {
		return "", err
	}
	if !containsItem(app, name) {
		return "", fmt.Errorf("listing with app=widgetop found %v, want %s among them", itemNames(app), name)
	}
	byName, err := r.listWidgets(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return "", err
	}
	if len(byName.Items) != 1 || byName.Items[0].GetName() != name {
		return "", fmt.Errorf("listing with metadata.name=%s found %v, want just it", name, itemNames(byName))
	}
	r.listRV = byName.GetResourceVersion()
	return fmt.Sprintf("tier=gold:%d app=widgetop:%d metadata.name:%d rv=%s",
		len(gold.Items), len(app.Items), len(byName.Items), r.listRV), nil
}

// listWidgets lists widgets with opts and checks that the list is a v1
// WidgetList of v1 Widgets.
func (r *runner) listWidgets(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	sel := opts.LabelSelector + opts.FieldSelector
	list, err := r.widgets.List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing widgets with %s: %w", sel, err)
	}
	if got, want := list.GetAPIVersion(), group+"/v1"; got != want {
		return nil, fmt.Errorf("listing widgets with %s: the list has apiVersion %q, want %q", sel, got, want)
	}
	if got := list.GetKind(); got != listKind {
		return nil, fmt.Errorf("listing widgets with %s: the list has kind %q, want %q", sel, got, listKind)
	}
	for i := range list.Items {
		if err := checkWidget(&list.Items[i], "v1"); err != nil {
			return nil, fmt.Errorf("listing widgets with %s: %w", sel, err)
		}
	}
	return list, nil
}

// itemNames returns the names of a list's items.
func itemNames(list *unstructured.UnstructuredList) []string {
	names := make([]string, 0, len(list.Items))
	for _, it := range list.Items {
		names = append(names, it.GetName())
	}
	return names
}

// containsItem says whether a list holds an item called name.
func containsItem(list *unstructured.UnstructuredList, name string) bool {
	for _, it := range list.Items {
		if it.GetName() == name {
			return true
		}
	}
	return false
}
