// Package envflag gives command-line flags their defaults from environment
// variables, collecting malformed values as errors instead of ignoring them.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redisurl"
)

// Env reads defaults from an environment (os.Getenv, or a map in tests).
type Env struct {
	get  func(string) string
	errs []error
}

// New returns an Env reading through getenv.
func New(getenv func(string) string) *Env { return &Env{get: getenv} }

// String returns the variable name, or def when it is unset or empty.
func (e *Env) String(name, def string) string {
	if v := e.get(name); v != "" {
		return v
	}
	return def
}

// Int returns the variable name as an integer, or def when it is unset. A
// malformed value is recorded (see Err) and def returned.
func (e *Env) Int(name string, def int) int {
	v := e.get(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not an integer", name, v))
		return def
	}
	return n
}

// Duration returns the variable name as a duration (like 15s), or def when
// it is unset. A malformed value is recorded (see Err) and def returned.
func (e *Env) Duration(name string, def time.Duration) time.Duration {
	v := e.get(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: not a duration (like 15s)", name, v))
		return def
	}
	return d
}

// Err returns the malformed values met so far, joined, or nil.
func (e *Env) Err() error { return errors.Join(e.errs...) }

// Connection declares the flags every goreactor binary shares: Redis's
// (see Redis) and -prefix, defaulting to GOREACTOR_PREFIX and then to the
// default prefix.
func Connection(fs *flag.FlagSet, env *Env, target *redisurl.Target, prefix *string) {
	Redis(fs, env, target, redisurl.DefaultURL)
	fs.StringVar(prefix, "prefix", env.String(envconfig.PrefixVar, keys.DefaultPrefix),
		"key prefix, the same as your engines' Config.Prefix; env "+envconfig.PrefixVar)
}

// Redis declares -redis and -redis-cluster, each defaulting to its
// environment variable (REDIS_URL, REDIS_CLUSTER_ADDRS). target records
// which of them named it, so that Target.Parse can refuse both; defURL
// (redisurl.DefaultURL, or "" for a binary that looks for a Redis itself)
// is the URL when neither does.
func Redis(fs *flag.FlagSet, env *Env, target *redisurl.Target, defURL string) {
	*target = redisurl.FromEnv(env.get, defURL)
	fs.Var(named{&target.URL, &target.URLFrom, redisurl.URLFlag, redisurl.Redact}, redisurl.URLFlag[1:],
		"one Redis, by `URL`: redis://[user:password@]host:port/db, rediss:// for TLS; env "+redisurl.URLVar)
	fs.Var(named{&target.Cluster, &target.ClusterFrom, redisurl.ClusterFlag, redisurl.RedactList}, redisurl.ClusterFlag[1:],
		"a Redis Cluster, by its `seeds`: host:port,... or redis://[user:password@]host:port,... (the user, password and TLS of every node); "+
			"not with -redis or REDIS_URL; env "+redisurl.ClusterVar)
}

// named is a string flag that records, when it is set, the flag's name in
// from: a value given on the command line wins over the environment's.
type named struct {
	val, from *string
	name      string
	redact    func(string) string
}

// String is the value with its passwords redacted: -h shows it as the
// default when it comes from the environment.
func (n named) String() string {
	if n.val == nil || *n.val == "" { // nil: the zero value flag.PrintDefaults makes
		return ""
	}
	return n.redact(*n.val)
}

func (n named) Set(s string) error {
	*n.val, *n.from = s, n.name
	if s == "" { // an empty flag, like an empty variable, names nothing
		*n.from = ""
	}
	return nil
}

// Queue declares -queue, the queue list every goreactor binary reads
// ("name[:priority],...", parsed by envconfig.ParseQueues), defaulting to
// GOREACTOR_QUEUE and then to envconfig.DefaultQueue. use says what this
// binary does with the list.
func Queue(fs *flag.FlagSet, env *Env, queues *string, use string) {
	fs.StringVar(queues, "queue", env.String(envconfig.QueueVar, envconfig.DefaultQueue),
		"comma-separated asynq queues name[:priority]; "+use+"; env "+envconfig.QueueVar)
}

// QueueShards declares -queue-shards, the number of shard queues of the
// first queue over which fan-out maps' element and rollback tasks are
// spread (worker.ClientConfig.Shards), defaulting to GOREACTOR_QUEUE_SHARDS
// and then to 1 (no shards). Check the value with CheckQueueShards after
// parsing. use says what this binary does with the shards.
func QueueShards(fs *flag.FlagSet, env *Env, shards *int, use string) {
	fs.IntVar(shards, "queue-shards", env.Int(envconfig.ShardsVar, 1),
		"shard queues <queue>.shard0.. of the first queue that fan-out maps' element and rollback tasks are spread over, "+
			"1 to "+strconv.Itoa(envconfig.MaxShards)+" (1: none), the same in every process; "+use+"; env "+envconfig.ShardsVar)
}

// CheckQueueShards refuses a -queue-shards outside 1..envconfig.MaxShards,
// naming the flag and its variable.
func CheckQueueShards(shards int) error {
	if err := envconfig.CheckShards(shards); err != nil {
		return fmt.Errorf("-queue-shards (%s): %w", envconfig.ShardsVar, err)
	}
	return nil
}
