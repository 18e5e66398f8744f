package netrules_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kube-apicache/kube-apicache/netrules"
)

func TestDetectBackend(t *testing.T) {
	const empty = "*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"
	rules := func(n int) string {
		return "*filter\n:INPUT ACCEPT [0:0]\n" + strings.Repeat("-A INPUT -j ACCEPT\n", n) + "COMMIT\n"
	}
	tests := []struct {
		name string
		// saves maps a binary and its first argument to its output; a
		// missing key is a missing binary.
		saves map[string]string
		want  netrules.Backend
	}{{
		// kube-proxy marks its backend with KUBE-IPTABLES-HINT.
		name:  "hint in nft",
		saves: map[string]string{"iptables-nft-save -t": ":KUBE-IPTABLES-HINT - [0:0]\n", "iptables-legacy-save -t": empty},
		want:  netrules.BackendNFT,
	}, {
		// Older kubelets leave KUBE-KUBELET-CANARY instead.
		name:  "canary in legacy",
		saves: map[string]string{"iptables-nft-save -t": empty, "iptables-legacy-save -t": ":KUBE-KUBELET-CANARY - [0:0]\n"},
		want:  netrules.BackendLegacy,
	}, {
		// No hint: many legacy rules mean legacy.
		name:  "legacy rules",
		saves: map[string]string{"iptables-legacy-save ": rules(12), "iptables-nft-save ": rules(2)},
		want:  netrules.BackendLegacy,
	}, {
		// No hint, few rules, more in nft: nft.
		name:  "nft rules",
		saves: map[string]string{"iptables-legacy-save ": rules(1), "iptables-nft-save ": rules(3)},
		want:  netrules.BackendNFT,
	}, {
		// Nothing anywhere: nft, as current distributions default to.
		name: "empty node",
		want: netrules.BackendNFT,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run := func(_ context.Context, bin string, args ...string) (string, error) {
				key := bin + " "
				if len(args) > 0 {
					key += args[0]
				}
				out, ok := tc.saves[key]
				if !ok {
					return "", errors.New("not found")
				}
				return out, nil
			}
			got, why := netrules.DetectBackend(context.Background(), run)
			if got != tc.want {
				t.Errorf("DetectBackend = %s (%s), want %s", got, why, tc.want)
			}
			if b, _ := netrules.ResolveBackend(context.Background(), netrules.BackendLegacy, run); b != netrules.BackendLegacy {
				t.Errorf("a flag's backend was overridden by detection: %s", b)
			}
		})
	}
	if _, err := netrules.ParseBackend("ebpf"); err == nil {
		t.Error("ParseBackend accepted ebpf")
	}
}
