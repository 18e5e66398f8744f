package rewrite

// status rewrites a Status (an error answer or a watch ERROR event):
// details.group and details.kind (which holds a resource for "not found"
// and a kind for "invalid", as kube-apiserver fills it), and the messages,
// which name the qualified resource or kind.
func (r *Rewriter) status(s map[string]any) {
	swapString(s, "message", r.Text)
	d, ok := s["details"].(map[string]any)
	if !ok {
		return
	}
	if g, ok := d["group"].(string); ok && r.Renamed(g) {
		d["group"] = r.groups[g]
		if k, ok := d["kind"].(string); ok && k != "" {
			if isUpper(k[0]) {
				d["kind"] = r.kinds.swap(k)
			} else {
				d["kind"] = r.resources.swap(k)
			}
		}
	}
	for _, c := range maps(d["causes"]) {
		swapString(c, "message", r.Text)
	}
}
