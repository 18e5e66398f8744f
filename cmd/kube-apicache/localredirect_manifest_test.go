package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// localRedirectPolicy is the part of a CiliumLocalRedirectPolicy the
// component's consistency depends on.
type localRedirectPolicy struct {
	Metadata struct{ Namespace string }
	Spec     struct {
		RedirectFrontend struct {
			ServiceMatcher struct {
				ServiceName string
				Namespace   string
				ToPorts     []struct{ Port, Protocol string }
			}
		}
		RedirectBackend struct {
			LocalEndpointSelector struct{ MatchLabels map[string]string }
			ToPorts               []struct{ Port, Name, Protocol string }
		}
	}
}

// TestCiliumLocalRedirectComponent checks that the Cilium Local Redirect
// Policy selects the component's agents and sends the Service to the port
// they listen on, in the namespace Cilium requires, and that the agents
// program nothing (no hostNetwork, no NET_ADMIN, --dataplane=external).
func TestCiliumLocalRedirectComponent(t *testing.T) {
	dir := filepath.Join("..", "..", "manifests", "components", "cilium-local-redirect")
	var lrp localRedirectPolicy
	var ds appsv1.DaemonSet
	for file, into := range map[string]any{"ciliumlocalredirectpolicy.yaml": &lrp, "daemonset.yaml": &ds} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	fe := lrp.Spec.RedirectFrontend.ServiceMatcher
	if fe.ServiceName != "kubernetes" || fe.Namespace != "default" || lrp.Metadata.Namespace != "default" {
		t.Errorf("policy %s for Service %s/%s; Cilium needs the policy in the Service's namespace, default/kubernetes",
			lrp.Metadata.Namespace, fe.Namespace, fe.ServiceName)
	}
	if ds.Namespace != lrp.Metadata.Namespace {
		t.Errorf("DaemonSet in %q, policy in %q: Cilium takes backends only from the policy's namespace", ds.Namespace, lrp.Metadata.Namespace)
	}
	pod := ds.Spec.Template
	for k, v := range lrp.Spec.RedirectBackend.LocalEndpointSelector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("policy selects %s=%s; the agents' pods have %q", k, v, pod.Labels[k])
		}
	}
	if pod.Spec.HostNetwork {
		t.Error("the agents run with hostNetwork; the policy redirects to their pod IPs")
	}
	c := pod.Spec.Containers[0]
	if !slices.Contains(c.Args, "--dataplane=external") {
		t.Errorf("agent args %v lack --dataplane=external", c.Args)
	}
	if sc := c.SecurityContext; sc != nil && sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
		t.Errorf("agent adds capabilities %v; it programs nothing", sc.Capabilities.Add)
	}
	// The port the agent listens on is --listen-address's.
	var listenPort string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--listen-address="); ok {
			listenPort = strconv.Itoa(int(netip.MustParseAddrPort(v).Port()))
		}
	}
	if listenPort == "" {
		t.Fatal("the agent's --listen-address is not set in the DaemonSet")
	}
	if len(lrp.Spec.RedirectBackend.ToPorts) != 1 || lrp.Spec.RedirectBackend.ToPorts[0].Port != listenPort ||
		lrp.Spec.RedirectBackend.ToPorts[0].Protocol != "TCP" {
		t.Errorf("policy redirects to %+v; the agent listens on TCP %s", lrp.Spec.RedirectBackend.ToPorts, listenPort)
	}
	found := false
	for _, p := range c.Ports {
		if p.Name == lrp.Spec.RedirectBackend.ToPorts[0].Name && strconv.Itoa(int(p.ContainerPort)) == listenPort {
			found = true
		}
	}
	if !found {
		t.Errorf("no container port %s named %q, which the policy names", listenPort, lrp.Spec.RedirectBackend.ToPorts[0].Name)
	}
	if pod.Spec.Containers[0].ReadinessProbe == nil || pod.Spec.Containers[0].ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("the agents' readiness probe is not /readyz: readiness is the redirect's switch")
	}
}
