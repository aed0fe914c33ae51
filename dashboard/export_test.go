package dashboard

import "context"

// SetRequester wires the handler's actions to r (the merger wires
// worker.Controller; the tests a requester of their own).
func SetRequester(h *Handler, r interface {
	Request(ctx context.Context, runID, action string) (string, bool, error)
}) {
	h.requester = r
}
