// Package series keeps the children of a Prometheus metric vector by
// their label values, so that a request looks its series up in a map
// rather than hashing label values in the vector every time.
package series

import "sync"

// Of holds the children of a metric vector by their label values, made by
// New when first asked for. Its keys must be bounded as the vector's
// label values are. The zero value with New set is ready for use.
type Of[K comparable, M any] struct {
	New func(K) M

	mu     sync.RWMutex // protects the field below
	series map[K]M
}

// Get returns the child for k, making it on first use.
func (s *Of[K, M]) Get(k K) M {
	s.mu.RLock()
	m, ok := s.series[k]
	s.mu.RUnlock()
	if ok {
		return m
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.series[k]; ok {
		return m
	}
	if s.series == nil {
		s.series = map[K]M{}
	}
	m = s.New(k)
	s.series[k] = m
	return m
}
