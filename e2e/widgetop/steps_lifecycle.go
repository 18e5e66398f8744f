package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Bounds of the steps that wait for the controller.
const (
	controllerWait = 60 * time.Second
	controllerPoll = 250 * time.Millisecond
)

// status is the step status: the controller has copied spec.size to
// status.observedSize on both widgets.
func (r *runner) status(ctx context.Context) (string, error) {
	want := map[string]int64{r.name("a"): 4, r.name("b"): 5}
	start := time.Now()
	last := map[string]any{}
	err := wait.PollUntilContextTimeout(ctx, controllerPoll, controllerWait, true, func(ctx context.Context) (bool, error) {
		done := true
		for name, size := range want {
			got, err := r.widgets.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				last[name] = err.Error()
				done = false
				continue
			}
			if err := checkWidget(got, "v1"); err != nil {
				return false, err
			}
			observed, found, _ := unstructured.NestedInt64(got.Object, "status", "observedSize")
			last[name] = nestedValue(got, "status", "observedSize")
			if !found || observed != size {
				done = false
			}
		}
		return done, nil
	})
	if err != nil {
		return "", fmt.Errorf("waiting for status.observedSize %v (last: %v): %w", want, last, err)
	}
	return fmt.Sprintf("observedSize %v after %s", want, time.Since(start).Round(time.Millisecond)), nil
}

// v2 is the step v2: widget <prefix>-a reads as example.com/v2, converted
// by the webhook, with spec.dimensions.size.
func (r *runner) v2(ctx context.Context) (string, error) {
	name := r.name("a")
	gvr := r.gvr
	gvr.Version = "v2"
	got, err := r.dyn.Resource(gvr).Namespace(r.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("getting widget %s at v2: %w", name, err)
	}
	if err := checkWidget(got, "v2"); err != nil {
		return "", fmt.Errorf("the widget at v2: %w", err)
	}
	if err := checkInt(got, 4, "spec", "dimensions", "size"); err != nil {
		return "", fmt.Errorf("the widget at v2: %w", err)
	}
	return fmt.Sprintf("%s %s spec.dimensions.size=4", name, got.GetAPIVersion()), nil
}

// denied is the step denied: the webhook denies widget <prefix>-bad, with
// a message that names the kind Widget and nothing renamed.
func (r *runner) denied(ctx context.Context) (string, error) {
	name := r.name("bad")
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": r.gvr.GroupVersion().String(),
		"kind":       kind,
		"metadata":   map[string]any{"name": name, "namespace": r.ns},
		"spec":       map[string]any{"size": int64(-1), "color": "black"},
	}}
	_, err := r.widgets.Create(ctx, bad, metav1.CreateOptions{})
	if err == nil {
		if derr := r.widgets.Delete(ctx, name, metav1.DeleteOptions{}); derr != nil && !apierrors.IsNotFound(derr) {
			return "", fmt.Errorf("widget %s with size -1 was created, and deleting it failed: %w", name, derr)
		}
		return "", fmt.Errorf("widget %s with size -1 was created, want a denial", name)
	}
	want := fmt.Sprintf("%s %s: %s", kind, name, denialText)
	msg := err.Error()
	if !strings.Contains(msg, want) {
		return "", fmt.Errorf("creating widget %s failed with %q, want a message containing %q", name, msg, want)
	}
	if mentionsRenamed(msg) {
		return "", fmt.Errorf("creating widget %s failed with %q, which names the renamed API", name, msg)
	}
	var statusErr *apierrors.StatusError
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) && !errors.As(err, &statusErr) {
		return "", fmt.Errorf("creating widget %s failed with a %T, want an API status: %w", name, err, err)
	}
	return fmt.Sprintf("reason=%s code=%d message=%s", apierrors.ReasonForError(err), statusCode(err), msg), nil
}

// statusCode returns the HTTP code of an API status error, or 0.
func statusCode(err error) int32 {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Code
	}
	return 0
}

// deleteA is the step delete: widget <prefix>-a, deleted, is gone once
// the controller has removed its finalizer.
func (r *runner) deleteA(ctx context.Context) (string, error) {
	name := r.name("a")
	start := time.Now()
	if err := r.widgets.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return "", fmt.Errorf("deleting widget %s: %w", name, err)
	}
	var last string
	err := wait.PollUntilContextTimeout(ctx, controllerPoll, controllerWait, true, func(ctx context.Context) (bool, error) {
		got, err := r.widgets.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			last = err.Error()
		default:
			last = fmt.Sprintf("finalizers %v", got.GetFinalizers())
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("waiting for widget %s to go (last: %s): %w", name, last, err)
	}
	return fmt.Sprintf("%s gone after %s", name, time.Since(start).Round(time.Millisecond)), nil
}

// cleanup is the step cleanup: widget <prefix>-b and ConfigMap
// <prefix>-cm are deleted, if they still exist.
func (r *runner) cleanup(ctx context.Context) (string, error) {
	var deleted []string
	b := r.name("b")
	switch err := r.widgets.Delete(ctx, b, metav1.DeleteOptions{}); {
	case err == nil:
		deleted = append(deleted, "widget/"+b)
	case !apierrors.IsNotFound(err):
		return "", fmt.Errorf("deleting widget %s: %w", b, err)
	}
	cm := r.name("cm")
	switch err := r.kube.CoreV1().ConfigMaps(r.ns).Delete(ctx, cm, metav1.DeleteOptions{}); {
	case err == nil:
		deleted = append(deleted, "configmap/"+cm)
	case !apierrors.IsNotFound(err):
		return "", fmt.Errorf("deleting ConfigMap %s: %w", cm, err)
	}
	if len(deleted) == 0 {
		return "nothing left", nil
	}
	return "deleted " + strings.Join(deleted, ","), nil
}
