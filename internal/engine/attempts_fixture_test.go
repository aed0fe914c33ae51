package engine

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
)

// stateOfThreeRetriedSteps is the stored state (305 bytes) of a completed
// run of three steps that each took three attempts, as the engine wrote it
// before steps kept attempt logs: each step record holds its attempt count
// and times, and nothing else of its attempts.
const stateOfThreeRetriedSteps = "8ba26964a466782d31a172a766697874757265a26466b062373835363137623832643030623961a2647601a173a9636f6d706c65746564a2696e81a56f72646572a36f2d31a2737483a77265736572766585a173a4646f6e65a176aa726573657276652d6f6ba16103a27361d3000001a23ab4902ea26661d3000001a23ab4902fa663686172676585a173a4646f6e65a176a96368617267652d6f6ba16103a27361d3000001a23ab4902fa26661d3000001a23ab49030a47368697085a173a4646f6e65a176a7736869702d6f6ba16103a27361d3000001a23ab49030a26661d3000001a23ab49031a3636c6bd3000001a23ab49031a27472d9203330376664306438326433613037323363303939623033353938303266613733a163d3000001a23ab4902ea174d3000001a23ab49031"

// A state written before attempt logs decodes: its steps show their
// attempt counts and times, with no log (their attempts were not kept),
// and writing it again adds nothing.
func TestStateWithoutAttemptLogsDecodes(t *testing.T) {
	data, err := hex.DecodeString(stateOfThreeRetriedSteps)
	require.NoError(t, err)
	var st runState
	require.NoError(t, codec.Unmarshal(data, &st))
	require.Equal(t, StatusCompleted, st.Status)
	require.Empty(t, st.Tries)
	run := st.view(nil, 1)
	require.Len(t, run.Steps, 3)
	for _, s := range run.Steps {
		require.Equal(t, 3, s.Attempts, s.Name)
		require.False(t, s.StartedAt.IsZero(), s.Name)
		require.Empty(t, s.AttemptLog.Attempts, "%s: three attempts, none kept: none made up", s.Name)
		require.Nil(t, s.AttemptLog.Args, s.Name)
	}
	require.Equal(t, []string{"reserve", "charge", "ship"}, run.Completed, "by start")
	require.Empty(t, run.Attempted)
	again, err := codec.Marshal(&st)
	require.NoError(t, err)
	// The same length and, decoded, the same state: a map's keys may come
	// out in another order, nothing is added.
	require.Len(t, again, len(data), "the old state encodes to as many bytes")
	var back runState
	require.NoError(t, codec.Unmarshal(again, &back))
	require.Equal(t, st, back)
}
