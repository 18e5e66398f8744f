package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePlatforms(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string // nil for an error
	}{
		{"one platform", "linux/amd64", []string{"linux/amd64"}},
		// The order given is the image index's order.
		{"two platforms in the order given", "linux/arm64, linux/amd64", []string{"linux/arm64", "linux/amd64"}},
		{"an unknown platform", "linux/amd64,linux/s390x", nil},
		{"a platform twice", "linux/amd64,linux/amd64", nil},
		{"an empty list", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := parsePlatforms(tt.in)
			if tt.want == nil {
				if err == nil {
					t.Fatalf("got %v, want an error", ps)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.String())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("platforms (-want +got):\n%s", diff)
			}
		})
	}
}
