package mapcore

import (
	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
)

type outcomeStatus string

const (
	outcomeOK      outcomeStatus = "ok"
	outcomeFailed  outcomeStatus = "failed"
	outcomeHalted  outcomeStatus = "halted"
	outcomeSkipped outcomeStatus = "skipped"
	// outcomeStopped: settled without running because the map had failed
	// or was stopped; an earlier delivery of the element may still have
	// run some of it, so a rollback looks at the element run.
	outcomeStopped outcomeStatus = "stopped"
)

// outcome is one element's settled result, as stored in the map's results
// hash.
type outcome struct {
	Status  outcomeStatus   `msgpack:"s"`
	Value   codec.Raw       `msgpack:"v,omitempty"`
	Failure *engine.Failure `msgpack:"f,omitempty"`
	Reason  string          `msgpack:"r,omitempty"`
	// Held is what a failed element's own rollback left in place.
	Held engine.Held `msgpack:"h,omitempty"`
}

func outcomeOf(res *engine.Result) outcome {
	switch res.Status {
	case engine.StatusCompleted:
		return outcome{Status: outcomeOK, Value: res.Value}
	case engine.StatusHalted:
		return outcome{Status: outcomeHalted, Reason: res.Reason}
	default:
		return outcome{Status: outcomeFailed, Failure: res.Failure, Held: res.Held}
	}
}

// Result is a completed map step's value: what a later step binds with
// reactor.FromStep. Read the elements' outcomes with Read.
type Result struct {
	MapID string `msgpack:"map"`
	// Total is the number of elements.
	Total int `msgpack:"total"`
	// Failed counts elements that failed (partial maps only; an atomic map
	// with a failure fails instead of completing).
	Failed int `msgpack:"failed"`
}

// state is what the map step saves with the owner's run: only its map id
// and shape, never the source.
type state struct {
	MapID  string `msgpack:"map"`
	Total  int    `msgpack:"total"`
	FanOut bool   `msgpack:"fanout"`
}
