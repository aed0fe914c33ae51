package keys

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// slot computes the cluster slot of a key with go-redis's own implementation
// detail replicated: the hashed part is the first {...} section.
func hashTag(key string) string {
	s := -1
	for i := 0; i < len(key); i++ {
		if key[i] == '{' && s < 0 {
			s = i
		} else if key[i] == '}' && s >= 0 {
			return key[s+1 : i]
		}
	}
	return key
}

func TestRunKeysShareOneSlot(t *testing.T) {
	k := New("p")
	id := "order-42"
	tags := map[string]bool{}
	for _, key := range []string{k.RunState(id), k.RunLock(id), k.RunCancel(id), k.RunAudit(id)} {
		tags[hashTag(key)] = true
	}
	require.Equal(t, map[string]bool{"run:order-42": true}, tags)
	require.Equal(t, "p:{run:order-42}:ctx", k.RunState(id))
	require.Equal(t, "p:idx:status:running", k.Status("running"))
	require.Equal(t, "p:idx:reactor:checkout", k.Reactor("checkout"))
	require.Equal(t, "p:idx:rs:checkout:failed", k.ReactorStatus("checkout", "failed"))
	require.Equal(t, "p:idx:reactors", k.Reactors())
	require.Equal(t, "p:idx:ids", k.IDs())
	_ = redis.Nil
}

func TestWorkerRecordsShareOneSlot(t *testing.T) {
	k := New("p")
	require.Equal(t, "p:{workers}:3f2a", k.Worker("3f2a"))
	require.Equal(t, hashTag(k.Worker("a")), hashTag(k.Worker("b")), "one pipeline reads every record")
}

func TestDefaultPrefix(t *testing.T) {
	require.Equal(t, "goreactor:idx:active", New("").Active())
}

func TestValidateID(t *testing.T) {
	require.NoError(t, ValidateID("abc.1"))
	require.Error(t, ValidateID(""))
	require.Error(t, ValidateID("a{b}"))
	require.Error(t, ValidateID(string(make([]byte, 300))))
}

func TestElemKeysShareOneSlot(t *testing.T) {
	k := New("p")
	id := "m1.7"
	for _, key := range []string{k.ElemState(id), k.ElemLock(id), k.ElemCancel(id), k.ElemAudit(id), k.ElemTree(id)} {
		require.Equal(t, "map:m1", hashTag(key), key)
	}
	require.Equal(t, "p:{map:m1}:audit", k.ElemAudit(id))
	require.Equal(t, "p:{map:m1}:el:7:ctx", k.ElemState(id))
	require.Equal(t, hashTag(k.MapMeta("m1")), hashTag(k.ElemLock(id)), "an element's keys share its map's slot")
	// A nested map's element: the last numeric suffix is the index.
	require.Equal(t, "p:{map:r~each.3~inner}:el:12:ctx", k.ElemState("r~each.3~inner.12"))
	// Not an element id: a tag of its own.
	require.Equal(t, "p:{elem:x.y}:ctx", k.ElemState("x.y"))
}
