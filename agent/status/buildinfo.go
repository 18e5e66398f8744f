package status

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kube-apicache/kube-apicache/agent/version"
)

// BuildInfo is kube_apicache_build_info: always 1, labelled with the build's
// provenance, so a fleet's versions can be counted and joined to other
// metrics (as kubernetes_build_info does for Kubernetes components).
func BuildInfo() prometheus.Collector {
	v := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kube_apicache_build_info",
		Help: "1, labelled with the version, commit, Go version and platform the binary (agent or approver) was built with.",
		ConstLabels: prometheus.Labels{
			"git_version": v.GitVersion,
			"git_commit":  v.GitCommit,
			"build_date":  v.BuildDate,
			"go_version":  v.GoVersion,
			"platform":    v.Platform,
		},
	})
	g.Set(1)
	return g
}
