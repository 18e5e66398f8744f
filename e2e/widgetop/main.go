// Command widgetop is a small operator for a Widget custom resource
// (widgets.example.com), run inside sandbox pods by the API rewriting
// end-to-end test. It knows only the original names: group example.com,
// kind Widget, labels and finalizers under example.com. Whatever renaming
// happens on the way to the API server must be invisible to it, and every
// step checks that it is.
//
//	widgetop install  create the CRD (a v1 and a v2 version, converted by
//	                  a webhook) and a ValidatingWebhookConfiguration, and
//	                  wait until both are in effect; print INSTALLED
//	widgetop serve    serve the validating and the conversion webhook over
//	                  HTTPS; print SERVING, then a line per review
//	widgetop run      run the controller and exercise the API through it,
//	                  step by step; print STEP, OK or FAIL per step, then
//	                  RESULT ok or RESULT failed
//
// Every event is one line on standard output, written at once. The program
// uses rest.InClusterConfig and nothing else; the namespace it works in is
// the one of its ServiceAccount. The lines, by subcommand:
//
//	install  CRD widgets.example.com created|exists
//	         ESTABLISHED widgets.example.com
//	         DISCOVERED example.com/v1 widgets
//	         WEBHOOKCONFIG <name> created|exists
//	         WEBHOOK effective after <n> attempts
//	         INSTALLED                     (exit 0)
//	         FAIL install: <error>         (exit 1)
//	serve    SERVING <listen address>
//	         ADMISSION <op> <group>/<version> <kind> <resource> <namespace>/<name>
//	         ADMISSION-LABELS <sorted keys, comma-separated, or ->
//	         ADMISSION-FINALIZERS <finalizers, comma-separated, or ->
//	         ADMISSION-RESULT allowed | ADMISSION-RESULT denied: <message>
//	         CONVERSION <desiredAPIVersion> <apiVersion/kind of each object, comma-separated>
//	         CONVERSION-FAILED <message>
//	         STOPPED                       (after SIGTERM or SIGINT; exit 0)
//	run      STEP <step>, then OK <step> <detail> or FAIL <step>: <error>
//	         CONTROLLER status|finalized|error ...  (at any time)
//	         RESULT ok (exit 0) | RESULT failed (exit 1)
//
// install and run also print `WARNING <text>` for each warning the API
// returns. A bad command line exits 2 with a message on standard error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
)

// The names the operator knows its API by.
const (
	group        = "example.com"
	kind         = "Widget"
	listKind     = "WidgetList"
	resource     = "widgets"
	crdName      = resource + "." + group
	webhookName  = "validate.widgets.example.com"
	finalizer    = "example.com/cleanup"
	fieldManager = "widgetop"
	// controllerManager is the field manager of the controller's writes,
	// kept apart from the applies of the run.
	controllerManager = "widgetop-controller"
	// namespaceFile is where every in-cluster client finds its namespace.
	namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
)

// errUsage marks a command line that could not be parsed.
var errUsage = errors.New("usage")

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: widgetop install|serve|run [flags]")
		os.Exit(2)
	}
	os.Exit(dispatch(os.Args[1], os.Args[2:]))
}

// dispatch runs the subcommand with its arguments and returns the exit
// code: 0 on success, 1 on failure, 2 on a bad command line.
func dispatch(cmd string, args []string) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	var err error
	switch cmd {
	case "install":
		err = installMain(ctx, args)
	case "serve":
		err = serveMain(ctx, args)
	case "run":
		err = runMain(ctx, args)
	default:
		fmt.Fprintf(os.Stderr, "widgetop: unknown subcommand %q (want install, serve or run)\n", cmd)
		return 2
	}
	switch {
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "widgetop %s: %v\n", cmd, err)
		return 2
	case err != nil:
		return 1
	}
	return 0
}

// installMain parses the flags of `widgetop install` and runs it.
func installMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	var o installOptions
	fs.StringVar(&o.conversionURL, "conversion-url", "", "URL of the CRD conversion webhook (https)")
	fs.StringVar(&o.webhookURL, "webhook-url", "", "URL of the validating admission webhook (https)")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM file of the CA that signed both webhooks' certificates")
	fs.StringVar(&o.configName, "webhook-config-name", "", "name of the ValidatingWebhookConfiguration")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if o.conversionURL == "" || o.webhookURL == "" || o.caFile == "" || o.configName == "" {
		return fmt.Errorf("%w: --conversion-url, --webhook-url, --ca-file and --webhook-config-name are required", errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	err := install(ctx, o)
	if err != nil {
		sayf("FAIL install: %v", err)
		return err
	}
	say("INSTALLED")
	return nil
}

// serveMain parses the flags of `widgetop serve` and serves until a
// signal.
func serveMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", ":8443", "address to serve HTTPS on")
	cert := fs.String("cert", "", "PEM file of the serving certificate")
	key := fs.String("key", "", "PEM file of the serving certificate's key")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *cert == "" || *key == "" {
		return fmt.Errorf("%w: --cert and --key are required", errUsage)
	}
	if err := serve(ctx, *listen, *cert, *key); err != nil {
		sayf("FAIL serve: %v", err)
		return err
	}
	return nil
}

// runMain parses the flags of `widgetop run` and runs the operator's
// steps.
func runMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	prefix := fs.String("name", "", "prefix of the names of the objects the run creates")
	timeout := fs.Duration("timeout", 3*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *prefix == "" {
		return fmt.Errorf("%w: --name is required", errUsage)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	return run(ctx, *prefix)
}

// inCluster returns the in-cluster client configuration and the
// namespace of the pod's ServiceAccount.
func inCluster() (*rest.Config, string, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading the in-cluster config: %w", err)
	}
	cfg.UserAgent = "widgetop"
	cfg.WarningHandler = warningPrinter{}
	ns, err := os.ReadFile(namespaceFile)
	if err != nil {
		return nil, "", fmt.Errorf("reading the ServiceAccount namespace: %w", err)
	}
	if strings.TrimSpace(string(ns)) == "" {
		return nil, "", fmt.Errorf("the ServiceAccount namespace file %s is empty", namespaceFile)
	}
	return cfg, strings.TrimSpace(string(ns)), nil
}

// warningPrinter prints each warning the API returns (the admission
// webhook's among them) as `WARNING <text>`.
type warningPrinter struct{}

// HandleWarningHeader prints the warning; the code (always 299) and the
// agent are left out.
func (warningPrinter) HandleWarningHeader(_ int, _ string, text string) {
	sayf("WARNING %s", text)
}

// stdoutMu keeps the lines of concurrent writers (webhook handlers, the
// controller and the steps of a run) from interleaving.
var stdoutMu sync.Mutex

// say writes lines to standard output in a single write. A line's own
// line breaks become spaces, so that each event stays one line.
func say(lines ...string) {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(l))
		b.WriteByte('\n')
	}
	stdoutMu.Lock()
	defer stdoutMu.Unlock()
	_, _ = os.Stdout.WriteString(b.String())
}

// sayf writes one formatted line to standard output.
func sayf(format string, args ...any) {
	say(fmt.Sprintf(format, args...))
}
