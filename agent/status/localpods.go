package status

import "strings"

// LocalPods is where the agent learns this node's pod IPs from
// (interception.LocalPods): Source is node, agent or none ("" where the
// agent does not follow this node's pods), Reason why not the node, and
// HostNetworkOnly whether the redirect takes host-network traffic only
// because those pods have never been listed (detect-local PodIPs).
type LocalPods struct {
	Source, Reason  string
	HostNetworkOnly bool
}

// localPods returns what the Checks report, the zero value without a
// LocalPods check.
func (c Checks) localPods() LocalPods {
	if c.LocalPods == nil {
		return LocalPods{}
	}
	return c.LocalPods()
}

// podsNote is the pods source for the ready and intercepting answers:
// "pods source node", "pods source agent (<reason>)", or, while no pod is
// intercepted, "pods not intercepted, host-network traffic only: pods
// source none (<reason>)"; "" where the agent does not follow them.
func (c Checks) podsNote() string {
	lp := c.localPods()
	var b strings.Builder
	if lp.Source == "" {
		return ""
	}
	if lp.HostNetworkOnly {
		b.WriteString("pods not intercepted, host-network traffic only: ")
	}
	b.WriteString("pods source " + lp.Source)
	if lp.Reason != "" {
		b.WriteString(" (" + lp.Reason + ")")
	}
	return b.String()
}

// note joins the Note and podsNote.
func (c Checks) note() string {
	var notes []string
	if c.Note != nil {
		if n := c.Note(); n != "" {
			notes = append(notes, n)
		}
	}
	if n := c.podsNote(); n != "" {
		notes = append(notes, n)
	}
	return strings.Join(notes, "; ")
}
