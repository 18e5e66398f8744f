package main

import "testing"

func TestParseImageRef(t *testing.T) {
	tests := []struct {
		in, name, tag string // name "" for an error
	}{
		// What a pod's `image: kube-apicache:latest` resolves to in the CRI.
		{"kube-apicache:latest", "docker.io/library/kube-apicache:latest", "latest"},
		{"kube-apicache", "docker.io/library/kube-apicache:latest", "latest"},
		{"kube-apicache-client:e2e", "docker.io/library/kube-apicache-client:e2e", "e2e"},
		{"registry.k8s.io/pause:3.10", "registry.k8s.io/pause:3.10", "3.10"},
		{"example/agent:v1", "docker.io/example/agent:v1", "v1"},
		{"localhost/agent:dev", "localhost/agent:dev", "dev"},
		{"localhost:5000/team/agent:dev", "localhost:5000/team/agent:dev", "dev"},
		{"Kube-Apicache:latest", "", ""},
		{"kube-apicache:", "", ""},
		{"kube-apicache@sha256:0123", "", ""},
		{"kube--apicache_:x", "", ""},
	}
	for _, tt := range tests {
		got, err := parseImageRef(tt.in)
		switch {
		case tt.name == "" && err == nil:
			t.Errorf("parseImageRef(%q) = %+v, want an error", tt.in, got)
		case tt.name != "" && err != nil:
			t.Errorf("parseImageRef(%q): %v", tt.in, err)
		case tt.name != "" && (got.Name != tt.name || got.Tag != tt.tag):
			t.Errorf("parseImageRef(%q) = %+v, want {Name:%s Tag:%s}", tt.in, got, tt.name, tt.tag)
		}
	}
}
