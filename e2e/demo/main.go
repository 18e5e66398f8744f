// Command demo starts the sandbox cluster and kube-apicache on its node, runs
// a sample pod that uses kubectl and a client-go program through the
// kubernetes Service VIP, and prints what the agent handled. It tears
// everything down on Ctrl-C, or after --duration.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

func main() {
	duration := flag.Duration("duration", 0, "stop after this long (0: run until Ctrl-C)")
	binDir := flag.String("bin-dir", sandbox.DefaultBinDir(), "directory holding etcd, kube-apiserver and kube-controller-manager")
	flag.Parse()
	if err := run(*duration, *binDir); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func run(duration time.Duration, binDir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tmp, err := os.MkdirTemp("", "kube-apicache-demo-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	step("Building kube-apicache and the sample client")
	bins, err := sandbox.BuildBinaries(tmp)
	if err != nil {
		return err
	}

	step("Starting etcd, kube-apiserver and kube-controller-manager in network namespaces")
	c, err := sandbox.Start(ctx, sandbox.Options{BinDir: binDir, Logf: func(f string, a ...any) { fmt.Printf("   "+f+"\n", a...) }})
	if err != nil {
		return err
	}
	defer func() {
		step("Tearing down the sandbox")
		if err := c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "demo: teardown: %v\n", err)
		}
	}()

	step("Starting kube-apicache on the node (hostNetwork pod with its own ServiceAccount)")
	agentPod, certFile, keyFile, err := c.NewAgentPod(ctx, "kube-apicache-demo")
	if err != nil {
		return err
	}
	agent, err := c.StartAgent(ctx, agentPod, bins.Agent, c.AgentArgs(certFile, keyFile)...)
	if err != nil {
		return err
	}
	defer agent.Process.Stop(40 * time.Second)
	nat, _, err := c.NodeNetState(ctx)
	if err != nil {
		return err
	}
	fmt.Println("   node nat rules now:")
	for _, l := range strings.Split(nat, "\n") {
		if strings.HasPrefix(l, "-A") {
			fmt.Println("     " + l)
		}
	}

	step("Creating a sample pod (namespace demo) with only its ServiceAccount volume")
	pod, err := c.NewPod(ctx, sandbox.PodSpec{Name: "sample", Namespace: "demo", ServiceAccount: "sample"})
	if err != nil {
		return err
	}
	if err := pod.Grant(ctx, "edit"); err != nil {
		return err
	}
	if err := pod.WaitAllowed(ctx, "create", "configmaps"); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"kubectl", "create", "configmap", "hello", "--from-literal=greeting=hi"},
		{"kubectl", "get", "configmaps"},
		{"kubectl", "delete", "configmap", "hello"},
		{bins.PodClient, "crud", "--name", "from-client-go"},
	} {
		fmt.Printf("   pod$ %s\n", strings.Join(append([]string{shortName(args[0])}, args[1:]...), " "))
		out, err := pod.Command(ctx, args[0], args[1:]...).CombinedOutput()
		for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			fmt.Println("     " + l)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", args[0], err)
		}
	}
	infCtx, stopInf := context.WithTimeout(ctx, 3*time.Second)
	fmt.Println("   pod$ podclient informer (3s)")
	out, _ := pod.Command(infCtx, bins.PodClient, "informer").CombinedOutput()
	stopInf()
	fmt.Println("     " + strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", "\n     "))

	step("Requests the agent handled (kube_apicache_requests_total)")
	text, err := agent.Metrics(ctx)
	if err != nil {
		return err
	}
	if err := printRequests(os.Stdout, text); err != nil {
		return err
	}

	if duration > 0 {
		step(fmt.Sprintf("Running for %s (sandbox in %s)", duration, c.Dir))
		select {
		case <-ctx.Done():
		case <-time.After(duration):
		}
	} else {
		step("Sandbox running in " + c.Dir + "; press Ctrl-C to tear down")
		<-ctx.Done()
	}
	return nil
}

func step(s string) { fmt.Printf("==> %s\n", s) }

func shortName(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

func printRequests(w io.Writer, metricsText string) error {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(metricsText))
	if err != nil {
		return err
	}
	var rows []string
	if f, ok := families["kube_apicache_requests_total"]; ok {
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			res := l["resource"]
			if res == "" {
				res = "(non-resource)"
			}
			rows = append(rows, fmt.Sprintf("   %-8s %-22s %-8s %-5s %4.0f", l["verb"], res, l["handler"], l["code"], m.GetCounter().GetValue()))
		}
	}
	sort.Strings(rows)
	fmt.Fprintf(w, "   %-8s %-22s %-8s %-5s %4s\n", "VERB", "RESOURCE", "HANDLER", "CODE", "N")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
	return nil
}
