package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kube-apicache/kube-apicache/agent/interception"
	"github.com/kube-apicache/kube-apicache/internal/apidiff"
)

// agentServerName is the name diff verifies an agent's certificate for:
// one of the kubernetes Service names every serving certificate carries
// (identity.ServingSANs), whatever address the agent is dialled at.
const agentServerName = "kubernetes.default.svc"

// maxShown bounds the differences diff prints.
const maxShown = 50

type diffOptions struct {
	kubeconfig string
	context    string
	apiserver  string
	agent      string
	agentCA    string
	node       string
	namespace  string
	selector   string
	port       string
	accept     string
	timeout    time.Duration
}

// exitError ends the process with code, after printing err when there is
// one.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// Exit codes of diff.
const (
	diffDifferent = 1 // the answers differ
	diffTrouble   = 2 // usage, configuration or transport error
)

func diffTroubleError(err error) error { return &exitError{code: diffTrouble, err: err} }

// newDiffCommand returns `kube-apicache diff`, which sends one read to an
// agent and to kube-apiserver with the caller's credentials and prints
// where the answers differ.
func newDiffCommand() *cobra.Command {
	o := &diffOptions{}
	cmd := &cobra.Command{
		Use:   "diff [flags] PATH",
		Short: "Send one read through an agent and straight to kube-apiserver; show the difference",
		Long: `diff sends the same GET (PATH as for kubectl get --raw, with its query, for
example /api/v1/namespaces/default/pods?labelSelector=app=web) to an agent
and straight to kube-apiserver, with the same credentials and headers, and
prints where the answers differ: the status code, or each JSON path whose
values differ (items[default/web-1].metadata.labels.app: agent "x" direct
"y"). Exit status: 0 no difference, 1 different, 2 a usage, configuration
or transport error.

The credentials are the kubeconfig's (--kubeconfig, $KUBECONFIG,
~/.kube/config, else the in-cluster ServiceAccount): a bearer token or an
exec plugin's token. A client certificate is refused: the agent cannot pass
it on, and answers such callers itself (401, or 429 to retry past it). The
agent's certificate is verified against --agent-ca-file, by default the CA
the kubeconfig trusts for kube-apiserver, for the name ` + agentServerName + `;
it must be the cluster CA the pods trust (kube-root-ca.crt), since the
credentials go to the agent.

Where to run it: the agent listens on its --listen-address, ` + interception.DefaultListenAddress + `
by default, which only its own node reaches. On the node, the default --agent
is that address, and the kubeconfig must name a kube-apiserver address
other than the kubernetes Service VIP, which the agent intercepts there.
In a pod on that node, the in-cluster address (the VIP) IS the agent: run
diff --agent https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
--apiserver https://<endpoint>, an address from the default/kubernetes
EndpointSlice. --node NAME reaches the agent on NAME at its pod IP, which
answers only with --dataplane=external (the agent then listens on every
address).

Rules: a list (or Table) is compared item by item, keyed by namespace/name:
an item on one side only, a differing field within an item, and a
different order are differences. The list's own resourceVersion is each
read's and is only noted. A Table's Age cells are not compared; any other
object is compared as a whole. When a difference lies in an object whose
resourceVersion differs between the answers, or in an item one answer
lacks, it may be a change made between the two reads: both are read once
more, and the output says so. Watches are not compared. Whether the agent
answered from its cache or forwarded the read, its
kube_apicache_cache_requests_total{outcome} tells; the answer does not.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return diffTroubleError(fmt.Errorf("diff takes one PATH, got %d arguments", len(args)))
			}
			return nil
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.node != "" && cmd.Flags().Changed("agent") {
				return diffTroubleError(errors.New("--agent and --node name the agent both: give one"))
			}
			err := o.run(cmd.Context(), cmd.OutOrStdout(), args[0])
			var ee *exitError
			if err != nil && !errors.As(err, &ee) {
				err = diffTroubleError(err)
			}
			return err
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return diffTroubleError(err) })
	fs := cmd.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: $KUBECONFIG or ~/.kube/config, else the in-cluster configuration.")
	fs.StringVar(&o.context, "context", "", "kubeconfig context; empty: the current one.")
	fs.StringVar(&o.apiserver, "apiserver", "", "kube-apiserver URL (https://host:port) to send the direct request to; empty: the kubeconfig's server. Its certificate is verified as the kubeconfig says.")
	fs.StringVar(&o.agent, "agent", "https://"+interception.DefaultListenAddress, "The agent's URL (https://host:port). The default is the agent's default listen address on this node.")
	fs.StringVar(&o.agentCA, "agent-ca-file", "", "CA bundle to verify the agent's certificate with (the cluster CA, as in kube-root-ca.crt); empty: the kubeconfig's certificate authority.")
	fs.StringVar(&o.node, "node", "", "Send the agent's request to the agent pod on this node, at its pod IP and --port, instead of --agent.")
	fs.StringVarP(&o.namespace, "namespace", "n", "kube-apicache", "Namespace of the agent pods, for --node.")
	fs.StringVarP(&o.selector, "selector", "l", "app.kubernetes.io/name=kube-apicache", "Label selector of the agent pods, for --node.")
	fs.StringVar(&o.port, "port", "apicache", "Name or number of the agent container's serving port, for --node.")
	fs.StringVar(&o.accept, "accept", "application/json", "Accept header of both requests: JSON by default; application/json;as=Table;v=v1;g=meta.k8s.io for a Table, application/vnd.kubernetes.protobuf for protobuf (built-in types, compared decoded).")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "Time for the whole command.")
	return cmd
}

// run does the work of diff: it returns an *exitError, or another error
// for a trouble.
func (o *diffOptions) run(ctx context.Context, w io.Writer, rawPath string) error {
	reqPath, err := parseDiffPath(rawPath)
	if err != nil {
		return err
	}
	if err := validNodeFlag(o.node); err != nil {
		return err
	}
	cfg, err := callerConfig(o.kubeconfig, o.context, "kube-apicache-diff")
	if err != nil {
		return err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	direct, agent, err := o.configs(ctx, cfg)
	if err != nil {
		return err
	}
	directClient, err := rest.HTTPClientFor(direct)
	if err != nil {
		return fmt.Errorf("direct client: %w", err)
	}
	agentClient, err := rest.HTTPClientFor(agent)
	if err != nil {
		return fmt.Errorf("agent client: %w", err)
	}
	targets := [2]diffTarget{
		{name: "agent", base: agent.Host, client: agentClient},
		{name: "direct", base: direct.Host, client: directClient},
	}

	res, answers, err := o.compareOnce(ctx, targets, reqPath)
	if err != nil {
		return err
	}
	first := res
	retried := res.Changed()
	if retried {
		if res, answers, err = o.compareOnce(ctx, targets, reqPath); err != nil {
			return err
		}
	}
	printDiff(w, reqPath, targets, answers, res, first, retried)
	if len(res.Differences) > 0 {
		return &exitError{code: diffDifferent}
	}
	return nil
}

// parseDiffPath checks PATH: an absolute path with an optional query, and
// no watch.
func parseDiffPath(raw string) (string, error) {
	if !strings.HasPrefix(raw, "/") {
		return "", fmt.Errorf("PATH %q: must start with / (as for kubectl get --raw)", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("PATH %q: %w", raw, errors.Unwrap(err))
	}
	q := u.Query()
	if w := strings.ToLower(q.Get("watch")); w == "true" || w == "1" || slices.Contains(strings.Split(u.Path, "/"), "watch") {
		return "", fmt.Errorf("PATH %q: watches are not compared; diff the list instead (add resourceVersion=N to compare at one version)", raw)
	}
	return u.RequestURI(), nil
}

// configs derives the two clients' configurations from cfg: the same
// credentials, each with its own address and server verification.
func (o *diffOptions) configs(ctx context.Context, cfg *rest.Config) (direct, agent *rest.Config, err error) {
	if cfg.CertFile != "" || len(cfg.CertData) > 0 {
		return nil, nil, errors.New("the kubeconfig's user presents a client certificate, which the agent cannot pass on (it answers such callers itself): use a token, such as one from kubectl create token")
	}
	direct = rest.CopyConfig(cfg)
	if o.apiserver != "" {
		if err := checkHTTPSURL("--apiserver", o.apiserver); err != nil {
			return nil, nil, err
		}
		direct.Host = o.apiserver
	} else if svc := inClusterService(); svc != "" && hostOf(direct.Host) == svc {
		return nil, nil, fmt.Errorf("the kubeconfig's server %s is the kubernetes Service, which the agent intercepts on this node: set --apiserver to a kube-apiserver endpoint (kubectl get endpointslices -n default -l kubernetes.io/service-name=kubernetes)", direct.Host)
	}

	agentURL := o.agent
	if o.node != "" {
		if agentURL, err = o.nodeAgent(ctx, direct); err != nil {
			return nil, nil, err
		}
	}
	if err := checkHTTPSURL("--agent", agentURL); err != nil {
		return nil, nil, err
	}
	agent = rest.CopyConfig(cfg)
	agent.Host = agentURL
	agent.Insecure = false
	agent.ServerName = agentServerName
	if o.agentCA != "" {
		agent.CAFile, agent.CAData = o.agentCA, nil
	} else if agent.CAFile == "" && len(agent.CAData) == 0 {
		return nil, nil, errors.New("the kubeconfig names no certificate authority to verify the agent with: set --agent-ca-file to the cluster CA (kubectl get configmap kube-root-ca.crt -o jsonpath='{.data.ca\\.crt}')")
	}
	if hostOf(agent.Host) == hostOf(direct.Host) {
		return nil, nil, fmt.Errorf("the agent and kube-apiserver are the same address %s", hostOf(direct.Host))
	}
	return direct, agent, nil
}

func checkHTTPSURL(flag, s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("%s %q: must be https://host[:port]", flag, s)
	}
	return nil
}

// inClusterService is the kubernetes Service's host:port as the kubelet
// gives it to pods, or empty outside a pod.
func inClusterService() string {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return ""
	}
	return net.JoinHostPort(host, port)
}

// hostOf is the host:port of an https URL, with the default port made
// explicit.
func hostOf(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return u.Host
}

// nodeAgent finds the agent pod on o.node and returns its serving URL.
func (o *diffOptions) nodeAgent(ctx context.Context, cfg *rest.Config) (string, error) {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	pods, err := client.CoreV1().Pods(o.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: o.selector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", o.node).String(),
	})
	if err != nil {
		return "", fmt.Errorf("listing the agent pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != o.node || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			continue
		}
		port, err := podPort(p, o.port)
		if err != nil {
			return "", err
		}
		return "https://" + net.JoinHostPort(p.Status.PodIP, port), nil
	}
	return "", fmt.Errorf("no running pod in namespace %s matches %s on node %s", o.namespace, o.selector, o.node)
}

// diffTarget is one of the two places the request goes.
type diffTarget struct {
	name   string
	base   string
	client *http.Client
}

// compareOnce sends the request to both targets at once and compares the
// answers.
func (o *diffOptions) compareOnce(ctx context.Context, targets [2]diffTarget, reqPath string) (apidiff.Result, [2]apidiff.Response, error) {
	var answers [2]apidiff.Response
	var errs [2]error
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() { answers[i], errs[i] = o.get(ctx, t, reqPath) })
	}
	wg.Wait()
	if err := errors.Join(errs[0], errs[1]); err != nil {
		return apidiff.Result{}, answers, err
	}
	return apidiff.Compare(answers[0], answers[1]), answers, nil
}

// get sends GET reqPath to t.
func (o *diffOptions) get(ctx context.Context, t diffTarget, reqPath string) (apidiff.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(t.base, "/")+reqPath, nil)
	if err != nil {
		return apidiff.Response{}, fmt.Errorf("%s: %w", t.name, err)
	}
	req.Header.Set("Accept", o.accept)
	resp, err := t.client.Do(req)
	if err != nil {
		if cve := (*tls.CertificateVerificationError)(nil); t.name == "agent" && errors.As(err, &cve) {
			return apidiff.Response{}, fmt.Errorf("agent: %w (its certificate must verify against --agent-ca-file, the cluster CA, for %s)", err, agentServerName)
		}
		return apidiff.Response{}, fmt.Errorf("%s: %w", t.name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return apidiff.Response{}, fmt.Errorf("%s: reading the answer: %w", t.name, err)
	}
	return apidiff.Response{Code: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"), Body: body}, nil
}

// printDiff writes the report: each side's answer, the notes, then the
// differences or "no difference".
func printDiff(w io.Writer, reqPath string, targets [2]diffTarget, answers [2]apidiff.Response, res, first apidiff.Result, retried bool) {
	fmt.Fprintf(w, "GET %s\n", reqPath)
	items := [2]int{res.AgentItems, res.DirectItems}
	for i, t := range targets {
		line := fmt.Sprintf("%-7s %s: %d %s, %d bytes", t.name, t.base, answers[i].Code, answers[i].ContentType, len(answers[i].Body))
		if items[i] >= 0 {
			line += fmt.Sprintf(", %d items", items[i])
		}
		fmt.Fprintln(w, line)
	}
	if retried {
		fmt.Fprintf(w, "read twice: the first answers had %s in objects changed between the two reads (resourceVersions differ) or present on one side only\n",
			plural(len(first.Differences), "difference"))
	}
	for _, n := range res.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(res.Differences) == 0 {
		fmt.Fprintln(w, "no difference")
		return
	}
	fmt.Fprintf(w, "%s (agent, then direct):\n", plural(len(res.Differences), "difference"))
	for i, d := range res.Differences {
		if i == maxShown {
			fmt.Fprintf(w, "  ... and %d more\n", len(res.Differences)-maxShown)
			break
		}
		line := fmt.Sprintf("  %s: agent %s direct %s", d.Path, d.Agent, d.Direct)
		if d.Changed {
			line += " (object changed between the reads?)"
		}
		fmt.Fprintln(w, line)
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
