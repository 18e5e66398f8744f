// Package store holds one watched resource's objects: the Store a
// Reflector fills, the window of recent events watches are served from,
// and each object's stored forms and encodings, with the bodies of gets,
// lists and watch events built from them, byte for byte as
// kube-apiserver writes them.
//
// It knows nothing of requests, callers or HTTP: it takes the media type,
// predicate and resourceVersion a caller has already decided on, and
// returns objects, events and bodies. It must not import net/http or any
// package of the serving side (k8s.io/apiserver, client-go's REST client
// and tools, package cache); deps_test.go checks it. net/http is still
// among its transitive dependencies, as it is of every package that uses
// runtime.Object: apimachinery's runtime imports its util/runtime, which
// imports net/http.
//
// Files: store.go (the Store and its resourceVersion), history.go (the
// event window), object.go (an object's stored form and selector
// attributes), fields.go (kube-apiserver's field labels), encode.go (JSON
// and protobuf bodies from the stored bytes), metadata.go
// (PartialObjectMetadata bodies), embed.go (objects embedded in watch
// events).
package store
