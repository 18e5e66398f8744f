package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
)

// watchWait bounds how long the watch steps wait for their events.
const watchWait = 30 * time.Second

// watch is the step watch: a watch from the list's resourceVersion sees
// the merge patch of spec.color on widget <prefix>-a as a MODIFIED v1
// Widget with its labels.
func (r *runner) watch(ctx context.Context) (string, error) {
	name := r.name("a")
	wctx, cancel := context.WithTimeout(ctx, watchWait)
	defer cancel()
	w, err := r.widgets.Watch(wctx, metav1.ListOptions{ResourceVersion: r.listRV})
	if err != nil {
		return "", fmt.Errorf("watching widgets from resourceVersion %s: %w", r.listRV, err)
	}
	defer w.Stop()

	patched, err := r.widgets.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"color":"blue"}}`), metav1.PatchOptions{})
	if err != nil {
		return "", fmt.Errorf("merge-patching widget %s: %w", name, err)
	}
	if err := checkWidget(patched, "v1"); err != nil {
		return "", fmt.Errorf("the patched widget: %w", err)
	}
	if err := checkString(patched, "blue", "spec", "color"); err != nil {
		return "", fmt.Errorf("the patched widget: %w", err)
	}

	var seen []string
	for {
		ev, err := nextEvent(wctx, w)
		if err != nil {
			return "", fmt.Errorf("waiting for widget %s to turn blue (events: %s): %w", name, strings.Join(seen, ", "), err)
		}
		seen = append(seen, string(ev.typ)+" "+ev.object.GetName())
		if ev.object.GetName() != name {
			continue
		}
		if err := checkWidget(ev.object, "v1"); err != nil {
			return "", fmt.Errorf("%s event: %w", ev.typ, err)
		}
		if err := checkLabelKeys(ev.object, "app", "example.com/tier"); err != nil {
			return "", fmt.Errorf("%s event: %w", ev.typ, err)
		}
		if color, _, _ := unstructured.NestedString(ev.object.Object, "spec", "color"); ev.typ != watch.Modified || color != "blue" {
			continue
		}
		return fmt.Sprintf("MODIFIED %s color=blue rv=%s after %d events", name, ev.object.GetResourceVersion(), len(seen)), nil
	}
}

// watchList is the step watchlist: a watch that sends initial events
// brings ADDED for widget <prefix>-a, then the bookmark that ends the
// initial events, a Widget.
func (r *runner) watchList(ctx context.Context) (string, error) {
	name := r.name("a")
	wctx, cancel := context.WithTimeout(ctx, watchWait)
	defer cancel()
	w, err := r.widgets.Watch(wctx, metav1.ListOptions{
		SendInitialEvents:    ptr.To(true),
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		ResourceVersion:      "",
		AllowWatchBookmarks:  true,
	})
	if err != nil {
		return "", fmt.Errorf("opening a watch with sendInitialEvents: %w", err)
	}
	defer w.Stop()

	added, sawA := 0, false
	for {
		ev, err := nextEvent(wctx, w)
		if err != nil {
			return "", fmt.Errorf("waiting for the initial events (%d ADDED, %s among them: %t): %w", added, name, sawA, err)
		}
		switch ev.typ {
		case watch.Added:
			added++
			if err := checkWidget(ev.object, "v1"); err != nil {
				return "", fmt.Errorf("ADDED event: %w", err)
			}
			if ev.object.GetName() == name {
				sawA = true
			}
		case watch.Bookmark:
			if ev.object.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
				continue
			}
			if err := checkBookmark(ev.object); err != nil {
				return "", err
			}
			if !sawA {
				return "", fmt.Errorf("the initial events ended after %d ADDED, none for %s", added, name)
			}
			return fmt.Sprintf("%d ADDED, then the initial-events-end BOOKMARK %s %s rv=%s",
				added, ev.object.GetAPIVersion(), ev.object.GetKind(), ev.object.GetResourceVersion()), nil
		}
	}
}

// checkBookmark checks the object of the bookmark that ends the initial
// events: kind Widget, and an apiVersion, if it has one, of example.com/v1.
func checkBookmark(u *unstructured.Unstructured) error {
	if u.GetKind() != kind {
		return fmt.Errorf("the initial-events-end bookmark has kind %q, want %q", u.GetKind(), kind)
	}
	if v := u.GetAPIVersion(); v != "" && v != group+"/v1" {
		return fmt.Errorf("the initial-events-end bookmark has apiVersion %q, want %s/v1", v, group)
	}
	return nil
}

// event is a watch event whose object is unstructured.
type event struct {
	typ    watch.EventType
	object *unstructured.Unstructured
}

// nextEvent returns the next event of w. An ERROR event, a closed watch,
// an object that is not unstructured and the end of ctx are errors.
func nextEvent(ctx context.Context, w watch.Interface) (event, error) {
	select {
	case <-ctx.Done():
		return event{}, fmt.Errorf("no event in time: %w", ctx.Err())
	case ev, ok := <-w.ResultChan():
		if !ok {
			return event{}, fmt.Errorf("the watch closed")
		}
		if ev.Type == watch.Error {
			return event{}, fmt.Errorf("ERROR event: %w", apierrors.FromObject(ev.Object))
		}
		u, ok := ev.Object.(*unstructured.Unstructured)
		if !ok {
			return event{}, fmt.Errorf("%s event with a %T", ev.Type, ev.Object)
		}
		return event{typ: ev.Type, object: u}, nil
	}
}
