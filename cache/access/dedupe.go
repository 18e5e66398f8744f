package access

import (
	"context"
	"encoding/json"

	"golang.org/x/sync/singleflight"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// dedupe makes one review for concurrent identical authorizations. When a
// cached decision expires under load, every request in flight for it would
// otherwise miss the cache at once and send its own SubjectAccessReview.
//
// The shared call runs with the first caller's values but without its
// cancellation, so one caller going away does not fail the others; the
// authorizer below bounds its time.
type dedupe struct {
	authorizer.Authorizer
	group singleflight.Group
}

type decisionResult struct {
	decision authorizer.Decision
	reason   string
}

func (d *dedupe) Authorize(ctx context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	key, err := decisionKey(attrs)
	if err != nil {
		return d.Authorizer.Authorize(ctx, attrs)
	}
	v, err, _ := d.group.Do(key, func() (any, error) {
		decision, reason, err := d.Authorizer.Authorize(context.WithoutCancel(ctx), attrs)
		return decisionResult{decision, reason}, err
	})
	res := v.(decisionResult)
	return res.decision, res.reason, err
}

// decisionKey identifies an authorization by everything a
// SubjectAccessReview carries, so that two callers share a call only when
// their reviews would be identical.
func decisionKey(a authorizer.Attributes) (string, error) {
	k := struct {
		User, UID, Verb, Namespace, Resource, Subresource, Name, Group, Version, Path string
		Groups                                                                        []string
		Extra                                                                         map[string][]string
		IsResource                                                                    bool
		Labels, Fields                                                                []string
	}{Verb: a.GetVerb(), Namespace: a.GetNamespace(), Resource: a.GetResource(), Subresource: a.GetSubresource(),
		Name: a.GetName(), Group: a.GetAPIGroup(), Version: a.GetAPIVersion(), Path: a.GetPath(),
		IsResource: a.IsResourceRequest()}
	if u := a.GetUser(); u != nil {
		k.User, k.UID, k.Groups, k.Extra = u.GetName(), u.GetUID(), u.GetGroups(), u.GetExtra()
	}
	if reqs, err := a.GetLabelSelector(); err == nil {
		for _, r := range reqs {
			k.Labels = append(k.Labels, r.String())
		}
	}
	if reqs, err := a.GetFieldSelector(); err == nil {
		for _, r := range reqs {
			k.Fields = append(k.Fields, r.Field+"\x00"+string(r.Operator)+"\x00"+r.Value)
		}
	}
	b, err := json.Marshal(k)
	return string(b), err
}
