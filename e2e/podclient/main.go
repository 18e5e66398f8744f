// Command podclient is an ordinary in-cluster client-go program, run inside
// sandbox pods to exercise the API the way workloads do: it uses
// rest.InClusterConfig and nothing else.
//
//	podclient crud      create, get, list, update and delete a ConfigMap
//	podclient informer  run a ConfigMap informer; print SYNCED, then events
//	podclient load      read and write a ConfigMap in a loop until stopped;
//	                    print READY, FAIL lines, then a RESULT summary
//	podclient cachedreads  get and list a Service with resourceVersion 0 and N
//	                    in a loop until stopped; READY, FAIL lines, RESULT
//	podclient relists   run an informer that prints its LIST and WATCH calls
//	podclient informers run node-local informers (pods on this node, typed
//	                    and metadata-only, services, a custom resource);
//	                    print SYNCED, then their objects on each "dump"
//	podclient resetserver, attack, latency: the tenant attacks of the real
//	                    node (attack.go)
//	podclient servedby  connect to the Service VIP once a second and print
//	                    SERVEDBY and the common name of the certificate that
//	                    answered (the agent's, or kube-apiserver's)
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: podclient crud|informer [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	name := fs.String("name", "podclient", "ConfigMap name for crud")
	timeout := fs.Duration("timeout", 5*time.Minute, "exit after this long")
	interval := fs.Duration("interval", 20*time.Millisecond, "load: pause between requests")
	newConn := fs.Bool("new-conn", false, "load: open a new connection (HTTP/1.1) for every request")
	resource := fs.String("resource", "configmaps", "relists: services or configmaps")
	cr := fs.String("cr", "", "informers: also inform on this custom resource, as GROUP/VERSION/RESOURCE")
	protobuf := fs.Bool("protobuf", false, "informers: use protobuf for built-in types")
	endpointSlices := fs.Bool("endpointslices", false, "informers: also inform on the cluster's EndpointSlices")
	port := fs.Int("port", 8080, "resetserver: port to serve on")
	mode := fs.String("mode", "", "attack: proxyreset, idleconns or unread")
	count := fs.Int("count", 200, "attack: connections or requests; latency: reads")
	concurrency := fs.Int("concurrency", 20, "attack: workers, or connections opened at once")
	path := fs.String("path", "", "attack (proxyreset, unread) and latency: the request path")
	_ = fs.Parse(os.Args[2:])

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, *timeout)
	defer cancelT()

	cfg, err := rest.InClusterConfig()
	if err != nil {
		fail(err)
	}
	cfg.UserAgent = "podclient"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fail(err)
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		fail(err)
	}
	switch os.Args[1] {
	case "crud":
		err = crud(ctx, client, string(ns), *name)
	case "informer":
		err = informer(ctx, client, string(ns))
	case "load":
		err = load(ctx, cfg, string(ns), *name, *interval, *newConn)
	case "cachedreads":
		err = cachedReads(ctx, cfg, string(ns), *name, *interval)
	case "relists":
		err = countingInformer(ctx, client, string(ns), *resource)
	case "informers":
		err = nodeInformers(ctx, cfg, *cr, *protobuf, *endpointSlices)
	case "resetserver":
		err = resetServer(ctx, *port)
	case "attack":
		err = attack(ctx, cfg, attackOptions{mode: *mode, duration: *timeout, count: *count, concurrency: *concurrency, path: *path})
	case "latency":
		err = latency(ctx, cfg, *path, *count)
	case "servedby":
		err = servedBy(ctx, cfg)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

// servedBy dials the API as the in-cluster configuration says (the Service
// VIP), verifying the certificate as client-go does, and prints whose
// certificate answered, once a second until ctx ends.
func servedBy(ctx context.Context, cfg *rest.Config) error {
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return err
	}
	u, err := url.Parse(cfg.Host)
	if err != nil {
		return err
	}
	for {
		d := tls.Dialer{Config: tlsCfg}
		conn, err := d.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			fmt.Printf("FAIL %v\n", err)
		} else {
			certs := conn.(*tls.Conn).ConnectionState().PeerCertificates
			fmt.Printf("SERVEDBY %s\n", certs[0].Subject.CommonName)
			_ = conn.Close()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "podclient: %v\n", err)
	os.Exit(1)
}

func crud(ctx context.Context, client kubernetes.Interface, ns, name string) error {
	cms := client.CoreV1().ConfigMaps(ns)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": "v1"}}
	cm, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	fmt.Println("created", cm.Name, cm.ResourceVersion)
	got, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	list, err := cms.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	fmt.Println("listed", len(list.Items))
	got.Data["k"] = "v2"
	if got, err = cms.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	fmt.Println("updated", got.Name, got.Data["k"])
	if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	fmt.Println("deleted", name)
	return nil
}

func informer(ctx context.Context, client kubernetes.Interface, ns string) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().ConfigMaps().Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { fmt.Println("ADDED", obj.(*corev1.ConfigMap).Name) },
		UpdateFunc: func(_, obj any) {
			fmt.Println("UPDATED", obj.(*corev1.ConfigMap).Name)
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			fmt.Println("DELETED", obj.(*corev1.ConfigMap).Name)
		},
	})
	if err != nil {
		return err
	}
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("informer did not sync")
	}
	fmt.Println("SYNCED", len(inf.GetStore().List()))
	<-ctx.Done()
	f.Shutdown()
	return nil
}

// closeEach makes every request use a connection of its own.
type closeEach struct{ rt http.RoundTripper }

func (c closeEach) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Close = true
	return c.rt.RoundTrip(r)
}

// load alternates a read (get) and a write (merge patch) of one ConfigMap
// until ctx ends, each bounded by 3 seconds, and reports every failure and,
// at the end, the counts and the longest time between two successes.
func load(ctx context.Context, cfg *rest.Config, ns, name string, interval time.Duration, newConn bool) error {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 3 * time.Second
	cfg.QPS, cfg.Burst = 1000, 1000
	if newConn {
		cfg.NextProtos = []string{"http/1.1"}
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return closeEach{rt} }
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cms := client.CoreV1().ConfigMaps(ns)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"n": "0"}}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	fmt.Println("READY")
	var ok, failed, reads, writes, failedReads, failedWrites int
	var longest time.Duration
	last := time.Now()
	failing := false // failures since the last success
	for i := 0; ctx.Err() == nil; i++ {
		start := time.Now()
		var err error
		if i%2 == 0 {
			reads++
			_, err = cms.Get(ctx, name, metav1.GetOptions{})
		} else {
			writes++
			patch := fmt.Sprintf(`{"data":{"n":"%d"}}`, i)
			_, err = cms.Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		}
		switch {
		case err != nil && ctx.Err() != nil:
			// Stopped mid-request: not a failure of the path under test.
		case err != nil:
			failed++
			failing = true
			if i%2 == 0 {
				failedReads++
			} else {
				failedWrites++
			}
			fmt.Printf("FAIL at=%s after=%s err=%v\n", start.Format(time.RFC3339Nano), time.Since(start).Round(time.Millisecond), err)
		default:
			ok++
			now := time.Now()
			longest = max(longest, now.Sub(last))
			last, failing = now, false
		}
		select {
		case <-ctx.Done():
		case <-time.After(interval):
		}
	}
	if failing {
		// Still failing when stopped: that gap counts too.
		longest = max(longest, time.Since(last))
	}
	fmt.Printf("RESULT ok=%d failed=%d reads=%d writes=%d failed_reads=%d failed_writes=%d longest_gap_ms=%d\n",
		ok, failed, reads, writes, failedReads, failedWrites, longest.Milliseconds())
	return nil
}
