package engine_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// TestRollbackReportJSON pins the report's JSON shape (the dashboard's
// rollback-status API serves it as is).
func TestRollbackReportJSON(t *testing.T) {
	t.Parallel()
	at := time.UnixMilli(1_700_000_000_000).UTC()
	entries := []engine.RollbackEntry{
		{Order: 1, Step: "c", Ordinal: 3, Status: engine.RollbackFailed, Action: engine.ActionUndo, Attempts: 1,
			StartedAt: at, FinishedAt: at.Add(time.Second), Reason: "x.code", Message: "down", ID: "c#3", Resource: "acct:1"},
		{Order: 2, Step: "email", Status: engine.RollbackNoCompensation, Action: engine.ActionNone, ID: "email#0"},
	}
	r := engine.RollbackReport{RunID: "r", RollbackID: "r:rb:1", Generation: 1, Status: engine.StatusFailed,
		Summary: engine.SummarizeRollback(entries), Entries: entries}
	b, err := json.Marshal(r)
	require.NoError(t, err)
	require.JSONEq(t, `{"run_id":"r","rollback_id":"r:rb:1","generation":1,"status":"failed",
		"summary":{"outcome":"needs_human","settled":true,"total":2,"compensated":0,"outstanding":0,"failed":1,
			"kept":["email"],"needs_human":["c"]},
		"entries":[
			{"order":1,"step":"c","ordinal":3,"status":"compensation_failed","action":"undo","attempts":1,
				"started_at":"2023-11-14T22:13:20Z","finished_at":"2023-11-14T22:13:21Z","reason":"x.code","message":"down",
				"id":"c#3","resource":"acct:1"},
			{"order":2,"step":"email","status":"no_compensation_registered","action":"none","attempts":0,"id":"email#0"}],
		"action_required":null}`, string(b))
}
