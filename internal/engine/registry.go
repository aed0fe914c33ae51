package engine

import "slices"

// Names returns the names of the registered definitions, sorted: those
// passed to Register and the children and element reactors they run. A
// worker logs them when it receives a run of a reactor it does not know.
func (e *Engine) Names() []string {
	e.mu.RLock()
	defer e.mu.RUnlock()
	names := make([]string, 0, len(e.defs))
	for name := range e.defs {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
