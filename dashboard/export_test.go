package dashboard

// Cursor is the next_cursor of a page whose last entry has score and member:
// a benchmark starts deep in a listing without paging there.
func Cursor(score float64, member string) string {
	return cursor{score: score, member: member}.encode()
}

// ForgetSummaries drops h's cached map summaries.
func ForgetSummaries(h *Handler) { h.maps.Forget() }
