package store_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/store"
)

// TestAuditRidesOnTheFencedWrite: the entries a write carries are appended
// to the target's stream in order, stamped with the server's time, only when
// the write lands; a terminal write expires the stream with the state and a
// later live write makes it persistent again.
func TestAuditRidesOnTheFencedWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, target := range []store.Target{f.st.RunTarget("r1"), f.st.ElemTarget("m.0")} {
		t.Run(target.Audit, func(t *testing.T) {
			f.create(t, target, "tok-a", data1)
			one := store.WriteOptions{Audit: [][]string{{"k", "eligible", "step", "a"}, {"k", "eligible", "step", "b", "o", "2"}}}
			_, err := f.st.Write(f.ctx, target, "tok-a", 1, data2, one)
			require.NoError(t, err)

			// Refused writes append nothing: a stale version, a lost lock.
			_, err = f.st.Write(f.ctx, target, "tok-a", 1, data2, store.WriteOptions{Audit: [][]string{{"k", "stale"}}})
			var vc *store.VersionConflictError
			require.ErrorAs(t, err, &vc)
			_, err = f.st.Write(f.ctx, target, "tok-b", 2, data2, store.WriteOptions{Audit: [][]string{{"k", "thief"}}})
			require.ErrorIs(t, err, store.ErrLockNotHeld)
			// A write without entries leaves the stream alone.
			_, err = f.st.Write(f.ctx, target, "tok-a", 2, data2, store.WriteOptions{})
			require.NoError(t, err)

			recs, err := f.st.ReadAudit(f.ctx, target.Audit)
			require.NoError(t, err)
			require.Len(t, recs, 2)
			srv, err := f.rdb.Time(f.ctx).Result()
			require.NoError(t, err)
			for _, r := range recs {
				ts, err := strconv.ParseInt(r.Fields["ts"], 10, 64)
				require.NoError(t, err)
				require.InDelta(t, srv.UnixMilli(), ts, float64(time.Minute.Milliseconds()), "ts is the server's clock")
				delete(r.Fields, "ts")
			}
			require.Equal(t, map[string]string{"k": "eligible", "step": "a"}, recs[0].Fields)
			require.Equal(t, map[string]string{"k": "eligible", "step": "b", "o": "2"}, recs[1].Fields)
			require.Less(t, recs[0].ID, recs[1].ID)
			require.Equal(t, noTTL, f.pttl(t, target.Audit))

			_, err = f.st.Write(f.ctx, target, "tok-a", 3, data3, store.WriteOptions{Retention: time.Hour,
				Audit: [][]string{{"k", "rollback_completed"}}})
			require.NoError(t, err)
			ttl := f.pttl(t, target.Audit)
			require.Greater(t, ttl, time.Duration(0), "a terminal write expires the stream with the state")
			require.LessOrEqual(t, ttl, time.Hour)

			_, err = f.st.Write(f.ctx, target, "tok-a", 4, data1, store.WriteOptions{Audit: [][]string{{"k", "rollback_started"}}})
			require.NoError(t, err)
			require.Equal(t, noTTL, f.pttl(t, target.Audit), "a live run's stream never expires")
			recs, err = f.st.ReadAudit(f.ctx, target.Audit)
			require.NoError(t, err)
			require.Len(t, recs, 4)

			_, err = f.st.Write(f.ctx, target, "tok-a", 5, data1, store.WriteOptions{Audit: [][]string{{"k"}}})
			require.ErrorContains(t, err, "odd number")
		})
	}
}

// TestAuditIsCapped: XADD trims the stream to about AuditCap entries, the
// oldest going first.
func TestAuditIsCapped(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("capped")
	f.create(t, target, "tok", data1)
	const per = 1000
	v := int64(1)
	for w := 0; w < store.AuditCap/per+2; w++ {
		batch := make([][]string, per)
		for i := range batch {
			batch[i] = []string{"n", strconv.Itoa(w*per + i)}
		}
		_, err := f.st.Write(f.ctx, target, "tok", v, data2, store.WriteOptions{Audit: batch})
		require.NoError(t, err)
		v++
	}
	n, err := f.rdb.XLen(f.ctx, target.Audit).Result()
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(store.AuditCap))
	require.Less(t, n, int64(store.AuditCap+per), "trimmed to about the cap")
	first, err := f.rdb.XRangeN(f.ctx, target.Audit, "-", "+", 1).Result()
	require.NoError(t, err)
	require.NotEqual(t, "0", first[0].Values["n"], "the oldest entries went first")
}
