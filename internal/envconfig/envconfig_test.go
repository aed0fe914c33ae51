package envconfig

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func envOf(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestPrefixAndQueueFromTheEnvironment(t *testing.T) {
	for _, tc := range []struct {
		env           map[string]string
		prefix, queue string
	}{
		{env: nil, prefix: "goreactor", queue: "goreactor"},
		{env: map[string]string{PrefixVar: "shop", QueueVar: "orders"}, prefix: "shop", queue: "orders"},
		{env: map[string]string{PrefixVar: " ", QueueVar: " , "}, prefix: "goreactor", queue: "goreactor"},
		{env: map[string]string{QueueVar: " critical:6, goreactor:3"}, prefix: "goreactor", queue: "critical"},
		{env: map[string]string{QueueVar: ",low"}, prefix: "goreactor", queue: "low"},
	} {
		if got := PrefixFrom(envOf(tc.env)); got != tc.prefix {
			t.Errorf("%v: prefix %q, want %q", tc.env, got, tc.prefix)
		}
		if got := QueueFrom(envOf(tc.env)); got != tc.queue {
			t.Errorf("%v: queue %q, want %q", tc.env, got, tc.queue)
		}
	}
}

func TestParseQueues(t *testing.T) {
	queues, first, err := ParseQueues("critical:6, goreactor:3,low")
	if err != nil || first != "critical" || !maps.Equal(queues, map[string]int{"critical": 6, "goreactor": 3, "low": 1}) {
		t.Errorf("got %v %q %v", queues, first, err)
	}
	names, err := QueueNames("critical:6, goreactor:3,low")
	if err != nil || !slices.Equal(names, []string{"critical", "goreactor", "low"}) {
		t.Errorf("names %q, %v", names, err)
	}
	for in, want := range map[string]string{"a:0": "priority", "a:x": "priority", "a,a:2": "twice", " , ": "no queue", ":3": "empty name"} {
		if _, _, err := ParseQueues(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one mentioning %q", in, err, want)
		}
		if _, err := QueueNames(in); err == nil {
			t.Errorf("QueueNames(%q) accepted", in)
		}
	}
}
