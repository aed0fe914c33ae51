package dashboard_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/reactor"
)

// valuesStatus is what these tests read of GET .../rollback-status.
type valuesStatus struct {
	Sensitive      bool `json:"sensitive"`
	ValuesRedacted bool `json:"values_redacted"`
	Entries        []struct {
		Step           string `json:"step"`
		Expected       string `json:"expected"`
		ExpectedValue  string `json:"expected_value"`
		ObservedValue  string `json:"observed_value"`
		RestoreToValue string `json:"restore_to_value"`
	} `json:"entries"`
	ActionRequired []struct {
		Expected       string `json:"expected"`
		Observed       string `json:"observed"`
		RestoreTo      string `json:"restore_to"`
		ExpectedValue  string `json:"expected_value"`
		ObservedValue  string `json:"observed_value"`
		RestoreToValue string `json:"restore_to_value"`
	} `json:"action_required"`
	ActionRequiredText string `json:"action_required_text"`
}

type valuesDetail struct {
	Sensitive      bool           `json:"sensitive"`
	InputsRedacted bool           `json:"inputs_redacted"`
	Inputs         map[string]any `json:"inputs"`
}

// getAs GETs path with token ("" for none), requires 200, decodes into out
// and returns the body.
func getAs(t *testing.T, e *env, path, token string, out any) string {
	t.Helper()
	res := e.do(http.MethodGet, path, token, "")
	require.Equal(t, http.StatusOK, res.code, "GET %s: %s", path, res.body)
	require.NoError(t, json.Unmarshal(res.body, out), "%s", res.body)
	return string(res.body)
}

// A sensitive run's inputs and guarded-undo values are shown only to a
// request carrying the dashboard's token; without it (or with a wrong one)
// they are replaced and the answer says so. The fingerprints are shown to
// everyone, and a run that is not sensitive shows its values to everyone.
func TestSensitiveRunValuesNeedTheToken(t *testing.T) {
	t.Parallel()
	const token = "s3cret"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 30*time.Second)
	f := dashboard.NewGuardFixtureWith(e.rdb, "sens-guard", e.prefix+":email",
		reactor.Input[string]("card", reactor.Sensitive()))
	id, err := f.RunInputs(ctx, e.engine, "sens-run", map[string]any{"card": "4111-1111-1111-1111"})
	require.NoError(t, err)

	shown := func(t *testing.T, s valuesStatus) {
		t.Helper()
		require.True(t, s.Sensitive)
		require.False(t, s.ValuesRedacted)
		require.Len(t, s.ActionRequired, 1)
		a := s.ActionRequired[0]
		require.Equal(t, `"`+dashboard.GuardNewer+`"`, a.ExpectedValue)
		require.Equal(t, `"`+dashboard.GuardClobbered+`"`, a.ObservedValue)
		require.Equal(t, `"`+dashboard.GuardNew+`"`, a.RestoreToValue)
		require.Contains(t, s.ActionRequiredText, `"`+dashboard.GuardClobbered+`"`)
	}
	redacted := func(t *testing.T, s valuesStatus, body string) {
		t.Helper()
		require.True(t, s.Sensitive)
		require.True(t, s.ValuesRedacted)
		require.Len(t, s.ActionRequired, 1)
		a := s.ActionRequired[0]
		require.Equal(t, [3]string{reactor.RedactedValue, reactor.RedactedValue, reactor.RedactedValue},
			[3]string{a.ExpectedValue, a.ObservedValue, a.RestoreToValue})
		require.NotEmpty(t, a.Expected)
		require.NotEmpty(t, a.Observed, "the fingerprints are shown")
		require.NotEmpty(t, a.RestoreTo)
		for _, en := range s.Entries {
			for _, v := range []string{en.ExpectedValue, en.ObservedValue, en.RestoreToValue} {
				require.Contains(t, []string{"", reactor.RedactedValue}, v, en.Step)
			}
		}
		// The observed value appears nowhere (the labels name the other two).
		require.NotContains(t, body, dashboard.GuardClobbered)
		require.Contains(t, s.ActionRequiredText, reactor.RedactedValue)
	}

	path := "/api/runs/" + id + "/rollback-status"
	var s valuesStatus
	body := getAs(t, e, path, "", &s)
	redacted(t, s, body)
	s = valuesStatus{}
	body = getAs(t, e, path, "wrong", &s)
	redacted(t, s, body)
	s = valuesStatus{}
	getAs(t, e, path, token, &s)
	shown(t, s)

	var d valuesDetail
	body = getAs(t, e, "/api/runs/"+id, "", &d)
	require.True(t, d.Sensitive)
	require.True(t, d.InputsRedacted)
	require.Equal(t, map[string]any{"card": reactor.RedactedValue}, d.Inputs)
	require.NotContains(t, body, "4111")
	d = valuesDetail{}
	getAs(t, e, "/api/runs/"+id, token, &d)
	require.True(t, d.Sensitive)
	require.False(t, d.InputsRedacted)
	require.Equal(t, map[string]any{"card": "4111-1111-1111-1111"}, d.Inputs)

	// The queue of work redacts alike.
	var page struct {
		Runs []struct {
			ID             string           `json:"id"`
			Sensitive      bool             `json:"sensitive"`
			ValuesRedacted bool             `json:"values_redacted"`
			ActionRequired []map[string]any `json:"action_required"`
		} `json:"runs"`
	}
	body = getAs(t, e, "/api/needs-human", "", &page)
	require.Len(t, page.Runs, 1)
	require.True(t, page.Runs[0].Sensitive)
	require.True(t, page.Runs[0].ValuesRedacted)
	require.Equal(t, reactor.RedactedValue, page.Runs[0].ActionRequired[0]["observed_value"])
	require.NotContains(t, body, dashboard.GuardClobbered)
	page.Runs = nil
	getAs(t, e, "/api/needs-human", token, &page)
	require.False(t, page.Runs[0].ValuesRedacted)
	require.Equal(t, `"`+dashboard.GuardClobbered+`"`, page.Runs[0].ActionRequired[0]["observed_value"])

	// A resolution (which needs the token) answers with the values.
	res := e.do(http.MethodPost, "/api/runs/"+id+"/entries/book%2Ffix2%232/resolve", token,
		`{"kind": "left_applied", "note": "the support desk's address stays"}`)
	require.Equal(t, http.StatusOK, res.code, "%s", res.body)
	s = valuesStatus{}
	require.NoError(t, json.Unmarshal(res.body, &s))
	require.False(t, s.ValuesRedacted)
	for _, en := range s.Entries {
		if en.Step == "book/fix2" {
			require.Equal(t, `"`+dashboard.GuardClobbered+`"`, en.ObservedValue)
		}
	}

	// A run that is not sensitive shows its values without the token.
	plain := dashboard.NewGuardFixture(e.rdb, "plain-guard", e.prefix+":email2")
	pid, err := plain.Run(ctx, e.engine, "plain-run")
	require.NoError(t, err)
	s = valuesStatus{}
	getAs(t, e, "/api/runs/"+pid+"/rollback-status", "", &s)
	require.False(t, s.Sensitive)
	require.False(t, s.ValuesRedacted)
	require.Equal(t, `"`+dashboard.GuardClobbered+`"`, s.ActionRequired[0].ObservedValue)
	d = valuesDetail{}
	getAs(t, e, "/api/runs/"+pid, "", &d)
	require.False(t, d.Sensitive)
	require.False(t, d.InputsRedacted)
}

// With no token configured nobody holds one: a sensitive run's values are
// always redacted.
func TestSensitiveRunValuesWithoutAConfiguredToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	f := dashboard.NewGuardFixtureWith(e.rdb, "sens-guard-nt", e.prefix+":email",
		reactor.Input[string]("card", reactor.Sensitive()))
	id, err := f.RunInputs(ctx, e.engine, "sens-run-nt", map[string]any{"card": "4111"})
	require.NoError(t, err)
	var s valuesStatus
	body := getAs(t, e, "/api/runs/"+id+"/rollback-status", "anything", &s)
	require.True(t, s.ValuesRedacted)
	require.NotContains(t, body, dashboard.GuardClobbered)
	var d valuesDetail
	getAs(t, e, "/api/runs/"+id, "anything", &d)
	require.True(t, d.InputsRedacted)
}
