package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
)

// The configuration files of the real node's daemons. Every path they
// would default to on a real machine is pointed into the node's Dir; the
// few they hard-code are undone by the host journal (node_host.go).

// containerdConfig is containerd 1.6's configuration (version 2): its own
// root, state and socket, the CRI plugin with overlayfs, cgroupfs, runc's
// state under the node's Dir, CNI from the Debian plugins, and pod network
// namespaces mounted under its state dir instead of /run/netns.
//
// restrict_oom_score_adj clamps the oom_score_adj the kubelet asks for
// (-998 for every pod sandbox, -997 for Guaranteed containers) to
// containerd's own: lowering it needs CAP_SYS_RESOURCE, which machines
// that are themselves containers (this one) do not grant, and runc then
// fails every sandbox with "can't get final child's PID from pipe: EOF"
// (its log.json says "failed to update /proc/self/oom_score_adj:
// Permission denied").
func (n *RealNode) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = %[3]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[6]q

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
    max_conf_num = 1
`,
		n.path("containerd/root"), n.path("containerd/state"), n.Socket,
		n.path("containerd/opt"), PauseImage, n.path("containerd/runc"),
		CNIBinDir, n.path("cni/net.d"))
}

// cniConfig is the pod network: a bridge of its own (the emulated pods keep
// cbr0), host-local addresses from RealPodCIDR with their state under the
// node's Dir, and portmap. containerd adds the loopback network itself.
func (n *RealNode) cniConfig() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       n.cniNetwork,
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      realPodBridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": RealPodCIDR, "gateway": realPodGateway}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": n.path("cni/ipam"),
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeletConfig is the KubeletConfiguration. Notes on the choices:
//   - cgroup v1 (this kernel's hierarchy) must be allowed explicitly, and
//     containerd 1.6 does not report its cgroup driver, so the kubelet uses
//     the configured one: cgroupfs, under the node's own cgroup root;
//   - webhook authentication and authorization, so that the apiserver's
//     logs, exec and port-forward calls are checked as on a real node;
//   - no static pods, no cluster DNS, an empty resolv.conf;
//   - eviction and image garbage collection thresholds that never fire on
//     a shared disk: a test's pods must not disappear because the
//     machine's disk is full of other things;
//   - protectKernelDefaults stays false: the kubelet sets its sysctls and
//     the journal restores them (true would make it fail on any machine
//     not tuned for it);
//   - no graceful node shutdown (it takes systemd inhibitor locks).
func (n *RealNode) kubeletConfig() ([]byte, error) {
	conf := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               n.CgroupRoot,
		"containerRuntimeEndpoint": "unix://" + n.Socket,
		"authentication": map[string]any{
			"anonymous": map[string]bool{"enabled": false},
			"webhook":   map[string]any{"enabled": true, "cacheTTL": "10s"},
			"x509":      map[string]string{"clientCAFile": n.cluster.path("ca.crt")},
		},
		"authorization": map[string]any{
			"mode":    "Webhook",
			"webhook": map[string]string{"cacheAuthorizedTTL": "10s", "cacheUnauthorizedTTL": "10s"},
		},
		"tlsCertFile":                 n.cluster.path("kubelet-serving.crt"),
		"tlsPrivateKeyFile":           n.cluster.path("kubelet-serving.key"),
		"readOnlyPort":                0,
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 10248,
		"failSwapOn":                  false,
		"resolvConf":                  n.path("resolv.conf"),
		"clusterDomain":               ClusterDomain,
		"registerNode":                true,
		"podLogsDir":                  n.path("pod-logs"),
		"volumePluginDir":             n.path("volume-plugins"),
		"protectKernelDefaults":       false,
		"shutdownGracePeriod":         "0s",
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available":   "1Mi",
			"nodefs.available":   "1%",
			"nodefs.inodesFree":  "1%",
			"imagefs.available":  "1%",
			"imagefs.inodesFree": "1%",
		},
		"nodeStatusUpdateFrequency": "2s",
		"serializeImagePulls":       false,
		"rotateCertificates":        false,
		"serverTLSBootstrap":        false,
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeProxyConfig is kube-proxy's configuration: its mode, the
// cluster's pod range, and conntrack settings of zero, which leave the
// host-wide table size and the timeouts as they are.
func (n *RealNode) kubeProxyConfig() ([]byte, error) {
	conf := map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"mode":               n.ProxyMode,
		"clientConnection":   map[string]string{"kubeconfig": n.cluster.path("kube-proxy.kubeconfig")},
		"hostnameOverride":   n.Name,
		"clusterCIDR":        ClusterPodCIDR,
		"healthzBindAddress": "127.0.0.1:10256",
		"metricsBindAddress": "127.0.0.1:10249",
		"conntrack": map[string]any{
			"maxPerCore":            0,
			"min":                   0,
			"tcpEstablishedTimeout": "0s",
			"tcpCloseWaitTimeout":   "0s",
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// writeFile writes b to name under the node's Dir.
func (n *RealNode) writeFile(name string, b []byte) error {
	return os.WriteFile(n.path(name), b, 0o644)
}
