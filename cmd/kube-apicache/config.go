package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

	"github.com/kube-apicache/kube-apicache/agent"
	configv1alpha1 "github.com/kube-apicache/kube-apicache/agent/apis/config/v1alpha1"
)

// killSwitchPoll is how often a running agent re-reads interception.enabled
// from its configuration file. A ConfigMap edit reaches the file when the
// kubelet next syncs the volume (about a minute at its defaults); this
// adds at most a few seconds.
const killSwitchPoll = 5 * time.Second

// configFile is --config: the AgentConfiguration file both commands read.
type configFile struct {
	path string
	// dir is --config-dir: drop-ins merged over the file at path.
	dir string
	// sections are the top-level sections this command reads; none: all.
	sections []string
	// cliInterception is whether --interception was on the command line,
	// which the file's kill switch then cannot override.
	cliInterception bool
}

func (c *configFile) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.path, "config", "", "Configuration file (kind AgentConfiguration, apiVersion "+configv1alpha1.SchemeGroupVersion.String()+"; see docs/reference/config.md). It sets every flag the command line leaves unset; the agent and the approver read the same file.")
	fs.StringVar(&c.dir, "config-dir", "", "Directory of configuration drop-ins: each *"+configv1alpha1.DropInExtension+" file in it (not starting with a dot), in lexical order of the names, is a partial AgentConfiguration with apiVersion and kind, merged over --config as a JSON merge patch (maps merge, lists and values replace, null removes a field), like the kubelet's --config-dir. The --config file is skipped if it lies in the directory, so one ConfigMap can hold both. The directory must exist.")
}

// load reads --config and the drop-ins of --config-dir, merged.
func (c *configFile) load() (*configv1alpha1.AgentConfiguration, []string, error) {
	return configv1alpha1.LoadWithDropIns(c.path, c.dir)
}

// source names what the configuration was read from, for messages.
func (c *configFile) source() string {
	switch {
	case c.dir == "":
		return c.path
	case c.path == "":
		return c.dir
	}
	return c.path + " and " + c.dir
}

// apply loads the file, if any, into the flags of fs that the command line
// did not set, and logs a warning for each field the command line
// overrides (an operator who edits it would otherwise see no effect). The
// returned Applied names the fields behind the flags the file set.
func (c *configFile) apply(fs *pflag.FlagSet) (configv1alpha1.Applied, error) {
	c.cliInterception = fs.Changed("interception")
	if c.path == "" && c.dir == "" {
		return nil, nil
	}
	cfg, dropIns, err := c.load()
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	if len(dropIns) > 0 {
		klog.Background().V(2).Info("Configuration drop-ins merged", "config", c.path, "dropIns", dropIns)
	}
	// A deprecated name on the command line counts as its flag's: the file
	// must not override it.
	for old, current := range deprecatedNames {
		if f := fs.Lookup(current); f != nil && fs.Changed(old) {
			f.Changed = true
		}
	}
	applied, overrides, err := configv1alpha1.ApplyToFlags(cfg, fs, c.sections...)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", c.source(), err)
	}
	logger := klog.Background()
	for _, o := range overrides {
		logger.Info("Warning: a command-line flag overrides the configuration file; edits of the field have no effect",
			"flag", "--"+o.Flag, "field", o.Field.String(), "flagValue", o.FlagValue, "fileValue", o.FileValue, "config", c.source())
	}
	return applied, nil
}

// resolvConf is the container's DNS configuration, which the kubelet writes
// with the cluster domain in its search path.
var resolvConf = "/etc/resolv.conf"

// discoverClusterDomain fills in the cluster domain from the DNS search
// path the kubelet gives pods with a cluster DNS policy (ClusterFirst, and
// ClusterFirstWithHostNet as the DaemonSet has): "<namespace>.svc.<domain>
// svc.<domain> <domain>". Where neither the command line nor the file set
// it, and the search path has no such entry, the default stays. The agent
// and the approver find the same domain this way, as the kubelet gives it
// to both.
func discoverClusterDomain(fs *pflag.FlagSet, domain *string) {
	if fs.Changed("cluster-domain") {
		return
	}
	d, ok := clusterDomainFromResolvConf(resolvConf)
	if !ok {
		return
	}
	if d != *domain {
		klog.Background().Info("Cluster domain from the DNS search path", "clusterDomain", d, "file", resolvConf)
	}
	*domain = d
}

// clusterDomainFromResolvConf returns <domain> from the first svc.<domain>
// entry of path's search line.
func clusterDomainFromResolvConf(path string) (string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "search" {
			continue
		}
		for _, s := range f[1:] {
			d, ok := strings.CutPrefix(strings.TrimSuffix(s, "."), "svc.")
			if ok && d != "" && len(validation.IsDNS1123Subdomain(d)) == 0 {
				return d, true
			}
		}
	}
	return "", false
}

// deprecatedNames maps each deprecated flag to the flag it was renamed to;
// both set the same value.
var deprecatedNames = map[string]string{
	"liveness-timeout": "fail-open-timeout",
	"liveness-set":     "fail-open-set",
}

// Sections of the configuration file each command reads, other than the
// agent (which reads them all).
var (
	approverSections = []string{"cluster"}
	cleanupSections  = []string{"cluster", "dataplane"}
)

// interceptionSetter is what the kill switch drives.
type interceptionSetter interface {
	SetInterception(enabled bool, reason string)
}

// watchKillSwitch re-reads interception.enabled from the file until ctx
// ends and hands every change to a. A file that cannot be read or parsed
// changes nothing (the agent keeps its last setting and logs why).
func (c *configFile) watchKillSwitch(ctx context.Context, a interceptionSetter) {
	if (c.path == "" && c.dir == "") || c.cliInterception {
		return
	}
	logger := klog.FromContext(ctx)
	var lastErr string
	t := time.NewTicker(killSwitchPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cfg, _, err := c.load()
		if err != nil {
			if err.Error() != lastErr {
				logger.Error(err, "Cannot re-read the configuration file; interception stays as it is")
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		enabled := cfg.Interception.Enabled == nil || *cfg.Interception.Enabled
		a.SetInterception(enabled, "interception.enabled: "+strconv.FormatBool(enabled)+" in "+c.source())
	}
}

// discoverService fills in the kubernetes Service's VIP and port from the
// environment the kubelet gives every pod, where neither the command line
// nor the configuration file set them. The agent later checks them against
// the Service itself.
func discoverService(fs *pflag.FlagSet, vips *[]string, port *uint16) {
	host, p := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if !fs.Changed("service-vip") && len(*vips) == 0 {
		if ip, err := netip.ParseAddr(host); err == nil {
			*vips = []string{ip.String()}
		} else {
			if host != "" {
				klog.Background().Info("$KUBERNETES_SERVICE_HOST is not an IP address; assuming the default Service VIP, which the agent checks against the Service",
					"host", host, "vip", agent.DefaultServiceVIP)
			}
			*vips = []string{agent.DefaultServiceVIP}
		}
	}
	if port != nil && !fs.Changed("service-port") {
		if n, err := strconv.ParseUint(p, 10, 16); err == nil && n > 0 {
			*port = uint16(n)
		}
	}
}
