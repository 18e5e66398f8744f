// Package upstream is the agent's set of kube-apiserver endpoints: where
// they come from (the --upstream list, then the default/kubernetes
// EndpointSlices), how they are verified (the cluster CA, the Service's
// name, never a node's certificate), their health (from the traffic sent
// to them, then from probes), failover between them, and the transport
// every forwarded request and every request of the agent's own client
// takes.
//
// It must not decide what is forwarded or answered, nor change a
// request's credentials: it carries what it is given to a healthy
// endpoint, with the socket mark that keeps it off the redirect.
package upstream
