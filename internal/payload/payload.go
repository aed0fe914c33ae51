// Package payload is the wire format of goreactor's asynq tasks: what a
// worker decodes from a run, element or rollback task, validated, so that a
// malformed payload is archived with its reason instead of retried. Task
// types are package worker's (TypeRun, TypeElement, TypeRollback,
// TypeControl). It also holds what the dashboard's workers view reads: the
// head of a control task (ControlHead) and the record a worker publishes
// about itself (WorkerRecord).
package payload

import (
	"errors"
	"fmt"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/keys"
)

// RollbackPayload is the payload of a rollback task (msgpack).
type RollbackPayload struct {
	MapID string `msgpack:"map"`
	Gen   int    `msgpack:"gen"`
	Pos   int    `msgpack:"pos"`
	Index int    `msgpack:"i"`
	// Meta, Fwd and Total: maptask.RollbackTask's; absent in tasks
	// enqueued before they were carried.
	Meta  codec.Raw `msgpack:"m,omitempty"`
	Fwd   codec.Raw `msgpack:"f,omitempty"`
	Total int       `msgpack:"n,omitempty"`
	WA    int64     `msgpack:"wa,omitempty"`
	// TP is the W3C traceparent of the span that enqueued the task, "" when
	// it had none.
	TP string `msgpack:"tp,omitempty"`
}

// DecodeRollback decodes and validates a rollback task's payload.
func DecodeRollback(b []byte) (RollbackPayload, error) {
	var p RollbackPayload
	if err := codec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := keys.ValidateID(p.MapID); err != nil {
		return p, fmt.Errorf("%w: map id: %v", ErrMalformed, err)
	}
	if p.Pos < 0 || p.Gen < 1 || p.Index < 0 {
		return p, fmt.Errorf("%w: rollback position %d, generation %d", ErrMalformed, p.Pos, p.Gen)
	}
	return p, nil
}

// ElementPayload is the payload of an element task (msgpack).
type ElementPayload struct {
	MapID string    `msgpack:"map"`
	Index int       `msgpack:"i"`
	Input codec.Raw `msgpack:"in"`
	// Meta is the map's immutable metadata (maptask.ElementTask.Meta);
	// absent in tasks enqueued before it was carried.
	Meta codec.Raw `msgpack:"m,omitempty"`
	// TP is the W3C traceparent of the span that enqueued the task, "" when
	// it had none.
	TP string `msgpack:"tp,omitempty"`
}

// DecodeElement decodes and validates an element task's payload.
func DecodeElement(b []byte) (ElementPayload, error) {
	var p ElementPayload
	if err := codec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := keys.ValidateID(p.MapID); err != nil {
		return p, fmt.Errorf("%w: map id: %v", ErrMalformed, err)
	}
	if p.Index < 0 {
		return p, fmt.Errorf("%w: negative element index %d", ErrMalformed, p.Index)
	}
	return p, nil
}

// RunPayload is the payload of a run task (msgpack).
type RunPayload struct {
	RunID   string `msgpack:"run"`
	Reactor string `msgpack:"reactor"`
	// TP is the W3C traceparent of the span that enqueued the task, "" when
	// it had none.
	TP string `msgpack:"tp,omitempty"`
}

// EncodeRun encodes a run task's payload.
func EncodeRun(p RunPayload) ([]byte, error) { return codec.Marshal(p) }

// ErrMalformed marks a payload that no retry can fix.
var ErrMalformed = errors.New("worker: malformed payload")

// DecodeRun decodes and validates a run task's payload.
func DecodeRun(b []byte) (RunPayload, error) {
	var p RunPayload
	if err := codec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := keys.ValidateID(p.RunID); err != nil {
		return p, fmt.Errorf("%w: run id: %v", ErrMalformed, err)
	}
	if p.Reactor == "" {
		return p, fmt.Errorf("%w: no reactor name", ErrMalformed)
	}
	return p, nil
}

// ControlHead is the part of a control task's payload that says what it
// asks (package worker's controlPayload holds the rest): what a reader of
// asynq's active tasks shows, without the worker's validation.
type ControlHead struct {
	RunID  string `msgpack:"run"`
	Action string `msgpack:"action"`
}

// DecodeControlHead decodes the head of a control task's payload.
func DecodeControlHead(b []byte) (ControlHead, error) {
	var p ControlHead
	if err := codec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := keys.ValidateID(p.RunID); err != nil {
		return p, fmt.Errorf("%w: run id: %v", ErrMalformed, err)
	}
	return p, nil
}
