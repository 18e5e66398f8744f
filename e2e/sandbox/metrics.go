package sandbox

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The agent serves its metrics listener over HTTPS. Its health paths answer
// anyone; /metrics and /debug/pprof/ need a token kube-apiserver
// authenticates and RBAC allows. The sandbox reads them as a scraper would:
// with the token of a ServiceAccount bound to the shipped
// kube-apicache:metrics-reader role (and, for the profiles, a role of the
// sandbox's own).
const (
	// ScraperServiceAccount is the sandbox's scraper, in AgentNamespace.
	ScraperServiceAccount = "e2e-metrics-scraper"
	// MetricsReaderRole is the shipped role that allows /metrics.
	MetricsReaderRole = "kube-apicache:metrics-reader"
	// StatusServiceAccount is the shipped ServiceAccount, in
	// AgentNamespace, that `kube-apicache status` reads /statusz as
	// (manifests/serviceaccount.yaml; rbac.yaml binds it).
	StatusServiceAccount = "kube-apicache-status"
	// profilerRole allows the profiles of an agent run with --profiling.
	profilerRole = "kube-apicache-e2e:profiler"
)

// AgentMetricsTransport dials the agent's metrics listener from ns. The
// listener's certificate is self-signed at the agent's start-up, so it is
// not verified: the scenarios check who may read what, not the channel.
func AgentMetricsTransport(ns NetNS) *http.Transport {
	return &http.Transport{
		DialContext:       ns.DialContext,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
		DisableKeepAlives: true,
	}
}

// AgentGet asks the agent's metrics listener at addr (host:port), dialled
// from ns, for path, with the scraper's token if authenticated, and returns
// the status code and body.
func (c *Cluster) AgentGet(ctx context.Context, ns NetNS, addr, path string, authenticated bool, timeout time.Duration) (int, []byte, error) {
	token := ""
	if authenticated {
		var err error
		if token, err = c.ScraperToken(ctx); err != nil {
			return 0, nil, err
		}
	}
	return AgentGetWithToken(ctx, ns, addr, path, token, timeout)
}

// AgentGetWithToken is AgentGet with the bearer token given; "" sends none.
func AgentGetWithToken(ctx context.Context, ns NetNS, addr, path, token string, timeout time.Duration) (int, []byte, error) {
	client := &http.Client{Timeout: timeout, Transport: AgentMetricsTransport(ns)}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// ScraperToken returns a token of the sandbox's scraper, which may read the
// agents' /metrics and profiles. It creates the ServiceAccount and its
// bindings on first use, and a new token when the last one nears its
// expiry.
func (c *Cluster) ScraperToken(ctx context.Context) (string, error) {
	c.scraperMu.Lock()
	defer c.scraperMu.Unlock()
	if c.scraperToken != "" && time.Until(c.scraperTokenExpiry) > 10*time.Minute {
		return c.scraperToken, nil
	}
	if err := c.ensureScraper(ctx); err != nil {
		return "", err
	}
	token, expiry, err := c.ServiceAccountToken(ctx, AgentNamespace, ScraperServiceAccount)
	if err != nil {
		return "", err
	}
	c.scraperToken, c.scraperTokenExpiry = token, expiry
	return token, nil
}

// StatusToken returns an hour's token of StatusServiceAccount, which the
// shipped RBAC allows to get /statusz. The sandbox applies the manifests'
// RBAC objects only, so the ServiceAccount is made here.
func (c *Cluster) StatusToken(ctx context.Context) (string, error) {
	if err := c.EnsureServiceAccount(ctx, AgentNamespace, StatusServiceAccount); err != nil {
		return "", err
	}
	token, _, err := c.ServiceAccountToken(ctx, AgentNamespace, StatusServiceAccount)
	return token, err
}

// ServiceAccountToken requests a token of the ServiceAccount namespace/name,
// bound to no object, valid for an hour.
func (c *Cluster) ServiceAccountToken(ctx context.Context, namespace, name string) (string, time.Time, error) {
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	tr, err := c.Admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, tr, metav1.CreateOptions{})
	if err != nil {
		return "", time.Time{}, fmt.Errorf("requesting a token of %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, tr.Status.ExpirationTimestamp.Time, nil
}

// EnsureServiceAccount creates the ServiceAccount namespace/name (and its
// namespace) if needed.
func (c *Cluster) EnsureServiceAccount(ctx context.Context, namespace, name string) error {
	if err := c.EnsureNamespace(ctx, namespace); err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := c.Admin.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return nil
}

// ensureScraper creates the scraper's ServiceAccount, binds it to the
// shipped metrics-reader role and to the sandbox's profiler role.
func (c *Cluster) ensureScraper(ctx context.Context) error {
	if err := c.EnsureServiceAccount(ctx, AgentNamespace, ScraperServiceAccount); err != nil {
		return err
	}
	profiler := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: profilerRole},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/debug/pprof/", "/debug/pprof/*"}, Verbs: []string{"get"}}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoles().Create(ctx, profiler, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ClusterRole %s: %w", profilerRole, err)
	}
	for _, role := range []string{MetricsReaderRole, profilerRole} {
		if err := c.BindClusterRole(ctx, role, AgentNamespace, ScraperServiceAccount); err != nil {
			return err
		}
	}
	return nil
}

// BindClusterRole binds the ClusterRole role cluster-wide to the
// ServiceAccount namespace/name.
func (c *Cluster) BindClusterRole(ctx context.Context, role, namespace, name string) error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role + ":" + namespace + ":" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}},
	}
	if _, err := c.Admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("binding %s to %s/%s: %w", role, namespace, name, err)
	}
	return nil
}
