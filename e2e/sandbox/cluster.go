// Package sandbox runs a small Kubernetes cluster from real parts, inside
// network namespaces of its own: etcd, kube-apiserver and
// kube-controller-manager in a control-plane namespace, a node namespace with
// a simulated kube-proxy, and pod namespaces whose processes see a real
// ServiceAccount volume, exactly as in a pod. Nothing is changed in the
// machine's root network namespace, and Stop removes everything.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Addresses of the sandbox network. All of them exist only inside the
// sandbox's namespaces.
const (
	// ServiceVIP is the cluster IP of default/kubernetes, the first address
	// of ServiceCIDR, and ServicePort its port.
	ServiceVIP  = "10.96.0.1"
	ServicePort = 443
	ServiceCIDR = "10.96.0.0/12"
	// The control-plane link: the node side and the apiservers' addresses.
	nodeCPAddr   = "10.250.0.1"
	apiserverNet = "10.250.0.%d"
	// The pod network, bridged in the node namespace.
	podGateway = "10.244.0.1"
	podNet     = "10.244.0.%d"
	// NodeName is the sandbox's one node.
	NodeName      = "sandbox-node"
	ClusterDomain = "cluster.local"
	apiserverPort = 6443
)

// Options configure a sandbox.
type Options struct {
	// BinDir holds etcd, kube-apiserver and kube-controller-manager.
	BinDir string
	// APIServers is the number of kube-apiserver instances (default 1).
	APIServers int
	// Logf receives progress messages; nil discards them.
	Logf func(format string, args ...any)
	// RealNode leaves the node to a real kubelet and kube-proxy
	// (StartRealNode): no simulated kube-proxy rules, no pre-made Node.
	// Emulated pods (NewPod) bind their Pod objects to the same node, so
	// the kubelet would try to run them: do not mix the two yet.
	RealNode bool
	// Controllers are kube-controller-manager controllers to run besides
	// the sandbox's own (baseControllers), by their --controllers names.
	Controllers []string
}

// Cluster is a running sandbox.
type Cluster struct {
	// Dir holds certificates, logs, the audit log and data.
	Dir string
	// CP is the control-plane namespace, Node the node namespace.
	CP, Node NetNS
	// CA is the cluster CA: it signs serving and client certificates and
	// kube-controller-manager signs CSRs with it.
	CA *CA
	// AdminConfig and Admin have system:masters access, dialled from the
	// control-plane namespace.
	AdminConfig *rest.Config
	Admin       kubernetes.Interface
	// AuditLog is kube-apiserver's audit log (JSON lines, every request).
	AuditLog string
	// Minor is the control plane's minor release (37 for v1.37.2), read
	// from kube-apiserver --version: the flags differ between releases.
	Minor int

	opts Options
	id   string

	mu         sync.Mutex // protects the fields below
	apiservers []*APIServer
	procs      []*Process
	namespaces []NetNS
	nextPodIP  int
	realNode   *RealNode
	stopped    bool

	scraperMu          sync.Mutex // protects the fields below
	scraperToken       string
	scraperTokenExpiry time.Time
}

// APIServer is one kube-apiserver instance.
type APIServer struct {
	Addr    string // IP inside the control-plane namespace
	URL     string // https://Addr:6443
	Process *Process
	args    []string
}

var (
	liveMu sync.Mutex // protects live and started
	live   = map[*Cluster]bool{}
	// started counts this process's clusters: all but the first get a
	// sequence number in their id, so their namespaces do not collide.
	started int
)

// StopAll stops every running sandbox of this process. It is for signal
// handlers; tests use Cluster.Stop.
func StopAll() {
	liveMu.Lock()
	cs := make([]*Cluster, 0, len(live))
	for c := range live {
		cs = append(cs, c)
	}
	liveMu.Unlock()
	for _, c := range cs {
		_ = c.Stop()
	}
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

// Start creates the namespaces, generates the PKI and starts the control
// plane. On error everything created so far is removed.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the sandbox needs root (network namespaces, iptables)")
	}
	for _, tool := range []string{"ip", "iptables", "ipset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("the sandbox needs %s: %w", tool, err)
		}
	}
	if opts.APIServers == 0 {
		opts.APIServers = 1
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(opts.BinDir, b)); err != nil {
			return nil, fmt.Errorf("control-plane binary missing (run make control-plane): %w", err)
		}
	}
	if err := CleanStale(); err != nil {
		return nil, err
	}
	if err := cleanStaleRealNodes(opts.RealNode); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kube-apicache-sandbox-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, opts: opts, id: strconv.Itoa(os.Getpid()), nextPodIP: 10}
	if c.Minor, err = binaryMinor(filepath.Join(opts.BinDir, "kube-apiserver")); err != nil {
		return nil, err
	}
	liveMu.Lock()
	live[c] = true
	if started++; started > 1 {
		c.id += "-" + strconv.Itoa(started)
	}
	liveMu.Unlock()
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()
	start := time.Now()
	if err := c.setUpNetwork(ctx); err != nil {
		return nil, fmt.Errorf("setting up the network: %w", err)
	}
	if err := c.writePKI(); err != nil {
		return nil, fmt.Errorf("generating PKI: %w", err)
	}
	if err := c.startControlPlane(ctx); err != nil {
		return nil, err
	}
	if err := c.bootstrap(ctx); err != nil {
		return nil, fmt.Errorf("bootstrapping the cluster: %w", err)
	}
	c.logf("sandbox cluster ready in %s (dir %s)", time.Since(start).Round(time.Millisecond), dir)
	return c, nil
}

// nsName returns the name of a sandbox namespace.
func (c *Cluster) nsName(suffix string) string {
	return nsPrefix + c.id + "-" + suffix
}

func (c *Cluster) newNetNS(ctx context.Context, suffix string) (NetNS, error) {
	n, err := createNetNS(ctx, c.nsName(suffix))
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	c.namespaces = append(c.namespaces, n)
	c.mu.Unlock()
	return n, nil
}

// setUpNetwork builds the control-plane and node namespaces, the link
// between them, the pod bridge and the simulated kube-proxy.
func (c *Cluster) setUpNetwork(ctx context.Context) error {
	var err error
	if c.CP, err = c.newNetNS(ctx, "cp"); err != nil {
		return err
	}
	if c.Node, err = c.newNetNS(ctx, "node"); err != nil {
		return err
	}
	steps := [][]string{
		{"ip", "link", "add", "cp0", "type", "veth", "peer", "name", "eth0", "netns", c.CP.Name()},
		{"ip", "addr", "add", nodeCPAddr + "/24", "dev", "cp0"},
		{"ip", "link", "set", "cp0", "up"},
		{"ip", "link", "add", "cbr0", "type", "bridge"},
		{"ip", "addr", "add", podGateway + "/24", "dev", "cbr0"},
		{"ip", "link", "set", "cbr0", "up"},
		{"sysctl", "-qw", "net.ipv4.ip_forward=1"},
		// A real node reaches Service IPs through its default route: the
		// kernel routes a host-network connect() before nat OUTPUT
		// rewrites it.
		{"ip", "route", "add", ServiceCIDR, "dev", "cp0"},
	}
	for _, s := range steps {
		if err := c.Node.Run(ctx, s...); err != nil {
			return err
		}
	}
	cpSteps := [][]string{{"ip", "link", "set", "eth0", "up"}}
	for i := range c.opts.APIServers {
		cpSteps = append(cpSteps, []string{"ip", "addr", "add", fmt.Sprintf(apiserverNet, i+2) + "/24", "dev", "eth0"})
	}
	cpSteps = append(cpSteps, []string{"ip", "route", "add", "default", "via", nodeCPAddr})
	for _, s := range cpSteps {
		if err := c.CP.Run(ctx, s...); err != nil {
			return err
		}
	}
	if c.opts.RealNode {
		return nil // kube-proxy programs the node (StartRealNode)
	}
	return c.installKubeProxy(ctx)
}

// installKubeProxy writes what kube-proxy's iptables mode writes for the
// kubernetes Service: KUBE-SERVICES jumped from PREROUTING and OUTPUT, and a
// DNAT of the VIP to the apiserver endpoints, spread at random.
func (c *Cluster) installKubeProxy(ctx context.Context) error {
	return c.installKubeProxyIn(ctx, c.Node)
}

// installKubeProxyIn writes the simulated kube-proxy's rules into ns.
func (c *Cluster) installKubeProxyIn(ctx context.Context, ns NetNS) error {
	ipt := func(args ...string) error {
		return ns.Run(ctx, append([]string{"iptables", "-w", "-t", "nat"}, args...)...)
	}
	if err := ipt("-N", "KUBE-SERVICES"); err != nil {
		return err
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		if err := ipt("-A", hook, "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"); err != nil {
			return err
		}
	}
	n := c.opts.APIServers
	for i := range n {
		args := []string{"-A", "KUBE-SERVICES", "-d", ServiceVIP + "/32", "-p", "tcp", "-m", "tcp", "--dport", strconv.Itoa(ServicePort),
			"-m", "comment", "--comment", "default/kubernetes:https"}
		if remaining := n - i; remaining > 1 {
			args = append(args, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.5f", 1/float64(remaining)))
		}
		args = append(args, "-j", "DNAT", "--to-destination", fmt.Sprintf(apiserverNet+":%d", i+2, apiserverPort))
		if err := ipt(args...); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) path(name string) string { return filepath.Join(c.Dir, name) }

func (c *Cluster) writePKI() error {
	var err error
	if c.CA, err = NewCA("kube-apicache-sandbox-ca"); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("ca.crt"), c.CA.CertPEM, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("ca.key"), c.CA.KeyPEM, 0o600); err != nil {
		return err
	}
	ips := []net.IP{net.ParseIP(ServiceVIP), net.ParseIP("127.0.0.1")}
	for i := range c.opts.APIServers {
		ips = append(ips, net.ParseIP(fmt.Sprintf(apiserverNet, i+2)))
	}
	serving, err := c.CA.Issue(CertSpec{
		CommonName: "kube-apiserver",
		DNSNames:   KubernetesServiceNames(),
		IPs:        ips,
		Server:     true,
	})
	if err != nil {
		return err
	}
	if _, _, err := serving.Write(c.Dir, "apiserver"); err != nil {
		return err
	}
	for name, spec := range map[string]CertSpec{
		"admin": {CommonName: "sandbox-admin", Organization: []string{"system:masters"}, Client: true},
		"kcm":   {CommonName: "system:kube-controller-manager", Client: true},
	} {
		kp, err := c.CA.Issue(spec)
		if err != nil {
			return err
		}
		if _, _, err := kp.Write(c.Dir, name); err != nil {
			return err
		}
	}
	if c.opts.RealNode {
		if err := c.writeKubeletClientPKI(); err != nil {
			return err
		}
	}
	priv, pub, err := newServiceAccountKey()
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.path("sa.key"), priv, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(c.path("sa.pub"), pub, 0o644); err != nil {
		return err
	}
	return os.WriteFile(c.path("audit-policy.yaml"), []byte(auditPolicy), 0o644)
}

// binaryMinor runs a Kubernetes binary's --version ("Kubernetes v1.37.2")
// and returns its minor release.
func binaryMinor(bin string) (int, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("%s --version: %w", bin, err)
	}
	v, err := utilversion.ParseGeneric(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "Kubernetes ")))
	if err != nil || v.Major() != 1 {
		return 0, fmt.Errorf("%s --version: cannot read %q", bin, strings.TrimSpace(string(out)))
	}
	return int(v.Minor()), nil
}

// runtimeConfig turns on the beta (in 1.34, alpha) versions of
// certificates.k8s.io that serve ClusterTrustBundles and
// PodCertificateRequests: PodCertificateRequest went from v1alpha1 to
// v1beta1 in 1.35.
func (c *Cluster) runtimeConfig() string {
	pcr := "certificates.k8s.io/v1beta1/podcertificaterequests=true"
	if c.Minor < 35 {
		pcr = "certificates.k8s.io/v1alpha1/podcertificaterequests=true"
	}
	return "certificates.k8s.io/v1beta1/clustertrustbundles=true," + pcr
}

// KubernetesServiceNames are the DNS names of the kubernetes Service.
func KubernetesServiceNames() []string {
	return []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + ClusterDomain}
}

// auditPolicy records every request with its user, at Metadata level.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

func (c *Cluster) bin(name string) string { return filepath.Join(c.opts.BinDir, name) }

func (c *Cluster) start(ns NetNS, name string, args ...string) (*Process, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name(), c.bin(name)}, args...)...)
	p, err := startProcess(name, cmd, c.path(name+".log"))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return p, nil
}

func (c *Cluster) startControlPlane(ctx context.Context) error {
	etcd, err := c.start(c.CP, "etcd",
		"--data-dir", c.path("etcd-data"),
		"--listen-client-urls", "http://127.0.0.1:2379",
		"--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380",
		"--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	if err != nil {
		return err
	}
	if err := c.waitHTTP(ctx, c.CP, "http://127.0.0.1:2379/health", etcd); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	c.AuditLog = c.path("audit.log")
	for i := range c.opts.APIServers {
		addr := fmt.Sprintf(apiserverNet, i+2)
		as := &APIServer{Addr: addr, URL: fmt.Sprintf("https://%s:%d", addr, apiserverPort)}
		as.args = []string{
			"--etcd-servers", "http://127.0.0.1:2379",
			"--bind-address", addr,
			"--advertise-address", addr,
			"--secure-port", strconv.Itoa(apiserverPort),
			"--tls-cert-file", c.path("apiserver.crt"),
			"--tls-private-key-file", c.path("apiserver.key"),
			"--client-ca-file", c.path("ca.crt"),
			"--service-account-issuer", "https://kubernetes.default.svc." + ClusterDomain,
			"--service-account-key-file", c.path("sa.pub"),
			"--service-account-signing-key-file", c.path("sa.key"),
			"--service-cluster-ip-range", ServiceCIDR,
			"--authorization-mode", "Node,RBAC",
			// Beta resources off by default that the cache has field
			// label tables for: served here, so that the tables are
			// checked against kube-apiserver like the others.
			"--feature-gates", "ClusterTrustBundle=true,PodCertificateRequest=true",
			"--runtime-config", c.runtimeConfig(),
			"--allow-privileged",
			"--audit-policy-file", c.path("audit-policy.yaml"),
			"--audit-log-path", c.AuditLog,
			"--audit-log-format", "json",
			"--audit-log-mode", "blocking",
			// Every apiserver appends to the one file; a rotation (100 MB
			// by default) by one of them would leave the other writing
			// to the renamed file, whose events the scenarios never read.
			"--audit-log-maxsize", "100000",
			"--profiling=false",
			"--kubelet-preferred-address-types", "InternalIP",
			"--v", "1",
		}
		as.args = append(as.args, c.kubeletClientArgs()...)
		if err := c.startAPIServer(ctx, as); err != nil {
			return err
		}
		c.mu.Lock()
		c.apiservers = append(c.apiservers, as)
		c.mu.Unlock()
	}
	if err := c.writeKubeconfig(c.path("kcm.kubeconfig"), "kcm", c.apiservers[0].URL); err != nil {
		return err
	}
	if err := c.writeKubeconfig(c.path("admin.kubeconfig"), "admin", c.apiservers[0].URL); err != nil {
		return err
	}
	c.AdminConfig = &rest.Config{
		Host: c.apiservers[0].URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile: c.path("ca.crt"), CertFile: c.path("admin.crt"), KeyFile: c.path("admin.key"),
		},
		Dial:      c.CP.DialContext,
		QPS:       200,
		Burst:     400,
		UserAgent: "sandbox-admin",
	}
	if c.Admin, err = kubernetes.NewForConfig(c.AdminConfig); err != nil {
		return err
	}
	_, err = c.start(c.CP, "kube-controller-manager",
		"--kubeconfig", c.path("kcm.kubeconfig"),
		"--authentication-kubeconfig", c.path("kcm.kubeconfig"),
		"--authorization-kubeconfig", c.path("kcm.kubeconfig"),
		"--controllers", c.controllers(),
		"--cluster-signing-cert-file", c.path("ca.crt"),
		"--cluster-signing-key-file", c.path("ca.key"),
		"--root-ca-file", c.path("ca.crt"),
		"--service-account-private-key-file", c.path("sa.key"),
		"--use-service-account-credentials",
		"--leader-elect=false",
		"--bind-address", "127.0.0.1",
		"--secure-port", "10257",
		"--v", "1",
	)
	return err
}

// startAPIServer starts (or restarts) one apiserver and waits for /readyz.
func (c *Cluster) startAPIServer(ctx context.Context, as *APIServer) error {
	p, err := c.start(c.CP, "kube-apiserver", as.args...)
	if err != nil {
		return err
	}
	p.Name = "kube-apiserver-" + as.Addr
	as.Process = p
	if err := c.waitHTTP(ctx, c.CP, as.URL+"/readyz", p); err != nil {
		return fmt.Errorf("kube-apiserver %s: %w", as.Addr, err)
	}
	return nil
}

// StopAPIServer stops one apiserver: SIGTERM, then SIGKILL if it has not
// exited within 30 seconds. It returns once the process is gone. The
// instance keeps its address and flags, so StartAPIServer can bring it back;
// its other instances and etcd keep running.
func (c *Cluster) StopAPIServer(as *APIServer) {
	if as.Process != nil {
		as.Process.Stop(30 * time.Second)
	}
}

// StartAPIServer starts a stopped apiserver again with the flags it first
// ran with, and waits until it answers /readyz (at most two minutes). It is
// an error to start an instance that is still running.
func (c *Cluster) StartAPIServer(ctx context.Context, as *APIServer) error {
	if as.Process != nil {
		if done, _ := as.Process.Exited(); !done {
			return fmt.Errorf("kube-apiserver %s is still running", as.Addr)
		}
	}
	return c.startAPIServer(ctx, as)
}

// APIServers returns the apiserver instances.
func (c *Cluster) APIServers() []*APIServer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*APIServer(nil), c.apiservers...)
}

// waitHTTP polls url from inside ns until it answers 200, p exits, or two
// minutes pass.
func (c *Cluster) waitHTTP(ctx context.Context, ns NetNS, url string, p *Process) error {
	client := c.httpClient(ns)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if done, err := p.Exited(); done {
			return false, fmt.Errorf("exited (%v): %s", err, tail(p.Log(), 15))
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			last = err
			return false, nil
		}
		resp.Body.Close()
		last = fmt.Errorf("GET %s: %s", url, resp.Status)
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return err
}

// httpClient returns a client that dials from inside ns and trusts the
// cluster CA (or any server, before the CA exists).
func (c *Cluster) httpClient(ns NetNS) *http.Client {
	tlsCfg, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAFile: c.path("ca.crt")}})
	if err != nil || tlsCfg == nil {
		panic(fmt.Sprintf("building TLS config: %v", err))
	}
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{DialContext: ns.DialContext, TLSClientConfig: tlsCfg, DisableKeepAlives: true},
	}
}

func (c *Cluster) writeKubeconfig(path, user, server string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["sandbox"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: c.path("ca.crt")}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: c.path(user + ".crt"), ClientKey: c.path(user + ".key")}
	cfg.Contexts["sandbox"] = &clientcmdapi.Context{Cluster: "sandbox", AuthInfo: user}
	cfg.CurrentContext = "sandbox"
	return clientcmd.WriteToFile(*cfg, path)
}

// bootstrap creates the Node and waits for what kube-controller-manager
// publishes: the default ServiceAccount and kube-root-ca.crt.
func (c *Cluster) bootstrap(ctx context.Context) error {
	if c.opts.RealNode {
		// The kubelet registers the node (StartRealNode).
		if err := c.waitForNamespaceReady(ctx, "default"); err != nil {
			return err
		}
		return c.applyRBAC(ctx)
	}
	if err := c.createNode(ctx, NodeName, nodeCPAddr); err != nil {
		return err
	}
	if err := c.waitForNamespaceReady(ctx, "default"); err != nil {
		return err
	}
	return c.applyRBAC(ctx)
}

// createNode creates a Ready Node object with address addr.
func (c *Cluster) createNode(ctx context.Context, name, addr string) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
	}
	if _, err := c.Admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	node, err := c.Admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Sandbox", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	_, err = c.Admin.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

// waitForNamespaceReady waits until kube-controller-manager has given ns its
// default ServiceAccount and kube-root-ca.crt.
func (c *Cluster) waitForNamespaceReady(ctx context.Context, ns string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if _, err := c.Admin.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := c.Admin.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	})
}

// WaitControllersWorking waits until kube-controller-manager acts on new
// objects again after the apiservers came back from being stopped: it
// creates a namespace and waits, up to controllersRecoveryTimeout, for its default
// ServiceAccount and kube-root-ca.crt, then deletes it. The controllers'
// watches broke with the apiservers and come back on their own backoff, so
// a scenario that restarts every apiserver calls this before the next
// scenario creates namespaces of its own.
func (c *Cluster) WaitControllersWorking(ctx context.Context) error {
	name := fmt.Sprintf("sandbox-probe-%d", time.Now().UnixNano())
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	ctx, cancel := context.WithTimeout(ctx, controllersRecoveryTimeout)
	defer cancel()
	// The apiservers answer /readyz before their RBAC has synced, which
	// may refuse even the admin for a moment: retry the create.
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := c.Admin.CoreV1().Namespaces().Create(ctx, obj, metav1.CreateOptions{})
		return err == nil || apierrors.IsAlreadyExists(err), nil
	})
	if err != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	defer func() {
		_ = c.Admin.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	}()
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if _, err := c.Admin.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := c.Admin.CoreV1().ConfigMaps(name).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("kube-controller-manager did not give namespace %s its ServiceAccount and kube-root-ca.crt within %s: %w", name, controllersRecoveryTimeout, err)
	}
	return nil
}

// controllersRecoveryTimeout bounds WaitControllersWorking. After every
// apiserver was down for a minute or two, kube-controller-manager's
// watches come back on their reflectors' backoff, and the first of them
// may meet an apiserver whose RBAC has not synced yet: it took 56 s on
// 1.37 and over a minute on 1.34 here.
const controllersRecoveryTimeout = 4 * time.Minute

// Stop kills every process and deletes every namespace. It is safe to call
// more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	procs, namespaces, realNode := c.procs, c.namespaces, c.realNode
	c.mu.Unlock()
	var errs []error
	if realNode != nil {
		// First, while the apiserver and the node namespace still exist.
		errs = append(errs, realNode.Stop())
	}
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(5 * time.Second)
	}
	for i := len(namespaces) - 1; i >= 0; i-- {
		if err := deleteNetNS(namespaces[i].Name()); err != nil {
			errs = append(errs, err)
		}
	}
	liveMu.Lock()
	delete(live, c)
	liveMu.Unlock()
	if os.Getenv("KUBE_APICACHE_KEEP_SANDBOX") == "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Logs returns the last lines of every process's log, for test failures.
func (c *Cluster) Logs(lines int) string {
	c.mu.Lock()
	procs := append([]*Process(nil), c.procs...)
	c.mu.Unlock()
	var s string
	for _, p := range procs {
		s += fmt.Sprintf("=== %s (pid %d) ===\n%s\n", p.Name, p.Pid(), tail(p.Log(), lines))
	}
	return s
}

// CompactEtcd compacts etcd's history up to revision rev (physically),
// through etcd's JSON gateway, as kube-apiserver's periodic compaction
// does: watches and reads of an older revision get 410 Gone from then on.
func (c *Cluster) CompactEtcd(ctx context.Context, rev uint64) error {
	body := fmt.Sprintf(`{"revision":"%d","physical":true}`, rev)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:2379/v3/kv/compaction", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.httpClient(c.CP).Do(req)
	if err != nil {
		return fmt.Errorf("compacting etcd at %d: %w", rev, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("compacting etcd at %d: %s: %s", rev, resp.Status, b)
	}
	return nil
}
