package main

import (
	"fmt"
	"regexp"
	"strings"
)

// imageRef is an image name as a kubelet resolves it.
type imageRef struct {
	// Name is the normalized reference: "kube-apicache:latest" becomes
	// "docker.io/library/kube-apicache:latest", the name the CRI looks up
	// for a pod's `image: kube-apicache:latest`.
	Name string
	// Tag is the reference's tag ("latest").
	Tag string
}

var (
	pathComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	tagPattern    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// parseImageRef normalizes s as Docker and containerd do (the
// distribution/reference rules): a first component without "." or ":"
// that is not "localhost" is a Docker Hub path, official images get
// "library/", and a missing tag is "latest". Digests are refused: the
// images built here are named by tag.
func parseImageRef(s string) (imageRef, error) {
	if strings.Contains(s, "@") {
		return imageRef{}, fmt.Errorf("image name %q: a digest cannot name a built image", s)
	}
	repo, tag := s, "latest"
	if i := strings.LastIndex(s, ":"); i > strings.LastIndex(s, "/") {
		repo, tag = s[:i], s[i+1:]
	}
	if !tagPattern.MatchString(tag) {
		return imageRef{}, fmt.Errorf("image name %q: invalid tag %q", s, tag)
	}
	domain, path := "docker.io", repo
	if first, rest, ok := strings.Cut(repo, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		domain, path = first, rest
	}
	if domain == "docker.io" && !strings.Contains(path, "/") {
		path = "library/" + path
	}
	for _, c := range strings.Split(path, "/") {
		if !pathComponent.MatchString(c) {
			return imageRef{}, fmt.Errorf("image name %q: invalid path component %q", s, c)
		}
	}
	return imageRef{Name: domain + "/" + path + ":" + tag, Tag: tag}, nil
}
