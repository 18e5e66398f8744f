// Package alerttest evaluates the shipped alert rules
// (manifests/monitoring/prometheusrule.yaml) with Prometheus's own rule
// engine against synthetic series of a fleet of agents. It is a module of
// its own so that Prometheus's dependencies stay out of the agent's
// dependency graph; `make vet` runs its tests.
package alerttest
