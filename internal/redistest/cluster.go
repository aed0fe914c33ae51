package redistest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// ClusterConfig says what NewCluster and LaunchCluster start.
type ClusterConfig struct {
	// Masters is the number of masters; the slots are split evenly among
	// them. Default 3, the fewest a Redis Cluster accepts.
	Masters int
	// Replicas is the number of replicas of each master. Default 0.
	Replicas int
	// NodeTimeout is each node's cluster-node-timeout: how long a master
	// must be unreachable before the others mark it failed and one of its
	// replicas is promoted. Default 5s.
	NodeTimeout time.Duration
	// ReadyTimeout bounds the wait until the cluster is ready (see
	// LaunchCluster). Default 30s.
	ReadyTimeout time.Duration
	// Dir is the directory the nodes keep their files and logs in, one
	// subdirectory each. Default: a new temporary directory, which Stop
	// removes.
	Dir string
}

// WithDefaults returns cfg with every zero field set to its default.
func (cfg ClusterConfig) WithDefaults() ClusterConfig {
	if cfg.Masters == 0 {
		cfg.Masters = 3
	}
	if cfg.NodeTimeout == 0 {
		cfg.NodeTimeout = 5 * time.Second
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	return cfg
}

func (cfg ClusterConfig) validate() error {
	if cfg.Masters < 3 {
		return fmt.Errorf("redistest: a cluster needs at least 3 masters, not %d", cfg.Masters)
	}
	if cfg.Replicas < 0 {
		return fmt.Errorf("redistest: %d replicas per master", cfg.Replicas)
	}
	return nil
}

// Cluster is a Redis Cluster of redis-server processes on 127.0.0.1,
// started by NewCluster or LaunchCluster.
type Cluster struct {
	// Addrs is every node's address, the masters first, in the order they
	// were started. A failover changes the roles, not this list.
	Addrs []string

	cfg    ClusterConfig
	dir    string
	ownDir bool
	nodes  map[string]*clusterNode
	// replicasOf is each master's replicas, as started.
	replicasOf map[string][]string

	stopOnce sync.Once
}

type clusterNode struct {
	addr string
	mu   sync.Mutex
	proc *process // nil once killed
}

func (n *clusterNode) kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		n.proc.kill()
		n.proc = nil
	}
}

func (n *clusterNode) alive() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil
}

// StartCluster starts a Redis Cluster of three masters without replicas
// (NewCluster with a zero ClusterConfig) and returns its nodes' addresses.
func StartCluster(t testing.TB) []string {
	t.Helper()
	return NewCluster(t, ClusterConfig{}).Addrs
}

// NewCluster starts a Redis Cluster for this test (see LaunchCluster), in a
// t.TempDir() unless cfg.Dir is set, and kills its nodes in t.Cleanup. The
// test is skipped if redis-server or redis-cli is not on PATH.
func NewCluster(t testing.TB, cfg ClusterConfig) *Cluster {
	t.Helper()
	requireBinaries(t, "redis-server", "redis-cli")
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	c, err := LaunchCluster(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

// LaunchCluster starts cfg.Masters masters and cfg.Replicas replicas of
// each on free ports of 127.0.0.1, each node in its own directory under
// cfg.Dir, joins them (redis-cli --cluster create for the masters, CLUSTER
// MEET and CLUSTER REPLICATE for the replicas), and waits until every node
// reports cluster_state:ok, knows every other node and every replica as
// one, and every replica's link to its master is up (INFO replication), so
// that a master killed afterwards has a replica in sync to promote. It is
// NewCluster for a program: the caller stops the cluster (Stop), which it
// also does itself when it fails. The nodes get SIGKILL if the calling
// process dies first (Linux).
func LaunchCluster(cfg ClusterConfig) (_ *Cluster, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return nil, fmt.Errorf("redistest: %s not on PATH (apt-get install -y redis-server)", bin)
		}
	}
	c := &Cluster{cfg: cfg, dir: cfg.Dir, nodes: map[string]*clusterNode{}, replicasOf: map[string][]string{}}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "redistest-cluster-"); err != nil {
			return nil, fmt.Errorf("redistest: %w", err)
		}
		c.ownDir = true
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	total := cfg.Masters * (1 + cfg.Replicas)
	for range total {
		addr, err := c.startNode()
		if err != nil {
			return nil, err
		}
		c.Addrs = append(c.Addrs, addr)
	}
	masters := c.Addrs[:cfg.Masters]

	args := append([]string{"--cluster", "create"}, masters...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), cfg.ReadyTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}

	deadline := time.Now().Add(cfg.ReadyTimeout)
	for i, replica := range c.Addrs[cfg.Masters:] {
		master := masters[i%cfg.Masters]
		if err := attach(replica, master, deadline); err != nil {
			return nil, err
		}
		c.replicasOf[master] = append(c.replicasOf[master], replica)
	}
	if err := c.waitReady(deadline, true); err != nil {
		return nil, err
	}
	return c, nil
}

// startNode starts one cluster-enabled redis-server in a directory of its
// own and returns its address.
func (c *Cluster) startNode() (string, error) {
	var err error
	for range 3 { // a free port can be taken before redis-server binds it
		var port int
		if port, err = freePort(); err != nil {
			continue
		}
		dir := filepath.Join(c.dir, "node-"+strconv.Itoa(port))
		if err = os.MkdirAll(dir, 0o755); err != nil {
			return "", fmt.Errorf("redistest: %w", err)
		}
		var p *process
		p, err = startRedis(dir, port,
			"--save", "", "--appendonly", "no",
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(c.cfg.NodeTimeout.Milliseconds(), 10),
			// A replica's first sync starts at once, not after the 5s
			// default wait for more replicas to share it.
			"--repl-diskless-sync-delay", "0")
		if err == nil {
			c.nodes[p.addr] = &clusterNode{addr: p.addr, proc: p}
			return p.addr, nil
		}
	}
	return "", err
}

// attach makes replica a replica of master: it meets the cluster through
// master, then, once it knows master's node id, replicates it.
func attach(replica, master string, deadline time.Time) error {
	id, err := command(master, time.Second, "CLUSTER", "MYID")
	if err != nil {
		return fmt.Errorf("redistest: CLUSTER MYID on %s: %w", master, err)
	}
	host, port, _ := strings.Cut(master, ":")
	if _, err := command(replica, time.Second, "CLUSTER", "MEET", host, port); err != nil {
		return fmt.Errorf("redistest: CLUSTER MEET %s from %s: %w", master, replica, err)
	}
	for {
		// Refused with "Unknown node" until the handshake has told the
		// replica master's id.
		_, err := command(replica, time.Second, "CLUSTER", "REPLICATE", id)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: CLUSTER REPLICATE %s (%s) on %s: %w", id, master, replica, err)
		}
		time.Sleep(pollInterval)
	}
}

// Ready waits up to timeout until every live node reports cluster_state:ok
// and every live replica's link to its master is up: after a failover (a
// master killed and its replica promoted), the cluster serves every slot
// again. It returns an error naming the first node that is not ready.
func (c *Cluster) Ready(timeout time.Duration) error {
	return c.waitReady(time.Now().Add(timeout), false)
}

// waitReady polls every live node until deadline. With full set, it also
// wants the topology as started: every node known to every node, and every
// master with its replicas attached.
func (c *Cluster) waitReady(deadline time.Time, full bool) error {
	for _, addr := range c.Addrs {
		n := c.nodes[addr]
		if !n.alive() {
			continue
		}
		for {
			why := c.notReady(addr, full)
			if why == "" {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("redistest: cluster node %s not ready: %s\n%s", addr, why,
					readTail(filepath.Join(c.dir, "node-"+portOf(addr), "redis-"+portOf(addr)+".log")))
			}
			time.Sleep(pollInterval)
		}
	}
	return nil
}

// notReady returns why node addr is not ready, or "".
func (c *Cluster) notReady(addr string, full bool) string {
	info, err := command(addr, time.Second, "CLUSTER", "INFO")
	if err != nil {
		return "CLUSTER INFO: " + err.Error()
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return "cluster_state is not ok"
	}
	repl, err := command(addr, time.Second, "INFO", "replication")
	if err != nil {
		return "INFO replication: " + err.Error()
	}
	fields := infoFields(repl)
	if fields["role"] == "slave" && fields["master_link_status"] != "up" {
		return "its link to its master is " + fields["master_link_status"]
	}
	if !full {
		return ""
	}
	if slices.Contains(c.Masters(), addr) {
		if got, want := fields["connected_slaves"], strconv.Itoa(c.cfg.Replicas); got != want {
			return "a master with " + got + " replicas attached, want " + want
		}
	}
	nodes, err := command(addr, time.Second, "CLUSTER", "NODES")
	if err != nil {
		return "CLUSTER NODES: " + err.Error()
	}
	known, replicas := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		known++
		if strings.Contains(f[2], "slave") {
			replicas++
		}
	}
	if want := len(c.Addrs); known != want {
		return fmt.Sprintf("it knows %d nodes, want %d", known, want)
	}
	if want := c.cfg.Masters * c.cfg.Replicas; replicas != want {
		return fmt.Sprintf("it knows %d replicas, want %d", replicas, want)
	}
	return ""
}

// Masters returns the masters' addresses as started.
func (c *Cluster) Masters() []string {
	return c.Addrs[:c.cfg.Masters]
}

// ReplicasOf returns the replicas master was started with.
func (c *Cluster) ReplicasOf(master string) []string {
	return append([]string(nil), c.replicasOf[master]...)
}

// Kill stops node addr with SIGKILL, as a crash would, and waits for it to
// exit; a killed master's replica is promoted after NodeTimeout (see
// Ready). Kill is a no-op for a node already killed.
func (c *Cluster) Kill(addr string) error {
	n, ok := c.nodes[addr]
	if !ok {
		return fmt.Errorf("redistest: %s is not a node of this cluster (%v)", addr, c.Addrs)
	}
	n.kill()
	return nil
}

// Dir returns the directory of the nodes' files and logs.
func (c *Cluster) Dir() string { return c.dir }

// Stop kills every node and, when LaunchCluster created the directory,
// removes it. It is idempotent.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		for _, n := range c.nodes {
			n.kill()
		}
		if c.ownDir {
			_ = os.RemoveAll(c.dir)
		}
	})
}

// infoFields parses an INFO reply's "name:value" lines.
func infoFields(info string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			out[k] = v
		}
	}
	return out
}

func portOf(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return addr
	}
	return addr[i+1:]
}
