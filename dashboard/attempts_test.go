package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// attemptsDetail is what these tests read of a run's steps.
type attemptsDetail struct {
	StepsRedacted bool `json:"steps_redacted"`
	Steps         []struct {
		Name            string `json:"name"`
		Status          string `json:"status"`
		Attempts        int    `json:"attempts"`
		Args            any    `json:"args"`
		Result          any    `json:"result"`
		AttemptsDropped int    `json:"attempts_dropped"`
		AttemptLog      []struct {
			Attempt    int    `json:"attempt"`
			StartedAt  string `json:"started_at"`
			EndedAt    string `json:"ended_at"`
			DurationMS int64  `json:"duration_ms"`
			Error      string `json:"error"`
			Retryable  bool   `json:"retryable"`
		} `json:"attempt_log"`
	} `json:"steps"`
}

// flakyCharge fails its first two attempts ("gateway timeout #n") and
// returns a receipt for the card it was given; ship then fails for good.
func flakyCharge(name string, card ...reactor.InputOption) *reactor.Definition {
	var n atomic.Int32
	return reactor.MustDefine(name, reactor.Input[string]("card", card...),
		reactor.Step("charge", reactor.StepConfig[reactor.Args, map[string]string]{
			Args:  reactor.Bindings{"card": reactor.FromInput("card")},
			Retry: reactor.Retry{MaxAttempts: 3},
			Run: func(_ context.Context, a reactor.Args) (map[string]string, error) {
				if k := n.Add(1); k <= 2 {
					return nil, fmt.Errorf("gateway timeout #%d", k)
				}
				c, err := reactor.Arg[string](a, "card")
				return map[string]string{"receipt": "r-" + c}, err
			},
		}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{After: []string{"charge"},
			Args: reactor.Bindings{"card": reactor.FromInput("card")},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("no courier"))
			},
		}))
}

// A run's detail lists each step's attempts (times in RFC 3339 ms UTC, the
// errors, retryable or not) and its args and result decoded; for a
// sensitive run, without the token, the args and results are redacted and
// the attempts are not.
func TestRunDetailAttemptLog(t *testing.T) {
	t.Parallel()
	const token = "att-token"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 30*time.Second)
	for _, tc := range []struct {
		name      string
		sensitive bool
	}{{"plain", false}, {"sensitive", true}} {
		var opts []reactor.InputOption
		if tc.sensitive {
			opts = append(opts, reactor.Sensitive())
		}
		def := flakyCharge("attempts-"+tc.name, opts...)
		id := "att-" + tc.name
		res, err := e.engine.Run(ctx, def, map[string]any{"card": "4111"}, reactor.WithRunID(id))
		require.NoError(t, err)
		require.Equal(t, reactor.StatusFailed, res.Status)

		check := func(t *testing.T, d attemptsDetail, redacted bool) {
			t.Helper()
			require.Len(t, d.Steps, 2)
			charge, ship := d.Steps[0], d.Steps[1]
			require.Equal(t, "charge", charge.Name)
			require.Equal(t, 3, charge.Attempts)
			require.Len(t, charge.AttemptLog, 3)
			prev := ""
			for i, a := range charge.AttemptLog {
				require.Equal(t, i+1, a.Attempt)
				for _, ts := range []string{a.StartedAt, a.EndedAt} {
					at, err := time.Parse("2006-01-02T15:04:05.000Z07:00", ts)
					require.NoError(t, err, ts)
					require.True(t, strings.HasSuffix(ts, "Z"), ts)
					require.Equal(t, at.UTC().Format("2006-01-02T15:04:05.000Z"), ts)
				}
				require.GreaterOrEqual(t, a.EndedAt, a.StartedAt)
				require.GreaterOrEqual(t, a.StartedAt, prev, "in order")
				prev = a.EndedAt
			}
			require.Equal(t, "gateway timeout #1", charge.AttemptLog[0].Error)
			require.Equal(t, "gateway timeout #2", charge.AttemptLog[1].Error)
			require.True(t, charge.AttemptLog[1].Retryable)
			require.Empty(t, charge.AttemptLog[2].Error)
			require.Equal(t, "ship", ship.Name)
			require.Equal(t, "failed", ship.Status)
			require.Len(t, ship.AttemptLog, 1)
			require.Equal(t, "no courier", ship.AttemptLog[0].Error)
			require.False(t, ship.AttemptLog[0].Retryable)
			require.Equal(t, redacted, d.StepsRedacted)
			if redacted {
				require.Equal(t, reactor.RedactedValue, charge.Args)
				require.Equal(t, reactor.RedactedValue, charge.Result)
				require.Equal(t, reactor.RedactedValue, ship.Args)
				require.Nil(t, ship.Result, "nothing to redact")
				return
			}
			require.Equal(t, map[string]any{"card": "4111"}, charge.Args)
			require.Equal(t, map[string]any{"receipt": "r-4111"}, charge.Result)
			require.Equal(t, map[string]any{"card": "4111"}, ship.Args)
		}
		t.Run(tc.name, func(t *testing.T) {
			var d attemptsDetail
			body := getAs(t, e, "/api/runs/"+id, "", &d)
			check(t, d, tc.sensitive)
			if tc.sensitive {
				require.NotContains(t, body, "4111")
				d = attemptsDetail{}
				getAs(t, e, "/api/runs/"+id, token, &d)
				check(t, d, false)
			}
		})
	}
}
