package agent

import (
	"k8s.io/client-go/rest"

	apicache "github.com/kube-apicache/kube-apicache/cache"
)

// restConfig returns the configuration of the agent's own client, for its
// informers, reviews, CSRs and EndpointSlice watch. It authenticates with the
// agent's ServiceAccount token (re-read as the kubelet rotates it) and sends
// every request to the active upstream endpoint through the marked upstream
// transport, so it follows failover and never passes the redirect.
//
// Forwarded client requests never use this configuration: they carry the
// caller's own credentials.
func (a *Agent) restConfig() *rest.Config {
	return &rest.Config{
		Host:            a.up.Pick().String(),
		BearerTokenFile: a.cfg.TokenFile,
		Transport:       a.up.ClientTransport(),
		UserAgent:       "kube-apicache/" + a.cfg.NodeName,
		QPS:             50,
		Burst:           100,
	}
}

// localRESTConfig is the configuration of the agent's own watches of
// this node's pods and Node: as the node with CacheAsNode (the agent's
// RBAC then needs neither), else as the agent.
func (a *Agent) localRESTConfig() *rest.Config {
	cfg := a.restConfig()
	if a.cfg.CacheAsNode {
		cfg.Impersonate = rest.ImpersonationConfig{UserName: apicache.NodeUsername(a.cfg.NodeName)}
	}
	// Its own user agent: its watch of this node's pods is the same
	// request as the cache's, and kube-apiserver's audit log tells them
	// apart by it.
	cfg.UserAgent += " detect-local"
	return cfg
}
