package dashboard

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/goreactor/goreactor/internal/inspect"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/mapstep"
)

// Element page limits.
const (
	defaultElements = 100
	maxElements     = 1000
)

type elementsPage struct {
	MapID    string        `json:"map_id"`
	Total    int           `json:"total"`
	From     int           `json:"from"`
	NextFrom int           `json:"next_from"`
	Elements []elementView `json:"elements"`
	Summary  summary       `json:"summary"`
}

type elementView struct {
	Index           int    `json:"index"`
	State           string `json:"state"`
	Error           string `json:"error"`
	RollbackOutcome string `json:"rollback_outcome"`
}

type summary struct {
	BucketSize int        `json:"bucket_size"`
	Cells      []cellView `json:"cells"`
}

type cellView struct {
	From        int `json:"from"`
	To          int `json:"to"`
	Pending     int `json:"pending"`
	Running     int `json:"running"`
	Completed   int `json:"completed"`
	Failed      int `json:"failed"`
	Undone      int `json:"undone"`
	UndoFailed  int `json:"undo_failed"`
	Unavailable int `json:"unavailable"`
}

func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s %q must be a whole number from %d to %d", name, s, lo, hi)
	}
	return n, nil
}

// mapElements serves GET /api/runs/{id}/maps/{step}/elements.
func (h *Handler) mapElements(w http.ResponseWriter, r *http.Request, id, step string) {
	if err := keys.ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, "run id: "+err.Error())
		return
	}
	from, err := intParam(r, "from", 0, 0, 1<<31-1)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	limit, err := intParam(r, "limit", defaultElements, 1, maxElements)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	mapID := mapstep.MapID(id, step)
	if err := keys.ValidateID(mapID); err != nil {
		writeError(w, http.StatusBadRequest, "map step: "+err.Error())
		return
	}
	pic, ok, err := h.maps.Read(r.Context(), mapID, from, limit)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("run %s has no map at step %q (no such run or step, the map has not started, or its retention expired)", id, step))
		return
	}
	out := elementsPage{MapID: mapID, Total: pic.Map.Total, From: from, NextFrom: -1, Elements: []elementView{},
		Summary: summary{BucketSize: pic.BucketSize, Cells: []cellView{}}}
	if next := from + limit; next < pic.Map.Total {
		out.NextFrom = next
	}
	for _, el := range pic.Elements {
		out.Elements = append(out.Elements, elementView{Index: el.Index, State: el.State, Error: el.Error, RollbackOutcome: el.RollbackOutcome})
	}
	for _, c := range pic.Cells {
		n := c.Counts
		out.Summary.Cells = append(out.Summary.Cells, cellView{From: c.From, To: c.To,
			Pending: n[inspect.StatePending], Running: n[inspect.StateRunning], Completed: n[inspect.StateCompleted],
			Failed: n[inspect.StateFailed], Undone: n[inspect.StateUndone], UndoFailed: n[inspect.StateUndoFailed],
			Unavailable: n[inspect.StateUnavailable]})
	}
	writeJSON(w, http.StatusOK, out)
}
