package worker

import (
	"errors"
	"fmt"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/keys"
)

// Task types handled by a Worker.
const (
	// TypeRun executes (starts or resumes) a run.
	TypeRun = "goreactor:run"
	// TypeElement executes one element of a fan-out map.
	TypeElement = "goreactor:element"
	// TypeRollback rolls back one element of a fan-out map.
	TypeRollback = "goreactor:rollback"
)

// RollbackPayload is the payload of a TypeRollback task (msgpack).
type RollbackPayload struct {
	MapID string `msgpack:"map"`
	Gen   int    `msgpack:"gen"`
	Pos   int    `msgpack:"pos"`
	Index int    `msgpack:"i"`
}

// DecodeRollback decodes and validates a TypeRollback payload.
func DecodeRollback(b []byte) (RollbackPayload, error) {
	var p RollbackPayload
	if err := codec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if err := keys.ValidateID(p.MapID); err != nil {
		return p, fmt.Errorf("%w: map id: %v", errMalformed, err)
	}
	if p.Pos < 0 || p.Gen < 1 || p.Index < 0 {
		return p, fmt.Errorf("%w: rollback position %d, generation %d", errMalformed, p.Pos, p.Gen)
	}
	return p, nil
}

// ElementPayload is the payload of a TypeElement task (msgpack).
type ElementPayload struct {
	MapID string    `msgpack:"map"`
	Index int       `msgpack:"i"`
	Input codec.Raw `msgpack:"in"`
}

// DecodeElement decodes and validates a TypeElement payload.
func DecodeElement(b []byte) (ElementPayload, error) {
	var p ElementPayload
	if err := codec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if err := keys.ValidateID(p.MapID); err != nil {
		return p, fmt.Errorf("%w: map id: %v", errMalformed, err)
	}
	if p.Index < 0 {
		return p, fmt.Errorf("%w: negative element index %d", errMalformed, p.Index)
	}
	return p, nil
}

// RunPayload is the payload of a TypeRun task (msgpack).
type RunPayload struct {
	RunID   string `msgpack:"run"`
	Reactor string `msgpack:"reactor"`
}

// EncodeRun encodes a TypeRun payload.
func EncodeRun(p RunPayload) ([]byte, error) { return codec.Marshal(p) }

// errMalformed marks a payload that no retry can fix.
var errMalformed = errors.New("worker: malformed payload")

// DecodeRun decodes and validates a TypeRun payload.
func DecodeRun(b []byte) (RunPayload, error) {
	var p RunPayload
	if err := codec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if err := keys.ValidateID(p.RunID); err != nil {
		return p, fmt.Errorf("%w: run id: %v", errMalformed, err)
	}
	if p.Reactor == "" {
		return p, fmt.Errorf("%w: no reactor name", errMalformed)
	}
	return p, nil
}
