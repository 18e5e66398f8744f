package upstream

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// TestEndpointURLs: only ready endpoints of the https port become
// Set, deduplicated across slices and sorted.
func TestEndpointURLs(t *testing.T) {
	https := []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To[int32](6443)}}
	slices := []*discoveryv1.EndpointSlice{{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       https,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.3"}},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.0.0.9"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		},
	}, {
		AddressType: discoveryv1.AddressTypeIPv6,
		Ports:       https,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"fd00::2"}}, {Addresses: []string{"10.0.0.2"}}},
	}, {
		AddressType: discoveryv1.AddressTypeFQDN,
		Ports:       https,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"api.example"}}},
	}}
	got := hosts(endpointURLs(slices))
	want := []string{"10.0.0.2:6443", "10.0.0.3:6443", "[fd00::2]:6443"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
}
