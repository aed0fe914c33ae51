package envflag

import (
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/goreactor/goreactor/internal/redisurl"
)

func TestDefaultsValuesAndErrors(t *testing.T) {
	vars := map[string]string{"S": "x", "N": "7", "D": "2s", "BADN": "seven", "BADD": "soon"}
	e := New(func(k string) string { return vars[k] })
	if got := e.String("S", "d"); got != "x" {
		t.Errorf("String set: %q", got)
	}
	if got := e.String("UNSET", "d"); got != "d" {
		t.Errorf("String unset: %q", got)
	}
	if got := e.Int("N", 1); got != 7 {
		t.Errorf("Int set: %d", got)
	}
	if got := e.Duration("D", time.Second); got != 2*time.Second {
		t.Errorf("Duration set: %s", got)
	}
	if e.Err() != nil {
		t.Fatalf("no error yet: %v", e.Err())
	}
	if got := e.Int("BADN", 3); got != 3 {
		t.Errorf("Int malformed keeps the default: %d", got)
	}
	if got := e.Duration("BADD", time.Minute); got != time.Minute {
		t.Errorf("Duration malformed keeps the default: %s", got)
	}
	err := e.Err()
	if err == nil || !strings.Contains(err.Error(), `BADN="seven"`) || !strings.Contains(err.Error(), `BADD="soon"`) {
		t.Fatalf("errors name both variables: %v", err)
	}
}

// -redis and -redis-cluster default to their variables and record who
// named the Redis; -h shows the defaults with their passwords redacted.
func TestRedis(t *testing.T) {
	env := map[string]string{"REDIS_URL": "redis://:pw@r:1/0", "REDIS_CLUSTER_ADDRS": "redis://:pw@a:1"}
	var target redisurl.Target
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var usage strings.Builder
	fs.SetOutput(&usage)
	Redis(fs, New(func(k string) string { return env[k] }), &target, redisurl.DefaultURL)
	if target != (redisurl.Target{URL: "redis://:pw@r:1/0", URLFrom: "REDIS_URL", Cluster: "redis://:pw@a:1", ClusterFrom: "REDIS_CLUSTER_ADDRS"}) {
		t.Fatalf("from env: %+v", target)
	}
	fs.PrintDefaults()
	if strings.Contains(usage.String(), ":pw@") || !strings.Contains(usage.String(), "redis://:xxxxx@r:1/0") {
		t.Errorf("-h shows a password, or no default:\n%s", usage.String())
	}
	if err := fs.Parse([]string{"-redis", ""}); err != nil {
		t.Fatal(err)
	}
	if target.URLFrom != "" || !target.Named() { // the cluster still names one
		t.Errorf("-redis \"\" still names a URL: %+v", target)
	}

	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	Redis(fs, New(func(k string) string { return env[k] }), &target, "")
	if err := fs.Parse([]string{"-redis", "redis://x:2/0", "-redis-cluster", "b:2"}); err != nil {
		t.Fatal(err)
	}
	if target != (redisurl.Target{URL: "redis://x:2/0", URLFrom: "-redis", Cluster: "b:2", ClusterFrom: "-redis-cluster"}) {
		t.Errorf("flags over env: %+v", target)
	}
	if _, err := target.Parse(); err == nil || !strings.Contains(err.Error(), "ambiguous") {
		t.Errorf("both named: %v", err)
	}
}
