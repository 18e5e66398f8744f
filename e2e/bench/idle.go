package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"k8s.io/utils/ptr"

	"github.com/kube-apicache/kube-apicache/e2e/sandbox"
)

// The idle case leaves the agent alone, before any pod has read through
// it, and counts what it asks of kube-apiserver meanwhile (from the audit
// log: the agent's own requests, and the anonymous health probes from the
// node's address) and the watches it holds at the end. The sizing case
// measures the agent's heap per Service, per EndpointSlice and per
// endpoint, from objects it creates and then removes.
var (
	idleTime = flag.Duration("idle-time", 2*time.Minute, "how long the idle case leaves the agent alone (0 skips it)")
	sizingN  = flag.Int("sizing-objects", 500, "Services, and EndpointSlices of each size, the sizing case creates (0 skips it)")
)

const (
	idleCase   = "idle"
	sizingCase = "sizing"
	sizingNS   = "bench-sizing"
)

// idleResult is what the agent asked of kube-apiserver while idle.
type idleResult struct {
	took time.Duration
	// requests counts the agent's requests other than watches, and
	// watches the watches it opened, by "who verb what".
	requests, watches map[string]int
	// held are the watches open at the end.
	held []string
	// probes are the agent's own counts of /readyz probes meanwhile, by
	// reason (empty if the agent does not report them).
	probes map[string]float64
	// heap is the agent's live heap at the end, resident its resident
	// memory, and objects what its cache holds, by resource.
	heap, resident float64
	objects        map[string]float64
}

// idle runs the idle case, if selected, on an agent as the manifests run
// it (nothing pinned, detect-local from the node's pod IPs), then puts the
// bench's agent back with its caches synced.
func (b *bench) idle(ctx context.Context, agentBin string) (*idleResult, error) {
	if *idleTime <= 0 || !b.o.cases.MatchString(idleCase) {
		return nil, nil
	}
	if err := b.replaceAgent(ctx, agentBin, "--cache-pinned-resources=", "--detect-local-mode=PodIPs"); err != nil {
		return nil, err
	}
	res, err := b.measureIdle(ctx)
	if err != nil {
		return nil, err
	}
	if err := b.replaceAgent(ctx, agentBin); err != nil {
		return nil, err
	}
	if err := b.waitCached(ctx, "pods", b.o.nodePods); err != nil {
		return nil, err
	}
	return res, b.waitCached(ctx, "services", b.o.services)
}

// measureIdle leaves the agent alone for -idle-time and reads what it
// asked of kube-apiserver meanwhile.
func (b *bench) measureIdle(ctx context.Context) (*idleResult, error) {
	logf("leaving the agent idle for %v", *idleTime)
	// Let the start-up work (informer syncs, first probes) end.
	if err := sleep(ctx, 5*time.Second); err != nil {
		return nil, err
	}
	probes0, err := b.agentProbes(ctx)
	if err != nil {
		return nil, err
	}
	start, err := fileSize(b.c.AuditLog)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	if err := sleep(ctx, *idleTime); err != nil {
		return nil, err
	}
	// The log is written before each response; a watch that ends now is
	// in it a moment later.
	time.Sleep(500 * time.Millisecond)
	end, err := fileSize(b.c.AuditLog)
	if err != nil {
		return nil, err
	}
	res := &idleResult{took: time.Since(t0), requests: map[string]int{}, watches: map[string]int{}, probes: map[string]float64{}}
	probes1, err := b.agentProbes(ctx)
	if err != nil {
		return nil, err
	}
	for k, v := range probes1 {
		if d := v - probes0[k]; d > 0 {
			res.probes[k] = d
		}
	}
	if err := res.readAudit(b.c.AuditLog, start, end); err != nil {
		return nil, err
	}
	heap, err := b.agentHeap(ctx)
	if err != nil {
		return nil, err
	}
	res.heap = float64(heap)
	text, err := b.agent.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	res.resident = scrape(text, "process_resident_memory_bytes")["process_resident_memory_bytes"]
	res.objects = map[string]float64{}
	for k, v := range scrape(text, "kube_apicache_cache_objects") {
		res.objects[labelValue(k, "resource")] = v
	}
	return res, nil
}

// readAudit fills r from the audit log: requests that started between
// offsets start and end, and watches open at end.
func (r *idleResult) readAudit(path string, start, end int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	open := map[string]string{} // audit ID → description, of open watches
	counted := map[string]bool{}
	sc := bufio.NewScanner(io.LimitReader(f, end))
	sc.Buffer(make([]byte, 0, 1<<20), 16<<20)
	var offset int64
	for sc.Scan() {
		line := sc.Bytes()
		inWindow := offset >= start
		offset += int64(len(line)) + 1
		var ev auditv1.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			continue
		}
		who, ok := agentRequest(&ev)
		if !ok {
			continue
		}
		id := string(ev.AuditID)
		what := who + " " + strings.ToUpper(ev.Verb) + " " + describe(&ev)
		if ev.Verb == "watch" {
			switch ev.Stage {
			case auditv1.StageResponseStarted:
				open[id] = what
			case auditv1.StageResponseComplete, auditv1.StagePanic:
				delete(open, id)
			}
		}
		if !inWindow || counted[id] {
			continue
		}
		counted[id] = true
		if ev.Verb == "watch" {
			r.watches[what]++
		} else {
			r.requests[what]++
		}
	}
	for _, what := range open {
		r.held = append(r.held, what)
	}
	sort.Strings(r.held)
	return sc.Err()
}

// agentRequest reports whether ev is the agent's: made as its
// ServiceAccount, or sent from the node's address with no client behind
// it (the anonymous /readyz probes), and names who made it.
func agentRequest(ev *auditv1.Event) (string, bool) {
	if ev.User.Username == sandbox.AgentUsername() {
		if ev.ImpersonatedUser != nil {
			return "agent as " + ev.ImpersonatedUser.Username, true
		}
		return "agent", true
	}
	if len(ev.SourceIPs) == 1 && ev.SourceIPs[0] == sandbox.NodeIP {
		return ev.User.Username + " from the node", true
	}
	return "", false
}

// describe names a request's target: resource, namespace and selectors,
// or the path of a non-resource request.
func describe(ev *auditv1.Event) string {
	u, err := url.Parse(ev.RequestURI)
	if err != nil {
		return ev.RequestURI
	}
	if ev.ObjectRef == nil {
		return u.Path
	}
	s := ev.ObjectRef.Resource
	if ev.ObjectRef.APIGroup != "" {
		s += "." + ev.ObjectRef.APIGroup
	}
	if ev.ObjectRef.Subresource != "" {
		s += "/" + ev.ObjectRef.Subresource
	}
	if ev.ObjectRef.Namespace != "" {
		s += " -n " + ev.ObjectRef.Namespace
	}
	if ev.ObjectRef.Name != "" && ev.Verb != "watch" && ev.Verb != "list" {
		s += " " + ev.ObjectRef.Name
	}
	q := u.Query()
	for _, k := range []string{"fieldSelector", "labelSelector"} {
		if v := q.Get(k); v != "" {
			s += " " + k + "=" + v
		}
	}
	return s
}

// agentProbes reads the agent's /readyz probe counts by reason.
func (b *bench) agentProbes(ctx context.Context) (map[string]float64, error) {
	text, err := b.agent.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for k, v := range scrape(text, "kube_apicache_upstream_probes_total") {
		out[labelValue(k, "reason")+"/"+labelValue(k, "result")] += v
	}
	return out, nil
}

func (r *idleResult) print() {
	if r == nil {
		return
	}
	minutes := r.took.Minutes()
	sum := func(m map[string]int) int {
		n := 0
		for _, v := range m {
			n += v
		}
		return n
	}
	lines := func(m map[string]int) {
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Printf("    %s: %d\n", k, m[k])
		}
	}
	fmt.Printf("\nagent as shipped (nothing pinned, detect-local from pod IPs) idle for %v, before any pod read through it (kube-apiserver's audit log):\n", r.took.Round(time.Second))
	n := sum(r.requests)
	fmt.Printf("  requests beyond watches: %d, %.2f per minute\n", n, float64(n)/minutes)
	lines(r.requests)
	n = sum(r.watches)
	fmt.Printf("  watches opened or re-opened: %d, %.2f per minute\n", n, float64(n)/minutes)
	lines(r.watches)
	fmt.Printf("  watches held at the end: %d\n", len(r.held))
	for _, w := range r.held {
		fmt.Printf("    %s\n", w)
	}
	if len(r.probes) > 0 {
		var parts []string
		for k, v := range r.probes {
			parts = append(parts, fmt.Sprintf("%s: %.0f", k, v))
		}
		sort.Strings(parts)
		fmt.Printf("  the agent's /readyz probes by reason/result: %s\n", strings.Join(parts, ", "))
	}
	var objects []string
	for k, v := range r.objects {
		objects = append(objects, fmt.Sprintf("%s %.0f", k, v))
	}
	sort.Strings(objects)
	fmt.Printf("  the agent at the end: live heap %.1f MiB, resident %.1f MiB, caching %s\n",
		r.heap/(1<<20), r.resident/(1<<20), strings.Join(objects, ", "))
}

// sizingResult is the agent's live heap per object, in bytes.
type sizingResult struct {
	n int
	// perService and perSlice1 (slices of one endpoint) once synced, and
	// warm: after a JSON and a protobuf list through the agent.
	perService, perServiceWarm float64
	perSlice1, perSlice1Warm   float64
	// perEndpoint is the heap of one more endpoint in a slice, from slices
	// of one and of sliceEndpoints endpoints.
	perEndpoint, perEndpointWarm float64
}

// sliceEndpoints is the size of the larger EndpointSlices.
const sliceEndpoints = 20

// sizing runs the sizing case, if selected: it measures the agent's live
// heap (after a forced collection) before and after n Services, n
// EndpointSlices of one endpoint and n of sliceEndpoints endpoints, each
// once synced and once listed in JSON and protobuf through the agent, and
// removes them.
func (b *bench) sizing(ctx context.Context) (*sizingResult, error) {
	n := *sizingN
	if n <= 0 || !b.o.cases.MatchString(sizingCase) {
		return nil, nil
	}
	logf("measuring the agent's heap per Service, EndpointSlice and endpoint (%d of each)", n)
	cs, err := b.fastAdmin()
	if err != nil {
		return nil, err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sizingNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	defer func() {
		if err := cs.CoreV1().Namespaces().Delete(context.Background(), sizingNS, metav1.DeleteOptions{}); err != nil {
			logf("removing namespace %s: %v", sizingNS, err)
		}
	}()
	// The client pod may list EndpointSlices too, to have the agent answer
	// (and cache, where it caches on demand) them.
	if err := b.grantEndpointSlices(ctx); err != nil {
		return nil, err
	}
	m, err := newMeasurer(b)
	if err != nil {
		return nil, err
	}
	const (
		services = "services"
		slices   = "endpointslices.discovery.k8s.io"
	)
	paths := map[string]string{services: "/api/v1/services?resourceVersion=0", slices: "/apis/discovery.k8s.io/v1/endpointslices?resourceVersion=0"}
	listAll := func(resource string) error {
		for _, accept := range []string{"application/json", "application/vnd.kubernetes.protobuf"} {
			if err := m.agentGet(ctx, paths[resource], accept); err != nil {
				return err
			}
		}
		return nil
	}
	// step creates objects and returns the heap growth per object, synced
	// and warm.
	step := func(resource string, create func(context.Context, int) error) (cold, warm float64, err error) {
		if err := listAll(resource); err != nil {
			return 0, 0, err
		}
		objects, err := b.cachedObjects(ctx, resource)
		if err != nil {
			return 0, 0, err
		}
		h0, err := b.agentHeap(ctx)
		if err != nil {
			return 0, 0, err
		}
		if err := parallel(ctx, n, create); err != nil {
			return 0, 0, err
		}
		if err := b.waitCached(ctx, resource, int(objects)+n); err != nil {
			return 0, 0, err
		}
		h1, err := b.agentHeap(ctx)
		if err != nil {
			return 0, 0, err
		}
		if err := listAll(resource); err != nil {
			return 0, 0, err
		}
		h2, err := b.agentHeap(ctx)
		if err != nil {
			return 0, 0, err
		}
		return (float64(h1) - float64(h0)) / float64(n), (float64(h2) - float64(h0)) / float64(n), nil
	}
	r := &sizingResult{n: n}
	if r.perService, r.perServiceWarm, err = step(services, func(ctx context.Context, i int) error {
		_, err := cs.CoreV1().Services(sizingNS).Create(ctx, sizingService(i), metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	if r.perSlice1, r.perSlice1Warm, err = step(slices, func(ctx context.Context, i int) error {
		_, err := cs.DiscoveryV1().EndpointSlices(sizingNS).Create(ctx, sizingSlice(fmt.Sprintf("small-%04d", i), 1, i), metav1.CreateOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	big, bigWarm, err := step(slices, func(ctx context.Context, i int) error {
		_, err := cs.DiscoveryV1().EndpointSlices(sizingNS).Create(ctx, sizingSlice(fmt.Sprintf("large-%04d", i), sliceEndpoints, i), metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	r.perEndpoint = (big - r.perSlice1) / (sliceEndpoints - 1)
	r.perEndpointWarm = (bigWarm - r.perSlice1Warm) / (sliceEndpoints - 1)
	return r, nil
}

func (r *sizingResult) print() {
	if r == nil {
		return
	}
	fmt.Printf("\nagent heap per object (%d of each, live heap after a forced GC; warm: after a JSON and a protobuf list through the agent):\n", r.n)
	fmt.Printf("  Service: %.0f bytes synced, %.0f warm\n", r.perService, r.perServiceWarm)
	fmt.Printf("  EndpointSlice of 1 endpoint: %.0f bytes synced, %.0f warm\n", r.perSlice1, r.perSlice1Warm)
	fmt.Printf("  each further endpoint in a slice (slices of 1 and %d): %.0f bytes synced, %.0f warm\n", sliceEndpoints, r.perEndpoint, r.perEndpointWarm)
}

// sizingService is a ClusterIP Service as a chart would create it.
func sizingService(i int) *corev1.Service {
	name := fmt.Sprintf("sizing-svc-%04d", i)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "kube-apicache-bench"}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app.kubernetes.io/name": name},
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// sizingSlice is an EndpointSlice as the EndpointSlice controller writes
// one: endpoints with an address, conditions, node, zone and target pod.
func sizingSlice(name string, endpoints, i int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			discoveryv1.LabelServiceName: fmt.Sprintf("sizing-svc-%04d", i), discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for j := range endpoints {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 64+i/250, i%250, j+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("bench-node-%02d", j)),
			Zone:       ptr.To("zone-a"),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: sizingNS, Name: fmt.Sprintf("sizing-%04d-%02d", i, j), UID: "00000000-0000-0000-0000-000000000000"},
		})
	}
	return s
}

// grantEndpointSlices lets the client pod list EndpointSlices everywhere.
func (b *bench) grantEndpointSlices(ctx context.Context) error {
	const name = "bench-sizing-reader"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{discoveryv1.GroupName}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list"}}},
	}
	if _, err := b.c.Admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: b.client.Spec.ServiceAccount, Namespace: benchNS}},
	}
	if _, err := b.c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               b.client.Username(),
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + benchNS, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Group: discoveryv1.GroupName, Resource: "endpointslices"},
		}}
		res, err := b.c.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		return err == nil && res.Status.Allowed, nil
	})
}

// cachedObjects returns how many objects of resource the agent caches.
func (b *bench) cachedObjects(ctx context.Context, resource string) (float64, error) {
	var n float64
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		text, err := b.agent.Metrics(ctx)
		if err != nil {
			return false, nil
		}
		s := scrape(text, "kube_apicache_cache_synced", "kube_apicache_cache_objects")
		n = s[`kube_apicache_cache_objects{resource="`+resource+`"}`]
		return s[`kube_apicache_cache_synced{resource="`+resource+`"}`] == 1, nil
	})
	if err != nil {
		return 0, fmt.Errorf("waiting for the agent to cache %s: %w", resource, err)
	}
	return n, nil
}

// agentGet sends one GET of path through the agent as the client pod and
// reads the whole answer.
func (m *measurer) agentGet(ctx context.Context, path, accept string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.agentBase+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+m.b.client.Token)
	req.Header.Set("Accept", accept)
	resp, err := m.agentClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: HTTP %d", path, resp.StatusCode)
	}
	return err
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
