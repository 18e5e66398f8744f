// Package identity gives the agent the serving certificate pods accept in
// place of kube-apiserver's: obtained through the CertificateSigningRequest
// API (key generated in memory, optionally kept in a memory-backed volume
// for the next container, rotated before expiry) or read from
// files an operator provides, and in both cases trusted for interception only
// while it verifies against the pods' CA bundle for every name and IP they
// dial.
package identity

import (
	"net"
	"net/netip"
	"slices"
)

// SANs are the subject alternative names of the serving certificate: what
// pods dial to reach kube-apiserver through the agent.
type SANs struct {
	DNSNames []string
	IPs      []netip.Addr
}

// ServingSANs returns the names the serving certificate must carry, in a
// fixed order: the kubernetes Service's four DNS names under clusterDomain,
// then its cluster IPs, then the agent's listen IPs (one per IP family it
// serves). The agent requests exactly these, and the approver approves
// exactly these.
func ServingSANs(serviceVIPs []netip.Addr, listenIPs []netip.Addr, clusterDomain string) SANs {
	s := SANs{DNSNames: []string{
		"kubernetes",
		"kubernetes.default",
		"kubernetes.default.svc",
		"kubernetes.default.svc." + clusterDomain,
	}}
	for _, ip := range serviceVIPs {
		s.IPs = appendUnique(s.IPs, ip.Unmap())
	}
	for _, ip := range listenIPs {
		if ip.IsValid() {
			s.IPs = appendUnique(s.IPs, ip.Unmap())
		}
	}
	return s
}

func appendUnique(ips []netip.Addr, ip netip.Addr) []netip.Addr {
	if slices.Contains(ips, ip) {
		return ips
	}
	return append(ips, ip)
}

// NetIPs returns s.IPs as net.IP values, for x509 templates.
func (s SANs) NetIPs() []net.IP {
	out := make([]net.IP, 0, len(s.IPs))
	for _, ip := range s.IPs {
		out = append(out, net.IP(ip.AsSlice()))
	}
	return out
}

// all returns every DNS name and IP, as pods would put them in a URL host.
func (s SANs) all() []string {
	out := append([]string(nil), s.DNSNames...)
	for _, ip := range s.IPs {
		out = append(out, ip.String())
	}
	return out
}

// NodeCommonName is the subject common name of node node's serving
// certificate, as the kubernetes.io/kubelet-serving signer requires it.
func NodeCommonName(node string) string { return NodeUserPrefix + node }

// Subject constants of kubelet-serving certificates.
const (
	NodeUserPrefix    = "system:node:"
	NodesOrganization = "system:nodes"
)
