package netrules_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kube-apicache/kube-apicache/netrules"
	fake "github.com/kube-apicache/kube-apicache/netrules/testing"
)

func TestLocalAddress(t *testing.T) {
	tests := []struct {
		name      string
		noDummy   bool
		wantLink  string
		wantAddrs []string
		wantLinks []string
	}{{
		// A kernel with dummy links gets a link of our own.
		name:      "dummy link",
		wantLink:  "kube-apicache0",
		wantAddrs: []string{"kube-apicache0 169.254.25.10/32"},
		wantLinks: []string{"kube-apicache0", "lo"},
	}, {
		// A kernel without dummy links falls back to loopback.
		name:      "loopback fallback",
		noDummy:   true,
		wantLink:  "lo",
		wantAddrs: []string{"lo 169.254.25.10/32"},
		wantLinks: []string{"lo"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nl := fake.NewNetlink()
			nl.NoDummy = tc.noDummy
			a := netrules.NewLocalAddress(nl, "kube-apicache0", netip.MustParseAddr("169.254.25.10"))
			added, err := a.Sync()
			must(t, err)
			if !added {
				t.Errorf("first sync did not add the address")
			}
			if a.Link() != tc.wantLink {
				t.Errorf("link = %q, want %q", a.Link(), tc.wantLink)
			}
			added, err = a.Sync()
			must(t, err)
			if added {
				t.Errorf("second sync added the address again")
			}
			if diff := cmp.Diff(tc.wantAddrs, nl.Addresses()); diff != "" {
				t.Errorf("addresses (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLinks, nl.Links()); diff != "" {
				t.Errorf("links (-want +got):\n%s", diff)
			}
			must(t, a.Remove())
			if got := nl.Addresses(); len(got) != 0 {
				t.Errorf("addresses left after Remove: %v", got)
			}
			if diff := cmp.Diff([]string{"lo"}, nl.Links()); diff != "" {
				t.Errorf("links after Remove (-want +got):\n%s", diff)
			}
			// Removing twice is fine.
			must(t, a.Remove())
		})
	}
}
