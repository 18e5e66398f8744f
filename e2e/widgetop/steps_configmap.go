package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// strategicPatchCM is the strategic merge patch of the step strategic.
const strategicPatchCM = `{"metadata":{"labels":{"example.com/tier":"silver"}},"data":{"k":"v"}}`

// ownerRef is the step ownerref: ConfigMap <prefix>-cm, owned by widget
// <prefix>-a, keeps an owner reference to a v1 Widget.
func (r *runner) ownerRef(ctx context.Context) (string, error) {
	name, owner := r.name("cm"), r.name("a")
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{"app": "widgetop"},
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion:         r.gvr.GroupVersion().String(),
			Kind:               kind,
			Name:               owner,
			UID:                r.uidA,
			Controller:         ptr.To(true),
			BlockOwnerDeletion: ptr.To(false),
		}},
	}}
	created, err := r.kube.CoreV1().ConfigMaps(r.ns).Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating ConfigMap %s: %w", name, err)
	}
	if err := checkOwnerRef(created.OwnerReferences, owner, r.uidA); err != nil {
		return "", fmt.Errorf("the created ConfigMap %s: %w", name, err)
	}
	got, err := r.kube.CoreV1().ConfigMaps(r.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("getting ConfigMap %s: %w", name, err)
	}
	if err := checkOwnerRef(got.OwnerReferences, owner, r.uidA); err != nil {
		return "", fmt.Errorf("ConfigMap %s read back: %w", name, err)
	}
	if got.Labels["app"] != "widgetop" {
		return "", fmt.Errorf("ConfigMap %s read back has labels %v, want app=widgetop", name, got.Labels)
	}
	ref := got.OwnerReferences[0]
	return fmt.Sprintf("%s owned by %s %s %s", name, ref.APIVersion, ref.Kind, ref.Name), nil
}

// strategic is the step strategic: a strategic merge patch of ConfigMap
// <prefix>-cm adds data and an original label key and leaves the owner
// reference alone.
func (r *runner) strategic(ctx context.Context) (string, error) {
	name, owner := r.name("cm"), r.name("a")
	got, err := r.kube.CoreV1().ConfigMaps(r.ns).Patch(ctx, name, types.StrategicMergePatchType, []byte(strategicPatchCM), metav1.PatchOptions{})
	if err != nil {
		return "", fmt.Errorf("strategic-merge-patching ConfigMap %s: %w", name, err)
	}
	if got.Labels["app"] != "widgetop" || got.Labels["example.com/tier"] != "silver" || len(got.Labels) != 2 {
		return "", fmt.Errorf("the patched ConfigMap %s has labels %v, want app=widgetop and example.com/tier=silver", name, got.Labels)
	}
	if got.Data["k"] != "v" {
		return "", fmt.Errorf("the patched ConfigMap %s has data %v, want k=v", name, got.Data)
	}
	if err := checkOwnerRef(got.OwnerReferences, owner, r.uidA); err != nil {
		return "", fmt.Errorf("the patched ConfigMap %s: %w", name, err)
	}
	return fmt.Sprintf("%s labels=app,example.com/tier owner %s %s", name, got.OwnerReferences[0].APIVersion, got.OwnerReferences[0].Kind), nil
}
