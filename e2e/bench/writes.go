package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The "writes" case measures writes the agent forwards: the client pod,
// with its own token, creates, updates, patches and deletes ConfigMaps in
// its namespace (not cached: every write is forwarded, as every write is)
// through the Service VIP and straight to kube-apiserver. The objects,
// their sizes and the order are the same along both paths: blocks of
// -write-block objects, each block going through the four verbs in turn,
// alternate between the paths, and the first path of each round
// alternates too.
var (
	writeRequests = flag.Int("write-requests", 500, "measured requests per verb and path of the \""+writesCase+"\" case (0 skips it)")
	writeBlock    = flag.Int("write-block", 50, "objects per block of the \""+writesCase+"\" case: blocks alternate between the agent and direct")
)

const (
	writesCase = "writes"
	// writeP50Target is the most a forwarded write may take at p50, as a
	// multiple of the same write sent directly.
	writeP50Target = 1.10
	// writePayload is the size of each ConfigMap's data value.
	writePayload = 1024
)

// writeVerbs are the verbs of the writes case, in the order each block
// goes through them.
var writeVerbs = []string{"create", "update", "patch", "delete"}

// writePath is the writes case along one path: per verb, the measured
// latencies (sorted) and errors; and what all its writes cost.
type writePath struct {
	latencies          map[string][]time.Duration
	errors             map[string]int
	lastErr            error
	apiserverS, agentS float64
	requests           int
}

func (p *writePath) p(verb string, pct int) time.Duration {
	s := p.latencies[verb]
	if len(s) == 0 {
		return 0
	}
	return s[min(len(s)*pct/100, len(s)-1)].Round(10 * time.Microsecond)
}

// writesResult is the writes case along both paths.
type writesResult struct {
	perVerb, block, inflight int
	agent, direct            *writePath
}

// writer sends the writes case's requests from the client pod along one
// path.
type writer struct {
	m      *measurer
	client *http.Client
	base   string
	// payload is each object's data value: the same size for every write.
	payload string
}

func (m *measurer) writer(viaAgent bool) *writer {
	w := &writer{m: m, client: m.directClient, base: m.directBase, payload: strings.Repeat("x", writePayload)}
	if viaAgent {
		w.client, w.base = m.agentClient, m.agentBase
	}
	return w
}

// do sends one write of verb to the ConfigMap name and reads the whole
// answer; it reports the latency, and an error for an unexpected status.
func (w *writer) do(ctx context.Context, verb, name string, round int) (time.Duration, error) {
	coll := w.base + "/api/v1/namespaces/" + benchNS + "/configmaps"
	object := func(gen int) []byte {
		return fmt.Appendf(nil, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"labels":{"app.kubernetes.io/part-of":"kube-apicache-bench"}},"data":{"generation":"%d","payload":%q}}`,
			name, gen, w.payload)
	}
	var (
		method, url, contentType string
		body                     []byte
		want                     = http.StatusOK
	)
	switch verb {
	case "create":
		method, url, contentType, body, want = http.MethodPost, coll, "application/json", object(round), http.StatusCreated
	case "update":
		method, url, contentType, body = http.MethodPut, coll+"/"+name, "application/json", object(round+1)
	case "patch":
		method, url, contentType = http.MethodPatch, coll+"/"+name, "application/merge-patch+json"
		body = fmt.Appendf(nil, `{"data":{"generation":"%d"}}`, round+2)
	case "delete":
		method, url = http.MethodDelete, coll+"/"+name
	default:
		return 0, fmt.Errorf("unknown verb %q", verb)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+w.m.b.client.Token)
	req.Header.Set("Accept", w.m.b.o.accept)
	req.Header.Set("User-Agent", "kube-apicache-bench")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	start := time.Now()
	resp, err := w.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err == nil && resp.StatusCode != want {
		err = fmt.Errorf("%s %s: HTTP %d", method, url, resp.StatusCode)
	}
	return d, err
}

// block sends verb for each of names, inflight at a time, and returns the
// latencies of those that succeeded and the errors.
func (w *writer) block(ctx context.Context, verb string, names []string, round, inflight int) ([]time.Duration, int, error) {
	return sendEach(ctx, func(ctx context.Context, i int) (time.Duration, error) {
		return w.do(ctx, verb, names[i], round)
	}, len(names), inflight)
}

// grantConfigMapWrites lets the client pod write ConfigMaps in its
// namespace.
func (b *bench) grantConfigMapWrites(ctx context.Context) error {
	const name = "bench-writer"
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNS},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update", "patch", "delete"}}},
	}
	if _, err := b.c.Admin.RbacV1().Roles(benchNS).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: b.client.Spec.ServiceAccount, Namespace: benchNS}},
	}
	if _, err := b.c.Admin.RbacV1().RoleBindings(benchNS).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return b.client.WaitAllowed(ctx, "delete", "configmaps")
}

// writes runs the writes case: a warm-up round along each path, then
// rounds of one block per path until each verb has n measured requests
// per path.
func (b *bench) writes(ctx context.Context, m *measurer) (*writesResult, error) {
	n := *writeRequests
	if n <= 0 || !b.o.cases.MatchString(writesCase) {
		return nil, nil
	}
	if *writeBlock <= 0 {
		return nil, fmt.Errorf("-write-block must be positive")
	}
	if err := b.grantConfigMapWrites(ctx); err != nil {
		return nil, err
	}
	logf("%s: %d creates, updates, patches and deletes of ConfigMaps per path, blocks of %d, %d in flight", writesCase, n, *writeBlock, b.o.inflight)
	r := &writesResult{perVerb: n, block: *writeBlock, inflight: b.o.inflight}
	writers := map[bool]*writer{true: m.writer(true), false: m.writer(false)}
	paths := map[bool]*writePath{}
	for _, via := range []bool{true, false} {
		paths[via] = &writePath{latencies: map[string][]time.Duration{}, errors: map[string]int{}}
	}
	r.agent, r.direct = paths[true], paths[false]
	tag := map[bool]string{true: "agent", false: "direct"}
	names := func(via bool, round, k int) []string {
		out := make([]string, k)
		for i := range out {
			out[i] = fmt.Sprintf("bench-write-%s-%d-%d", tag[via], round, i)
		}
		return out
	}

	// runBlock sends one block along one path through every verb; with
	// measure set it records the latencies and the CPU they cost.
	runBlock := func(via bool, round, k int, measure bool) error {
		p, w := paths[via], writers[via]
		ns := names(via, round, k)
		for _, verb := range writeVerbs {
			api0, agent0 := m.cpu(m.apiserverPIDs...), m.cpu(m.agentPID)
			durs, errs, lastErr := w.block(ctx, verb, ns, round, b.o.inflight)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !measure {
				if errs > 0 {
					return fmt.Errorf("warm-up %s along the %s path: %d failed, last: %w", verb, tag[via], errs, lastErr)
				}
				continue
			}
			p.apiserverS += m.cpu(m.apiserverPIDs...) - api0
			p.agentS += m.cpu(m.agentPID) - agent0
			p.latencies[verb] = append(p.latencies[verb], durs...)
			p.errors[verb] += errs
			p.requests += k
			if errs > 0 {
				p.lastErr = lastErr
			}
		}
		return nil
	}

	// Warm-up: connections, the agent's forwarding path, kube-apiserver's
	// admission and storage for ConfigMaps.
	for _, via := range []bool{true, false} {
		if err := runBlock(via, -1, max(b.o.warmup, 1), false); err != nil {
			return nil, err
		}
	}
	for round, done := 0, 0; done < n; round++ {
		k := min(*writeBlock, n-done)
		order := []bool{true, false}
		if round%2 == 1 {
			order = []bool{false, true}
		}
		for _, via := range order {
			if err := runBlock(via, round, k, true); err != nil {
				return nil, err
			}
		}
		done += k
	}
	for _, p := range paths {
		for verb, s := range p.latencies {
			slices.Sort(s)
			if len(s) == 0 {
				return nil, fmt.Errorf("every %s failed: %v", verb, p.lastErr)
			}
		}
	}
	for _, verb := range writeVerbs {
		logf("%s: %s p50 agent %v, direct %v", writesCase, verb, r.agent.p(verb, 50), r.direct.p(verb, 50))
	}
	if b.o.profileDir != "" {
		if err := m.profileAgent(ctx, writesCase, len(writeVerbs), writeCycle(writers[true])); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// writeCycle returns a load for profileAgent: each call creates, updates,
// patches and deletes a ConfigMap of its own.
func writeCycle(w *writer) func(context.Context) (time.Duration, error) {
	var seq atomic.Int64
	return func(ctx context.Context) (time.Duration, error) {
		name := fmt.Sprintf("bench-write-profile-%d", seq.Add(1))
		var total time.Duration
		for _, verb := range writeVerbs {
			d, err := w.do(ctx, verb, name, 0)
			if err != nil {
				return total, err
			}
			total += d
		}
		return total, nil
	}
}

func (r *writesResult) print() {
	fmt.Printf("\n%s: ConfigMaps (%d-byte data) in %s by the client pod with its own token, forwarded by the agent against direct; %d measured per verb and path, blocks of %d alternating between the paths, %d in flight (target: p50 at most %.2f× direct)\n",
		writesCase, writePayload, benchNS, r.perVerb, r.block, r.inflight, writeP50Target)
	out := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(out, "verb\tp50 agent\tp50 direct\tp50 ratio\tp99 agent\tp99 direct\tp99 ratio\terrors\t")
	for _, verb := range writeVerbs {
		fmt.Fprintf(out, "%s\t%v\t%v\t%.3f\t%v\t%v\t%.3f\t%d/%d\t\n", verb,
			r.agent.p(verb, 50), r.direct.p(verb, 50), ratio(r.agent.p(verb, 50), r.direct.p(verb, 50)),
			r.agent.p(verb, 99), r.direct.p(verb, 99), ratio(r.agent.p(verb, 99), r.direct.p(verb, 99)),
			r.agent.errors[verb], r.direct.errors[verb])
	}
	_ = out.Flush()
	fmt.Printf("  kube-apiserver CPU-s per 1,000 writes: agent %.3f, direct %.3f; agent CPU-s per 1,000 writes %.3f\n",
		perK(r.agent.apiserverS, r.agent.requests), perK(r.direct.apiserverS, r.direct.requests), perK(r.agent.agentS, r.agent.requests))
	for _, verb := range writeVerbs {
		rt := ratio(r.agent.p(verb, 50), r.direct.p(verb, 50))
		word := "meets"
		if rt > writeP50Target {
			word = "misses"
		}
		fmt.Printf("%s: %s p50 agent/direct %.3f× (target at most %.2f×): %s\n", writesCase, verb, rt, writeP50Target, word)
	}
}
