// Package redisurl connects the binaries to the Redis an operator named:
// one node by URL (-redis, REDIS_URL) or a Redis Cluster by its seed nodes
// (-redis-cluster, REDIS_CLUSTER_ADDRS).
//
// A Redis named explicitly that does not answer is an error, never a
// reason to use another one: a worker, sweeper, demo or benchmark silently
// running against a different Redis than the one it was pointed at is
// worse than one that does not start. For the same reason a URL and
// cluster seeds both named is an error, not a precedence rule.
package redisurl

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redisnode"
)

// DefaultURL is the Redis of a binary told of none.
const DefaultURL = "redis://localhost:6379/0"

// The names of the two settings, as flags and environment variables.
const (
	URLFlag     = "-redis"
	URLVar      = "REDIS_URL"
	ClusterFlag = "-redis-cluster"
	ClusterVar  = "REDIS_CLUSTER_ADDRS"
)

// Target is the Redis an operator named: one node by URL, or a Redis
// Cluster by its seed nodes.
type Target struct {
	// URL is one node's redis://[user:password@]host:port/db (rediss://
	// for TLS). "" is DefaultURL.
	URL string
	// URLFrom says where URL came from (URLFlag, URLVar); "" when it was
	// not named (a default), so that Cluster may stand in its place.
	URLFrom string
	// Cluster lists seed nodes of a Redis Cluster, comma-separated: either
	// host:port or redis:// (rediss://) URLs, whose user, password, TLS and
	// options apply to every node. "" for one node.
	Cluster string
	// ClusterFrom says where Cluster came from (ClusterFlag, ClusterVar).
	ClusterFrom string
}

// FromEnv is the Target that REDIS_URL and REDIS_CLUSTER_ADDRS name
// through getenv (an empty variable names nothing), with defURL as the URL
// when REDIS_URL is unset.
func FromEnv(getenv func(string) string, defURL string) Target {
	t := Target{URL: defURL}
	if v := getenv(URLVar); v != "" {
		t.URL, t.URLFrom = v, URLVar
	}
	if v := getenv(ClusterVar); v != "" {
		t.Cluster, t.ClusterFrom = v, ClusterVar
	}
	return t
}

// Named reports whether the operator named a Redis at all: a URL or
// cluster seeds.
func (t Target) Named() bool { return (t.URLFrom != "" && t.URL != "") || t.Cluster != "" }

// Endpoint is a Target parsed and checked, not yet connected.
type Endpoint struct {
	single  *redis.Options        // one node, or nil
	cluster *redis.ClusterOptions // a cluster, or nil
	from    string                // where it was named, for errors
	shown   string                // the URL or the seed list, passwords redacted
}

// Parse checks t: a URL that parses, seeds that do (with db 0 only), and
// not both named. The error names the setting, passwords redacted.
func (t Target) Parse() (*Endpoint, error) {
	if t.Cluster != "" {
		if t.URLFrom != "" && t.URL != "" {
			return nil, fmt.Errorf("%s %s and %s %s are both set: which one wins is ambiguous, "+
				"so neither does; unset one of them (%s/%s for one node, %s/%s for a cluster)",
				t.URLFrom, Redact(t.URL), t.ClusterFrom, RedactList(t.Cluster), URLFlag, URLVar, ClusterFlag, ClusterVar)
		}
		opts, err := parseCluster(t.Cluster)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", t.ClusterFrom, RedactList(t.Cluster), err)
		}
		return &Endpoint{cluster: opts, from: t.ClusterFrom, shown: RedactList(t.Cluster)}, nil
	}
	raw, from := t.URL, t.URLFrom
	if raw == "" {
		raw = DefaultURL
	}
	if from == "" {
		from = "the default " + URLFlag
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w; want redis://[user:password@]host:port/db", from, Redact(raw), err)
	}
	return &Endpoint{single: opts, from: from, shown: Redact(raw)}, nil
}

// parseCluster reads a seed list: host:port,... or redis://...,... (the
// URLs agreeing on everything but the address).
func parseCluster(list string) (*redis.ClusterOptions, error) {
	var seeds []string
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			seeds = append(seeds, s)
		}
	}
	if len(seeds) == 0 {
		return nil, errors.New("no seed node; want host:port or redis://[user:password@]host:port seeds, comma-separated")
	}
	urls := strings.Contains(seeds[0], "://")
	for _, s := range seeds[1:] {
		if strings.Contains(s, "://") != urls {
			return nil, errors.New("mixes URLs and host:port: write every seed the same way")
		}
	}
	if !urls {
		for _, s := range seeds {
			if host, port, err := net.SplitHostPort(s); err != nil || host == "" || port == "" {
				return nil, fmt.Errorf("seed %q: want host:port (or redis:// URLs)", s)
			}
		}
		return &redis.ClusterOptions{Addrs: seeds}, nil
	}

	var opts *redis.ClusterOptions
	var first *url.URL
	for _, s := range seeds {
		u, err := url.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("seed %s: not a URL", Redact(s))
		}
		if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
			return nil, fmt.Errorf("seed %s names db %s: a Redis Cluster has only db 0; drop the /%s", u.Redacted(), db, db)
		}
		o, err := redis.ParseClusterURL(s)
		if err != nil {
			return nil, fmt.Errorf("seed %s: %w; want redis://[user:password@]host:port", u.Redacted(), err)
		}
		if first == nil {
			first, opts = u, o
			continue
		}
		// One user, password, TLS and set of options for every node: a
		// seed that says otherwise would be ignored, so it is refused.
		if u.Scheme != first.Scheme || u.User.String() != first.User.String() || u.RawQuery != first.RawQuery {
			return nil, fmt.Errorf("seed %s differs from %s in scheme, user, password or options: "+
				"they apply to every node, so give the same on each seed", u.Redacted(), first.Redacted())
		}
		opts.Addrs = append(opts.Addrs, o.Addrs...)
	}
	return opts, nil
}

// IsCluster reports whether e is a Redis Cluster.
func (e *Endpoint) IsCluster() bool { return e.cluster != nil }

// String is the URL or the seed list, passwords redacted: for logs.
func (e *Endpoint) String() string { return e.shown }

// Addr is the node's host:port, or the cluster's seeds, comma-separated:
// for logs.
func (e *Endpoint) Addr() string {
	if e.single != nil {
		return e.single.Addr
	}
	return strings.Join(e.cluster.Addrs, ",")
}

// DB is the database number: always 0 on a cluster.
func (e *Endpoint) DB() int {
	if e.single != nil {
		return e.single.DB
	}
	return 0
}

// Pool adjusts the clients NewClient makes; a zero field keeps what the
// URL says (or go-redis' default). On a cluster the pool is per node.
type Pool struct {
	Size        int    // connections at most
	MinIdle     int    // connections kept open
	Name        string // CLIENT SETNAME of every connection
	DialTimeout time.Duration
}

// ClusterStateReload is the longest a cluster client of NewClient keeps a
// slot map before it asks the cluster again (ClusterStateReloadInterval):
// about how long a failover leaves it sending a dead master's slots to the
// dead master. A reload is one CLUSTER SLOTS, and only a client with
// traffic makes it.
const ClusterStateReload = 2 * time.Second

// NewClient returns a client of e, not yet connected: a *redis.Client for
// one node, a *redis.ClusterClient for a cluster.
func (e *Endpoint) NewClient(p Pool) redis.UniversalClient {
	if e.cluster != nil {
		o := *e.cluster
		o.PoolSize, o.MinIdleConns = cmp.Or(p.Size, o.PoolSize), cmp.Or(p.MinIdle, o.MinIdleConns)
		o.ClientName, o.DialTimeout = cmp.Or(p.Name, o.ClientName), cmp.Or(p.DialTimeout, o.DialTimeout)
		// Enough retries of a refused command (TRYAGAIN while a slot
		// moves) to ride out a migration: see reactor.Config.Client.
		o.MaxRedirects = max(o.MaxRedirects, engine.MinClusterRedirects)
		// go-redis reloads its slot map on MOVED, ASK and READONLY, not on
		// a refused connection: after a failover, a client whose last
		// reload came before the promotion goes on sending a dead master's
		// slots to the dead master until its periodic reload, 60 s by
		// default in go-redis v9.23. A failover stalled the maps on those
		// slots for a minute (worker's TestClusterFailoverMidRollback).
		if o.ClusterStateReloadInterval == 0 || o.ClusterStateReloadInterval > ClusterStateReload {
			o.ClusterStateReloadInterval = ClusterStateReload
		}
		return redis.NewClusterClient(&o)
	}
	o := *e.single
	o.PoolSize, o.MinIdleConns = cmp.Or(p.Size, o.PoolSize), cmp.Or(p.MinIdle, o.MinIdleConns)
	o.ClientName, o.DialTimeout = cmp.Or(p.Name, o.ClientName), cmp.Or(p.DialTimeout, o.DialTimeout)
	return redis.NewClient(&o)
}

// Dial parses t and connects to it: see Endpoint.Dial.
func Dial(ctx context.Context, t Target, timeout time.Duration) (redis.UniversalClient, *Endpoint, error) {
	e, err := t.Parse()
	if err != nil {
		return nil, nil, err
	}
	c, err := e.Dial(ctx, timeout)
	if err != nil {
		return nil, nil, err
	}
	return c, e, nil
}

// Dial connects within timeout and checks the Redis: one node must answer
// PING and not be a cluster node (whose keys of other slots would answer
// MOVED); every master of a cluster must answer CLUSTER INFO with
// cluster_state:ok. The error names the Redis, passwords redacted, and
// the setting to change. The caller closes the client.
func (e *Endpoint) Dial(ctx context.Context, timeout time.Duration) (redis.UniversalClient, error) {
	dialTimeout := timeout
	if d := e.dialTimeout(); d > 0 && d < timeout {
		dialTimeout = d
	}
	c := e.NewClient(Pool{DialTimeout: dialTimeout})
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = e.checkCluster(pctx, c, timeout)
	case *redis.Client:
		err = e.checkSingle(pctx, c, timeout)
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

func (e *Endpoint) dialTimeout() time.Duration {
	if e.cluster != nil {
		return e.cluster.DialTimeout
	}
	return e.single.DialTimeout
}

func (e *Endpoint) checkSingle(ctx context.Context, c *redis.Client, timeout time.Duration) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s (%s, db %d) does not answer PING within %s: %w; start it or set %s to a Redis that answers",
			e.shown, e.from, e.single.DB, timeout, err, settingOf(e.from))
	}
	// A server that refuses INFO (an ACL) is given the benefit of the doubt.
	if info, err := c.Info(ctx, "cluster").Result(); err == nil && field(info, "cluster_enabled") == "1" {
		return fmt.Errorf("redis at %s (%s) is a node of a Redis Cluster: name its nodes with %s or %s instead "+
			"(a one-node client is answered MOVED for the other nodes' keys)", e.shown, e.from, ClusterFlag, ClusterVar)
	}
	return nil
}

func (e *Endpoint) checkCluster(ctx context.Context, c *redis.ClusterClient, timeout time.Duration) error {
	var masters atomic.Int32
	err := redisnode.EachMaster(ctx, c, func(ctx context.Context, node *redis.Client) error {
		masters.Add(1)
		return clusterOK(ctx, node)
	})
	if err == nil && masters.Load() == 0 {
		// The seeds answered CLUSTER SLOTS with none (their cluster is
		// not made yet), so go-redis lists no master to ask.
		err = errors.New("no master serves a slot (cluster_state:fail)")
	}
	if err != nil {
		return fmt.Errorf("redis cluster at %s (%s) is not ready within %s: %w; start it, fix it, or set %s to nodes of a cluster that answers",
			e.shown, e.from, timeout, err, e.from)
	}
	return nil
}

// clusterOK checks that node says cluster_state:ok.
func clusterOK(ctx context.Context, node *redis.Client) error {
	addr := node.Options().Addr
	info, err := node.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("node %s: CLUSTER INFO: %w", addr, err)
	}
	if state := field(info, "cluster_state"); state != "ok" {
		return fmt.Errorf("node %s reports cluster_state:%s: not every slot is served (redis-cli --cluster check %s says why)",
			addr, state, addr)
	}
	return nil
}

// settingOf names the setting to change for a Redis named by from.
func settingOf(from string) string {
	if strings.HasPrefix(from, "the default") {
		return URLFlag + " or " + URLVar
	}
	return from
}

// field returns the value of name in the text of an INFO-like reply
// (name:value lines), or "".
func field(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), name+":"); ok {
			return v
		}
	}
	return ""
}

// Redact returns rawURL with its password replaced by "xxxxx", for logs and
// errors; a string that does not parse as a URL is returned as "<unparsable
// URL>" in case it holds a secret.
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}

// RedactList is a seed list with the password of each URL in it redacted
// (host:port seeds carry none).
func RedactList(list string) string {
	var out []string
	for s := range strings.SplitSeq(list, ",") {
		if s = strings.TrimSpace(s); strings.Contains(s, "://") {
			s = Redact(s)
		}
		if s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}
