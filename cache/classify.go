package cache

import (
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metainternalversionscheme "k8s.io/apimachinery/pkg/apis/meta/internalversion/scheme"
	metainternalversionvalidation "k8s.io/apimachinery/pkg/apis/meta/internalversion/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	"github.com/kube-apicache/kube-apicache/cache/store"
)

// rvMode is how a read's resourceVersion constrains the answer.
type rvMode int

const (
	// rvAny: resourceVersion="0", any state the cache has.
	rvAny rvMode = iota
	// rvNotOlderThan: a state at least as new as plan.minRV.
	rvNotOlderThan
	// rvConsistent: resourceVersion unset, the latest state.
	rvConsistent
)

// Reasons a request is forwarded, used as metric labels.
const (
	reasonNotResource     = "not-resource-request"
	reasonVerb            = "verb"
	reasonSubresource     = "subresource"
	reasonNotCached       = "not-cached"
	reasonNotSynced       = "not-synced"
	reasonImpersonation   = "impersonation"
	reasonNoToken         = "no-token"
	reasonMediaType       = "media-type"
	reasonPretty          = "pretty"
	reasonParameters      = "parameters"
	reasonContinue        = "continue"
	reasonExact           = "resource-version-exact"
	reasonInvalidOptions  = "invalid-options"
	reasonOutOfScope      = "out-of-scope"
	reasonConsistent      = "consistent-read"
	reasonProbeFailed     = "consistent-probe-failed"
	reasonProbeBehind     = "consistent-probe-behind"
	reasonProbeTooLarge   = "consistent-probe-too-large"
	reasonProbeBudget     = "consistent-probe-budget"
	reasonUnhealthy       = "watch-unhealthy"
	reasonBarrier         = "write-barrier-timeout"
	reasonRecentWrite     = "recent-write"
	reasonTooNew          = "resource-version-too-new"
	reasonTooOld          = "resource-version-too-old"
	reasonPaginated       = "paginated"
	reasonNoReviewer      = "no-reviewer"
	reasonEncoding        = "encoding"
	reasonResourceVersion = "resource-version"
	reasonVersion         = "other-version"
	reasonNoRoute         = "no-route"
	reasonSourceShare     = "source-share"
	reasonFieldLabel      = "field-label"
)

// plan is what the cache will do for one request, decided before any
// review.
type plan struct {
	// res is the informer that answers; nil for an idle plan.
	res *informer
	// idle is set instead of res for a read the cache would answer once
	// this idle resource's informer has synced (ondemand.go); only the
	// access review runs for it.
	idle      *resource
	verb      string // get or list
	namespace string
	name      string
	media     store.MediaType
	mode      rvMode
	minRV     uint64
	// limit is the list's limit (0: none); ignored for rvAny.
	limit int64
	// pred selects a list's objects.
	pred store.Predicate
	// badRequest is the 400 kube-apiserver answers once the request is
	// authorized (an unparsable selector).
	badRequest error
	// mayBeAbsent: a get whose name the cache's scope covers, so a miss is
	// a real 404; otherwise a miss is forwarded.
	mayBeAbsent bool
	// as is the shape of the answer's objects (Accept as=...).
	as transform
	// table and tableOpts build a custom resource's Table (as asTable).
	table     rest.TableConvertor
	tableOpts *metav1.TableOptions
	// events embeds a watch's objects in its events in media and as,
	// chosen once when the watch is classified.
	events *store.EventEncoder
	// timeout is a watch's timeoutSeconds (0: none).
	timeout time.Duration
	// bookmarks: the watch asked for bookmarks (allowWatchBookmarks).
	bookmarks bool
	// initialEvents: the watch starts with the objects it selects
	// (sendInitialEvents, set or defaulted). fromRV: it starts after
	// minRV, at once, whatever the Store's RV.
	initialEvents, fromRV bool
	// streaming: sendInitialEvents was given (true or false). With
	// resourceVersion unset, such a watch starts at kube-apiserver's
	// current state, a consistent read; without it, at any recent one.
	streaming bool
	// snap is the list snapshot taken to check a limit, served as it is
	// so that the answer is the one that was checked.
	snap *listSnapshot
	// cursor is a watch from minRV's place in the Store's history, taken
	// once the cache chose to serve it (placeWatch); expired, if set, is
	// the 410 the watch is answered with instead (watch.go).
	cursor  store.Cursor
	expired error
}

// listSnapshot is a list's objects and the RV they are consistent at.
type listSnapshot struct {
	objs []*store.Object
	rv   uint64
}

// snapshot returns the plan's list snapshot, taking it on first use.
func (p *plan) snapshot() ([]*store.Object, uint64) {
	if p.snap == nil {
		objs, rv := p.res.store.Snapshot(p.pred)
		p.snap = &listSnapshot{objs: objs, rv: rv}
	}
	return p.snap.objs, p.snap.rv
}

// Query parameters the cache understands; any other is forwarded.
var (
	getParams  = map[string]bool{"resourceVersion": true}
	listParams = map[string]bool{"labelSelector": true, "fieldSelector": true, "resourceVersion": true,
		"resourceVersionMatch": true, "limit": true, "timeoutSeconds": true}
)

// classify decides whether the cache could answer r, before asking who
// the caller is. It returns a plan, or the reason to forward.
func (c *Cache) classify(r *http.Request, info *request.RequestInfo) (*plan, string) {
	if info == nil || !info.IsResourceRequest {
		return nil, reasonNotResource
	}
	if r.Method != http.MethodGet || (info.Verb != "get" && info.Verb != "list" && info.Verb != "watch") {
		return nil, reasonVerb
	}
	if info.Subresource != "" {
		return nil, reasonSubresource
	}
	configured := c.byGR[schema.GroupResource{Group: info.APIGroup, Resource: info.Resource}]
	if configured == nil {
		return nil, reasonNotCached
	}
	res := c.lookup(schema.GroupVersionResource{Group: info.APIGroup, Version: info.APIVersion, Resource: info.Resource})
	if cur := configured.current.Load(); res == nil && cur != nil && cur.ready.Load() {
		// Cached, but at another version: kube-apiserver converts.
		return nil, reasonVersion
	}
	if res == nil || !res.store.Synced() {
		if c.cfg.OnDemand && configured.current.Load() == nil && c.wouldServe(r, info, configured) {
			return &plan{idle: configured, verb: info.Verb}, ""
		}
		return nil, reasonNotSynced
	}
	for k := range r.Header {
		if strings.HasPrefix(k, "Impersonate-") {
			return nil, reasonImpersonation
		}
	}
	if auth := r.Header.Get("Authorization"); len(auth) < 7 || !strings.EqualFold(auth[:7], "bearer ") {
		return nil, reasonNoToken
	}
	media, as, reason := negotiateShape(r, res.builtin, info.Verb)
	if reason != "" {
		return nil, reason
	}
	if reason := routeMismatch(r, info, res.namespaced); reason != "" {
		return nil, reason
	}
	p := &plan{res: res, verb: info.Verb, namespace: info.Namespace, name: info.Name, media: media, as: as}
	if !res.namespaced {
		p.namespace = ""
	}
	query := r.URL.Query()
	allowed := getParams
	switch p.verb {
	case "list":
		allowed = listParams
	case "watch":
		allowed = watchParams
	}
	if reason := c.planShape(p, query); reason != "" {
		return nil, reason
	}
	for k := range query {
		switch {
		case k == "continue":
			return nil, reasonContinue
		case !allowed[k] && !(p.as == asTable && k == "includeObject"):
			return nil, reasonParameters
		}
	}
	if p.verb == "get" {
		return c.classifyGet(p, query)
	}
	return c.classifyList(p, query)
}

func (c *Cache) classifyGet(p *plan, query map[string][]string) (*plan, string) {
	var opts metav1.GetOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(query, metav1.SchemeGroupVersion, &opts); err != nil {
		return nil, reasonParameters
	}
	var reason string
	if p.mode, p.minRV, reason = c.rvModeOf(opts.ResourceVersion, "", 0); reason != "" {
		return nil, reason
	}
	// A miss is a 404 only where the cache holds every object of that
	// name: the whole resource, or a scope that names exactly this object.
	switch len(p.res.scopeTerms) {
	case 0:
		p.mayBeAbsent = true
	case 1:
		if v, ok := p.res.scopeTerms["metadata.name"]; ok && v == p.name {
			p.mayBeAbsent = true
		} else if ok {
			return nil, reasonOutOfScope
		}
	}
	return p, ""
}

func (c *Cache) classifyList(p *plan, query map[string][]string) (*plan, string) {
	res := p.res
	var opts metainternalversion.ListOptions
	if err := metainternalversionscheme.ParameterCodec.DecodeParameters(query, metav1.SchemeGroupVersion, &opts); err != nil {
		if len(res.scopeTerms) > 0 {
			// Without a parsed field selector the cache cannot tell whether
			// its scope covers the request.
			return nil, reasonOutOfScope
		}
		p.badRequest = apierrors.NewBadRequest(err.Error())
		return p, ""
	}
	metainternalversion.SetListOptionsDefaults(&opts, true)
	if errs := metainternalversionvalidation.ValidateListOptions(&opts, true); len(errs) > 0 {
		return nil, reasonInvalidOptions
	}
	if (opts.Watch || opts.SendInitialEvents != nil) != (p.verb == "watch") {
		return nil, reasonParameters
	}
	field := opts.FieldSelector
	if field == nil {
		field = fields.Everything()
	}
	for k, v := range res.scopeTerms {
		if got, ok := field.RequiresExactMatch(k); !ok || got != v {
			return nil, reasonOutOfScope
		}
	}
	field, err := field.Transform(res.fields.Convert)
	if err != nil {
		// A label the cache does not know exactly as kube-apiserver does
		// is kube-apiserver's to answer, with a 400 or with objects.
		return nil, reasonFieldLabel
	}
	label := opts.LabelSelector
	if label == nil {
		label = labels.Everything()
	}
	p.pred = store.Predicate{Namespace: p.namespace, Label: label, Field: withoutScopeTerms(field, res.scopeTerms)}
	p.limit = opts.Limit
	var reason string
	if p.mode, p.minRV, reason = c.rvModeOf(opts.ResourceVersion, opts.ResourceVersionMatch, opts.Limit); reason != "" {
		return nil, reason
	}
	if p.verb == "watch" {
		return c.classifyWatch(p, &opts)
	}
	return p, ""
}

// Reasons a watch is forwarded.
const (
	reasonWatchObject = "watch-single-object"
)

// watchParams are the query parameters of a watch-list the cache answers.
var watchParams = map[string]bool{"labelSelector": true, "fieldSelector": true, "resourceVersion": true,
	"resourceVersionMatch": true, "timeoutSeconds": true, "allowWatchBookmarks": true,
	"sendInitialEvents": true, "watch": true, "timeout": true}

// classifyWatch decides whether the cache answers a watch. It answers
// every form kube-apiserver serves from its own watch cache (watch.go):
// with initial events (a watch-list, sendInitialEvents=true, which
// validation ties to resourceVersionMatch=NotOlderThan and
// allowWatchBookmarks=true, or a legacy watch from "0" or unset, for which
// SetListOptionsDefaults turns it on), and without them from a
// resourceVersion N or from now; of a collection, or of one object by a
// metadata.name field selector. A watch by the deprecated path form
// (/watch/.../<name>) is forwarded, and so is a watch from an N older than
// the cache's event window, once the caller is reviewed (placeWatch).
//
// The resourceVersion has the list meanings for initial events
// (api-concepts, watch-list): unset is a consistent start (the
// read-your-writes barrier applies), "0" any state, N a state not older
// than N. opts must have passed ValidateListOptions.
func (c *Cache) classifyWatch(p *plan, opts *metainternalversion.ListOptions) (*plan, string) {
	if p.name != "" {
		// The name is in the field selector, or is the cache's own scope
		// (this node's Node), whose term the predicate no longer holds.
		name, ok := p.pred.Field.RequiresExactMatch("metadata.name")
		if !ok {
			name, ok = p.res.scopeTerms["metadata.name"]
		}
		if !ok || name != p.name {
			return nil, reasonWatchObject
		}
	}
	p.initialEvents = opts.SendInitialEvents != nil && *opts.SendInitialEvents
	p.streaming = opts.SendInitialEvents != nil
	if !p.initialEvents && p.mode == rvNotOlderThan {
		// A watch from N starts at once, as kube-apiserver's: the events
		// after N, however far the cache is, skipping those up to N.
		p.fromRV = true
	}
	if opts.TimeoutSeconds != nil {
		p.timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	p.bookmarks = opts.AllowWatchBookmarks
	p.events = p.res.encoder.EventEncoder(p.media, p.as == asMetadata)
	return p, ""
}

// rvModeOf maps resourceVersion and resourceVersionMatch to a mode, as
// kube-apiserver's api-concepts define them for get and list.
func (c *Cache) rvModeOf(rv string, match metav1.ResourceVersionMatch, limit int64) (rvMode, uint64, string) {
	switch {
	case match == metav1.ResourceVersionMatchExact:
		return 0, 0, reasonExact
	case match != "" && match != metav1.ResourceVersionMatchNotOlderThan:
		return 0, 0, reasonInvalidOptions
	case rv == "":
		if c.cfg.ConsistentReads == ConsistentForward {
			return 0, 0, reasonConsistent
		}
		return rvConsistent, 0, ""
	case rv == "0":
		return rvAny, 0, ""
	}
	if match == "" && limit > 0 {
		// A paginated list at an exact RV (the legacy meaning).
		return 0, 0, reasonExact
	}
	n, err := store.ParseResourceVersion(rv)
	if err != nil {
		return 0, 0, reasonResourceVersion
	}
	return rvNotOlderThan, n, ""
}

// withoutScopeTerms drops the requirements of sel that every cached object
// meets by construction (the watch's own field selector, such as
// spec.nodeName=<node> for pods), so that listing this node's pods does not
// compute every pod's field set only to find the node it is known to have.
// A selector it cannot rebuild is returned unchanged.
func withoutScopeTerms(sel fields.Selector, scope map[string]string) fields.Selector {
	if len(scope) == 0 {
		return sel
	}
	reqs := sel.Requirements()
	keep := make([]fields.Selector, 0, len(reqs))
	for _, r := range reqs {
		switch r.Operator {
		case selection.Equals, selection.DoubleEquals:
			if v, ok := scope[r.Field]; ok && v == r.Value {
				continue
			}
			keep = append(keep, fields.OneTermEqualSelector(r.Field, r.Value))
		case selection.NotEquals:
			keep = append(keep, fields.OneTermNotEqualSelector(r.Field, r.Value))
		default:
			return sel
		}
	}
	if len(keep) == len(reqs) {
		return sel
	}
	return fields.AndSelectors(keep...)
}

// routeMismatch returns a reason to forward a request whose path
// kube-apiserver has no route for, although RequestInfo parses it: a
// cluster-scoped resource under /namespaces/<ns>/ (which would also be
// authorized in <ns>, so a namespaced Role could read cluster-scoped
// objects), or a namespaced object got by name without its namespace. The one
// cluster-scoped object kube-apiserver does serve under a namespace path is
// the Namespace itself, /api/v1/namespaces/<name>, which RequestInfo
// attributes to namespace <name>. RequestInfo also trims leading slashes,
// which kube-apiserver's routing does not: "//api/v1/..." is its 404.
func routeMismatch(r *http.Request, info *request.RequestInfo, namespaced bool) string {
	root := "/" + info.APIPrefix + "/"
	if info.APIGroup != "" {
		root += info.APIGroup + "/"
	}
	if !strings.HasPrefix(r.URL.Path, root+info.APIVersion+"/") {
		return reasonNoRoute
	}
	switch {
	case !namespaced && info.Namespace != "":
		if info.APIGroup == "" && info.Resource == "namespaces" && info.Name == info.Namespace &&
			strings.TrimSuffix(r.URL.Path, "/") == "/api/"+info.APIVersion+"/namespaces/"+info.Name {
			return ""
		}
		return reasonNoRoute
	case namespaced && info.Namespace == "" && info.Name != "" && info.Verb == "get":
		// A list or watch across namespaces with a metadata.name field
		// selector also carries a Name (for authorization), and is served.
		return reasonNoRoute
	}
	return ""
}

// BuiltinFieldLabels returns the field labels the cache answers for a
// built-in resource, for tests that compare them with kube-apiserver.
func BuiltinFieldLabels(gr schema.GroupResource, minor int) []string {
	return store.BuiltinFieldLabels(gr, minor)
}
