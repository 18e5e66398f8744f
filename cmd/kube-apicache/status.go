package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/agent/status"
)

type statusOptions struct {
	kubeconfig string
	context    string
	namespace  string
	selector   string
	node       string
	port       string
	// serviceAccount is the ServiceAccount, in namespace, whose short-lived
	// token is shown to the agents.
	serviceAccount string
	output         string
	timeout        time.Duration
	parallelism    int
}

// newStatusCommand returns `kube-apicache status`, which asks every agent
// pod for its state through kube-apiserver's pods proxy and prints one
// line per node.
func newStatusCommand() *cobra.Command {
	o := &statusOptions{}
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print each node's agent: interception, readiness, cache hit ratio, upstream health",
		Long: `status lists the agent pods and asks each for its state (` + status.StatuszPath + ` on its
metrics port) through kube-apiserver's pods proxy. /statusz, like the z-pages
of Kubernetes components, answers only callers RBAC allows, and the pods
proxy does not pass the caller's credentials on: so status requests a
ten-minute token of the ServiceAccount --service-account (in --namespace;
it may read /statusz and nothing else) and sends it in the
` + status.TokenHeader + ` header. The kubeconfig's user needs list pods,
get pods/proxy and create serviceaccounts/token on that ServiceAccount in
the agents' namespace: the Role kube-apicache:status-user. It prints a
line per node: whether the agent intercepts (and why not; "host-network
only" while it cannot list its node's pods, whose traffic then goes to
kube-proxy's path), whose identity lists the node's pods (PODS: node,
agent, none), whether it is ready, its cache hit ratio since it started, its kube-apiserver endpoints'
health and when its serving certificate expires. --node keeps to one
node's agent.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.output != "" && o.output != "json" && o.output != "wide" {
				return fmt.Errorf("--output %q: must be empty, wide or json", o.output)
			}
			if err := validNodeFlag(o.node); err != nil {
				return err
			}
			cfg, err := callerConfig(o.kubeconfig, o.context, "kube-apicache-status")
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			rows, err := o.collect(ctx, client)
			if err != nil {
				return err
			}
			return o.print(cmd.OutOrStdout(), rows)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: $KUBECONFIG or ~/.kube/config.")
	fs.StringVar(&o.context, "context", "", "kubeconfig context; empty: the current one.")
	fs.StringVarP(&o.namespace, "namespace", "n", "kube-apicache", "Namespace of the agent pods.")
	fs.StringVarP(&o.selector, "selector", "l", "app.kubernetes.io/name=kube-apicache", "Label selector of the agent pods.")
	fs.StringVar(&o.node, "node", "", "Only the agent on this node; empty: every node.")
	fs.StringVar(&o.port, "port", "metrics", "Name or number of the agent container's metrics port.")
	fs.StringVar(&o.serviceAccount, "service-account", "kube-apicache-status", "ServiceAccount in --namespace whose short-lived token is sent to the agents; it must be allowed to get /statusz.")
	fs.StringVarP(&o.output, "output", "o", "", "Output: empty for a table, wide for the table with upstream endpoints, or json.")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Minute, "Time for the whole command.")
	fs.IntVar(&o.parallelism, "parallelism", 20, "Agents asked at once.")
	return cmd
}

// statusRow is one agent pod: its Status, or why it could not be read.
type statusRow struct {
	Pod    string         `json:"pod"`
	Node   string         `json:"node"`
	Status *status.Status `json:"status,omitempty"`
	Error  string         `json:"error,omitempty"`
}

func (o *statusOptions) collect(ctx context.Context, client kubernetes.Interface) ([]statusRow, error) {
	opts := metav1.ListOptions{LabelSelector: o.selector}
	if o.node != "" {
		opts.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", o.node).String()
	}
	pods, err := client.CoreV1().Pods(o.namespace).List(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("listing the agent pods: %w", err)
	}
	if o.node != "" {
		// kube-apiserver applies the field selector; this keeps the
		// answer right with a client that does not.
		pods.Items = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool { return p.Spec.NodeName != o.node })
	}
	if len(pods.Items) == 0 {
		if o.node != "" {
			return nil, fmt.Errorf("no pod in namespace %s matches %s on node %s", o.namespace, o.selector, o.node)
		}
		return nil, fmt.Errorf("no pod in namespace %s matches %s", o.namespace, o.selector)
	}
	token, err := o.statusToken(ctx, client)
	if err != nil {
		return nil, err
	}
	rows := make([]statusRow, len(pods.Items))
	sem := make(chan struct{}, max(o.parallelism, 1))
	var wg sync.WaitGroup
	for i := range pods.Items {
		p := &pods.Items[i]
		rows[i] = statusRow{Pod: p.Name, Node: p.Spec.NodeName}
		if p.Status.Phase != corev1.PodRunning {
			rows[i].Error = "pod " + string(p.Status.Phase)
			continue
		}
		port, err := podPort(p, o.port)
		if err != nil {
			rows[i].Error = err.Error()
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			body, err := client.CoreV1().RESTClient().Get().
				Namespace(o.namespace).Resource("pods").SubResource("proxy").
				Name(net.JoinSchemeNamePort("https", p.Name, port)).Suffix(status.StatuszPath).
				SetHeader(status.TokenHeader, token).DoRaw(rctx)
			if err != nil {
				rows[i].Error = oneLine(err)
				return
			}
			var s status.Status
			if err := json.Unmarshal(body, &s); err != nil {
				rows[i].Error = "unreadable status: " + oneLine(err)
				return
			}
			rows[i].Status = &s
		})
	}
	wg.Wait()
	slices.SortFunc(rows, func(a, b statusRow) int { return strings.Compare(a.Node, b.Node) })
	return rows, nil
}

// statusTokenSeconds is the life of the token status shows the agents:
// the shortest kube-apiserver issues, and longer than any run.
const statusTokenSeconds = 600

// statusToken requests a short-lived token of o.serviceAccount. The
// caller's own credentials never leave for the agents: kube-apiserver's
// pods proxy would not pass them on, and a token that may read /statusz
// alone is all an agent need see.
func (o *statusOptions) statusToken(ctx context.Context, client kubernetes.Interface) (string, error) {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](statusTokenSeconds)}}
	tr, err := client.CoreV1().ServiceAccounts(o.namespace).CreateToken(ctx, o.serviceAccount, tr, metav1.CreateOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("requesting a token of ServiceAccount %s/%s, which /statusz is shown: it does not exist (manifests/serviceaccount.yaml; or pass --service-account)", o.namespace, o.serviceAccount)
	case apierrors.IsForbidden(err):
		return "", fmt.Errorf("requesting a token of ServiceAccount %s/%s, which /statusz is shown: %w (bind the Role kube-apicache:status-user in %s to your user)", o.namespace, o.serviceAccount, err, o.namespace)
	case err != nil:
		return "", fmt.Errorf("requesting a token of ServiceAccount %s/%s: %w", o.namespace, o.serviceAccount, err)
	}
	return tr.Status.Token, nil
}

// podPort resolves port, a container port's name or number, to a number:
// kube-apiserver's pods proxy takes only numbers.
func podPort(p *corev1.Pod, port string) (string, error) {
	if _, err := strconv.ParseUint(port, 10, 16); err == nil {
		return port, nil
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == port {
				return strconv.Itoa(int(cp.ContainerPort)), nil
			}
		}
	}
	return "", fmt.Errorf("pod %s has no container port named %q", p.Name, port)
}

func (o *statusOptions) print(w io.Writer, rows []statusRow) error {
	if o.output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "NODE\tPOD\tINTERCEPTING\tPODS\tREADY\tHIT RATIO\tUPSTREAM\tCERT EXPIRES\tREASON"
	if o.output == "wide" {
		head += "\tENDPOINTS"
	}
	fmt.Fprintln(tw, head)
	var intercepting, hostOnly, unreachable int
	for _, r := range rows {
		if r.Status == nil {
			fmt.Fprintf(tw, "%s\t%s\t?\t?\t?\t?\t?\t?\t%s\n", r.Node, r.Pod, r.Error)
			unreachable++
			continue
		}
		s := r.Status
		interceptingCell := yesNo(s.Intercepting)
		if s.Intercepting {
			intercepting++
		}
		if s.Intercepting && s.HostNetworkOnly {
			// Never "yes" while no pod's traffic is redirected.
			interceptingCell = "host-network only"
			hostOnly++
		}
		reason := s.InterceptingReason
		if s.Intercepting && s.PodsSource != "node" && s.PodsSourceReason != "" {
			reason = "pods source " + s.PodsSource + ": " + s.PodsSourceReason
		}
		if s.ReadyReason != "" {
			reason = "not ready: " + s.ReadyReason
		}
		pods := s.PodsSource
		if pods == "" {
			pods = "-"
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", r.Node, r.Pod, interceptingCell, pods, yesNo(s.Ready),
			hitRatio(s.Cache), upstreamSummary(s.Upstreams), certExpiry(s.CertificateNotAfter), reason)
		if o.output == "wide" {
			var eps []string
			for _, u := range s.Upstreams {
				eps = append(eps, u.Endpoint+"="+map[bool]string{true: "healthy", false: "unhealthy"}[u.Healthy])
			}
			line += "\t" + strings.Join(eps, ",")
		}
		fmt.Fprintln(tw, line)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	summary := fmt.Sprintf("%d agents: %d intercepting, %d not, %d not answering",
		len(rows), intercepting, len(rows)-intercepting-unreachable, unreachable)
	if hostOnly > 0 {
		summary += fmt.Sprintf("; %d of them host-network traffic only, their node's pods not listed", hostOnly)
	}
	_, err := fmt.Fprintln(w, summary)
	return err
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// hitRatio is hits over the reads the cache considered, or "-" before any.
func hitRatio(cache map[string]float64) string {
	var total float64
	for _, n := range cache {
		total += n
	}
	if total == 0 {
		return "-"
	}
	return strconv.FormatFloat(100*cache["hit"]/total, 'f', 1, 64) + "%"
}

// upstreamSummary is "healthy/all" endpoints.
func upstreamSummary(ups []status.UpstreamStatus) string {
	healthy := 0
	for _, u := range ups {
		if u.Healthy {
			healthy++
		}
	}
	return fmt.Sprintf("%d/%d healthy", healthy, len(ups))
}

func certExpiry(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return "in " + time.Until(*t).Round(time.Minute).String()
}

// validNodeFlag checks a --node value: empty, or a Node's name.
func validNodeFlag(node string) error {
	if node == "" {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return fmt.Errorf("--node %q: %s", node, strings.Join(errs, "; "))
	}
	return nil
}

// callerConfig loads the caller's client configuration as kubectl does
// (--kubeconfig, $KUBECONFIG, ~/.kube/config, in-cluster), with context
// if set, under userAgent.
func callerConfig(kubeconfig, context, userAgent string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("client configuration: %w", err)
	}
	cfg.UserAgent = userAgent
	return cfg, nil
}
