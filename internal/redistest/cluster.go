package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// StartCluster starts a Redis Cluster of three masters without replicas on
// free ports, each node in its own temporary directory, and waits up to 20s
// until every node reports cluster_state:ok. It returns the nodes' addresses;
// the nodes are killed in t.Cleanup. The test is skipped if redis-server or
// redis-cli is not on PATH.
func StartCluster(t testing.TB) []string {
	t.Helper()
	requireBinaries(t, "redis-server", "redis-cli")
	addrs := make([]string, 0, 3)
	for range 3 {
		var (
			p   *process
			err error
		)
		for range 3 { // a free port can be taken before redis-server binds it
			var port int
			if port, err = freePort(); err != nil {
				continue
			}
			p, err = startRedis(t.TempDir(), port,
				"--save", "", "--appendonly", "no",
				"--cluster-enabled", "yes",
				"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", port),
				"--cluster-node-timeout", "5000")
			if err == nil {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.kill)
		addrs = append(addrs, p.addr)
	}

	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}

	deadline := time.Now().Add(20 * time.Second)
	for _, addr := range addrs {
		for {
			info, err := command(addr, time.Second, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster node %s not ready after 20s: %q %v", addr, info, err)
			}
			time.Sleep(pollInterval)
		}
	}
	return addrs
}
