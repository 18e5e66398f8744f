package netrules

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/coreos/go-iptables/iptables"
)

// Backend is an iptables backend: the legacy xtables kernel interface or
// nf_tables. Rules written through one are invisible to the other, so the
// agent must use the one kube-proxy uses, or its jump would not be ahead of
// kube-proxy's in the kernel's evaluation order.
type Backend string

// The iptables backends. BackendAuto detects the node's (DetectBackend).
const (
	BackendAuto   Backend = "auto"
	BackendLegacy Backend = "legacy"
	BackendNFT    Backend = "nft"
)

// ParseBackend parses an --iptables-backend value.
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(s); b {
	case BackendAuto, BackendLegacy, BackendNFT:
		return b, nil
	}
	return "", fmt.Errorf("iptables backend %q: must be auto, legacy or nft", s)
}

// Command returns the iptables binary of backend b for family.
func (b Backend) Command(family Family) string {
	name := "iptables"
	if family == IPv6 {
		name = "ip6tables"
	}
	return name + "-" + string(b)
}

// SaveRunner runs an iptables-save binary with args and returns its standard
// output. A missing binary is reported as an error.
type SaveRunner func(ctx context.Context, binary string, args ...string) (string, error)

// ExecSave is the SaveRunner that executes the binary.
func ExecSave(ctx context.Context, binary string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, binary, args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = strings.TrimSpace(string(ee.Stderr))
		}
		return "", fmt.Errorf("%s %s: %w %s", binary, strings.Join(args, " "), err, stderr)
	}
	return string(out), nil
}

// kubeletHintChains are the chains the kubelet (KUBE-KUBELET-CANARY, older
// releases) and kube-proxy (KUBE-IPTABLES-HINT) create in the mangle table of
// the backend they use, so that other node components can follow them.
var kubeletHintChains = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// DetectBackend finds the backend kube-proxy and the kubelet use, as the
// iptables wrapper in Kubernetes' distroless-iptables image does:
//
//  1. the backend whose mangle table holds KUBE-IPTABLES-HINT or
//     KUBE-KUBELET-CANARY, nft checked first;
//  2. otherwise legacy if it holds 10 rules or more, or more rules than
//     nft; else nft (the default of current distributions).
//
// It returns the backend and a one-line reason for logs.
func DetectBackend(ctx context.Context, run SaveRunner) (Backend, string) {
	for _, b := range []Backend{BackendNFT, BackendLegacy} {
		out, err := run(ctx, "iptables-"+string(b)+"-save", "-t", "mangle")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			for _, hint := range kubeletHintChains {
				if strings.HasPrefix(line, ":"+hint+" ") {
					return b, fmt.Sprintf("%s chain found in the %s mangle table", hint, b)
				}
			}
		}
	}
	count := func(b Backend) int {
		n := 0
		for _, bin := range []string{"iptables-" + string(b) + "-save", "ip6tables-" + string(b) + "-save"} {
			out, err := run(ctx, bin)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "-") {
					n++
				}
			}
		}
		return n
	}
	legacy, nft := count(BackendLegacy), count(BackendNFT)
	if legacy >= 10 || legacy > nft {
		return BackendLegacy, fmt.Sprintf("no kubelet hint chain; legacy holds %d rules, nft %d", legacy, nft)
	}
	return BackendNFT, fmt.Sprintf("no kubelet hint chain; nft holds %d rules, legacy %d", nft, legacy)
}

// ResolveBackend returns b, or the detected backend when b is auto, with a
// one-line reason.
func ResolveBackend(ctx context.Context, b Backend, run SaveRunner) (Backend, string) {
	if b != BackendAuto {
		return b, "set by flag"
	}
	return DetectBackend(ctx, run)
}

// OpenIPTables returns go-iptables for family, running backend b's binary
// (iptables-legacy, ip6tables-nft, ...). It waits at most five seconds for
// the xtables lock: a lock held forever by someone else must not hang syncs
// or shutdown.
func OpenIPTables(b Backend, family Family) (IPTables, error) {
	proto := iptables.ProtocolIPv4
	if family == IPv6 {
		proto = iptables.ProtocolIPv6
	}
	bin := b.Command(family)
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("iptables backend %s: %w", b, err)
	}
	ipt, err := iptables.New(iptables.IPFamily(proto), iptables.Path(path), iptables.Timeout(5))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", bin, err)
	}
	return ipt, nil
}
