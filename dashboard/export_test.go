package dashboard

import "time"

// Cursor is the next_cursor of a page whose last entry has score and member:
// a benchmark starts deep in a listing without paging there.
func Cursor(score float64, member string) string {
	return cursor{score: score, member: member}.encode()
}

// ForgetSummaries drops h's cached map summaries.
func ForgetSummaries(h *Handler) { h.maps.Forget() }

// ForgetServed drops h's cached read of asynq's server registry; ttl, when
// positive, becomes how long the next read is trusted.
func ForgetServed(h *Handler, ttl time.Duration) {
	h.served.mu.Lock()
	defer h.served.mu.Unlock()
	h.served.readAt = time.Time{}
	if ttl > 0 {
		h.served.ttl = ttl
	}
}

// SetScanBudget makes a listing request examine at most n index entries
// (scanBudget) until the test ends.
func SetScanBudget(t interface{ Cleanup(func()) }, n int) {
	old := scanBudget
	scanBudget = n
	t.Cleanup(func() { scanBudget = old })
}

// ForgetStalls drops h's cached stall examination; ttl, when positive,
// becomes how long the next one is served.
func ForgetStalls(h *Handler, ttl time.Duration) {
	h.stallCache.mu.Lock()
	defer h.stallCache.mu.Unlock()
	h.stallCache.readAt = time.Time{}
	if ttl > 0 {
		h.stallCache.ttl = ttl
	}
}

// SetMaxMatching makes a matching batch act on at most n runs until the
// test ends.
func SetMaxMatching(t interface{ Cleanup(func()) }, n int) {
	old := maxMatching
	maxMatching = n
	t.Cleanup(func() { maxMatching = old })
}

// SetMatchScanBudget makes a matching count or batch examine at most n
// index entries (matchScanBudget) until the test ends.
func SetMatchScanBudget(t interface{ Cleanup(func()) }, n int) {
	old := matchScanBudget
	matchScanBudget = n
	t.Cleanup(func() { matchScanBudget = old })
}
