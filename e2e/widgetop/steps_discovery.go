package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/restmapper"
)

// restMapper is the step restmapper: a discovery-driven RESTMapper maps
// example.com Widget, with v1 preferred, to widgets in example.com/v1,
// and discovery shows no renamed kind in example.com. The detail names
// the mapping, the version the server prefers and the groups whose name
// contains "example", each with its versions.
func (r *runner) restMapper(_ context.Context) (string, error) {
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(r.disc)
	gk := schema.GroupKind{Group: group, Kind: kind}
	m, err := mapper.RESTMapping(gk, "v1")
	if err != nil {
		return "", fmt.Errorf("mapping %s with v1 preferred: %w", gk, err)
	}
	want := schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}
	if m.Resource != want {
		return "", fmt.Errorf("%s maps to %s, want %s", gk, m.Resource, want)
	}
	if m.GroupVersionKind.Kind != kind {
		return "", fmt.Errorf("%s maps to kind %s", gk, m.GroupVersionKind)
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		return "", fmt.Errorf("%s maps to scope %s, want namespace", gk, m.Scope.Name())
	}
	serverPreferred := "none"
	if pm, err := mapper.RESTMapping(gk); err == nil {
		serverPreferred = pm.Resource.Version
	}
	if err := r.checkDiscoveredKinds(); err != nil {
		return "", err
	}
	groups, err := r.exampleGroups()
	if err != nil {
		return "", err
	}
	r.gvr = m.Resource
	r.widgets = r.dyn.Resource(r.gvr).Namespace(r.ns)
	return fmt.Sprintf("%s/%s/%s server-preferred=%s groups=%s",
		m.Resource.Group, m.Resource.Version, m.Resource.Resource, serverPreferred, strings.Join(groups, ";")), nil
}

// checkDiscoveredKinds checks that discovery lists widgets in
// example.com/v1 as kind Widget and no kind starting with "Renamed" in
// example.com.
func (r *runner) checkDiscoveredKinds() error {
	_, lists, err := r.disc.ServerGroupsAndResources()
	if err != nil {
		var failed *discovery.ErrGroupDiscoveryFailed
		if !errors.As(err, &failed) {
			return fmt.Errorf("discovering the API: %w", err)
		}
		for gv, gerr := range failed.Groups {
			if gv.Group == group {
				return fmt.Errorf("discovering %s: %w", gv, gerr)
			}
		}
	}
	sawWidgets := false
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil || gv.Group != group {
			continue
		}
		for _, res := range l.APIResources {
			if strings.HasPrefix(res.Kind, "Renamed") {
				return fmt.Errorf("discovery lists kind %s (resource %s) in %s", res.Kind, res.Name, l.GroupVersion)
			}
			if gv.Version == "v1" && res.Name == resource {
				if res.Kind != kind {
					return fmt.Errorf("discovery lists %s in %s as kind %s, want %s", resource, l.GroupVersion, res.Kind, kind)
				}
				sawWidgets = true
			}
		}
	}
	if !sawWidgets {
		return fmt.Errorf("discovery does not list %s in %s/v1", resource, group)
	}
	return nil
}

// exampleGroups returns the served groups whose name contains
// "example", as name[version,...] with the preferred version first.
func (r *runner) exampleGroups() ([]string, error) {
	list, err := r.disc.ServerGroups()
	if err != nil {
		return nil, fmt.Errorf("discovering the API groups: %w", err)
	}
	var out []string
	for _, g := range list.Groups {
		if !strings.Contains(g.Name, "example") {
			continue
		}
		versions := []string{g.PreferredVersion.Version}
		for _, v := range g.Versions {
			if !slices.Contains(versions, v.Version) {
				versions = append(versions, v.Version)
			}
		}
		out = append(out, fmt.Sprintf("%s[%s]", g.Name, strings.Join(versions, ",")))
	}
	slices.Sort(out)
	if !slices.ContainsFunc(out, func(s string) bool { return strings.HasPrefix(s, group+"[") }) {
		return nil, fmt.Errorf("discovery does not list group %s (groups with example: %v)", group, out)
	}
	return out, nil
}
