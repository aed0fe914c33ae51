package worker

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/payload"
)

// The dashboard's workers view reads a control task's run and action with
// payload.DecodeControlHead: the worker's payload keeps those fields under
// those names.
func TestControlPayloadHeadDecodes(t *testing.T) {
	b, err := codec.Marshal(controlPayload{RunID: "order-7", Action: ActionUndoSteps, Version: 4, Steps: []string{"pay"}})
	require.NoError(t, err)
	head, err := payload.DecodeControlHead(b)
	require.NoError(t, err)
	require.Equal(t, payload.ControlHead{RunID: "order-7", Action: "undo_steps"}, head)
}
