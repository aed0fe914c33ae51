// Command goreactor is the operator's and the webhook's command line: it
// continues runs paused at an interrupt step and lists the runs that wait,
// with no Go code and no reactor definitions.
//
//	goreactor continue <run-id> <step> --payload @approval.json [--by ann] [--wait 10s]
//	goreactor continue --correlation <id> --payload '{"by":"ann","ok":true}'
//	echo '{"by":"ann"}' | goreactor continue <run-id> <step> --payload -
//	goreactor list paused [--reactor R] [--limit 50] [--json]
//	goreactor show <run-id> [--json]
//	goreactor version
//
// continue records the payload with the run (exactly once: a second one is
// told when the first came) and wakes the run on the workers' queue. This
// command has no definitions, so it cannot check the payload: the worker
// does. --wait (default 10s; 0: do not wait) waits until the worker took it
// (the run left the pause) or refused it, and prints which. --by names the
// sender on the run's audit stream (default $USER, else "cli"). The step is
// the interrupt's path: "approve", or "review/approve" inside a composed
// child.
//
// list paused prints one line per paused run, oldest first (by when it
// entered the paused status): id, reactor, step, correlation id, since,
// deadline, payloads received of those it accepts; --json prints a JSON
// array for scripts. show prints one run's interrupt: the payloads it holds
// and its last refusal (--json too).
//
// Every subcommand takes the connection flags of the worker, with the same
// environment variables and defaults (see worker.Main):
//
//	-redis         REDIS_URL               redis://localhost:6379/0
//	-redis-cluster REDIS_CLUSTER_ADDRS     "" (a Redis Cluster's seeds; not with -redis)
//	-prefix        GOREACTOR_PREFIX        goreactor
//	-queue         GOREACTOR_QUEUE         goreactor (the workers' queue list; the first is where a run
//	                                       stored without a queue of its own is woken)
//	-queue-shards  GOREACTOR_QUEUE_SHARDS  1
//
// Flags may come before or after the arguments, with one dash or two.
//
// Exit status: 0 done; 1 refused or failed (the payload refused, already
// continued, the run not paused, timed out, no such run or correlation id,
// Redis not answering); 2 a bad command line (an invalid JSON payload
// included); 3 the payload is recorded but the worker did not take or
// refuse it within --wait (no worker running, or a busy one): the run goes
// on when a worker gets to it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/goreactor/goreactor/internal/cli"
	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/envflag"
	"github.com/goreactor/goreactor/internal/redislog"
	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit statuses.
const (
	exitOK        = 0
	exitFailed    = 1
	exitUsage     = 2
	exitUndecided = 3
)

const (
	pingTimeout = 5 * time.Second
	// defaultWait is how long continue waits for the worker's verdict: a
	// worker that is up takes a payload in milliseconds.
	defaultWait  = 10 * time.Second
	defaultLimit = 50
	maxPayload   = 1 << 20
)

const usage = `usage:
  goreactor continue <run-id> <step> --payload JSON|@FILE|- [--by NAME] [--wait 10s]
  goreactor continue --correlation ID --payload JSON|@FILE|- [--by NAME] [--wait 10s]
  goreactor list paused [--reactor NAME] [--limit 50] [--json]
  goreactor show <run-id> [--json]
  goreactor version
every subcommand takes -redis, -redis-cluster, -prefix, -queue and -queue-shards
(env REDIS_URL, REDIS_CLUSTER_ADDRS, GOREACTOR_PREFIX, GOREACTOR_QUEUE, GOREACTOR_QUEUE_SHARDS);
goreactor <subcommand> -h lists its flags
`

// conn is the connection flags every subcommand shares.
type conn struct {
	target redisurl.Target
	prefix string
	queues string
	shards int
}

func (c *conn) declare(fs *flag.FlagSet, env *envflag.Env) {
	envflag.Connection(fs, env, &c.target, &c.prefix)
	envflag.Queue(fs, env, &c.queues, "the workers' queues; a continue wakes the run on its own queue, or on the first for a run stored without one")
	envflag.QueueShards(fs, env, &c.shards, "the workers'")
}

// usageError is a bad command line: exit 2.
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// parse parses args into fs, flags before or after the arguments, and
// returns the arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil // everything after -- is an argument
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// env is the process environment run reads.
type env struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	ev := env{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	var err error
	switch sub, rest := args[0], args[1:]; sub {
	case "continue":
		err = continueCmd(ctx, ev, rest)
	case "list":
		err = listCmd(ctx, ev, rest)
	case "show":
		err = showCmd(ctx, ev, rest)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, version.Line())
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
	default:
		err = usagef("unknown subcommand %q", sub)
	}
	var (
		ue  usageError
		ex  exitError
		msg string
	)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "goreactor: %v\n%s", ue.error, usage)
		return exitUsage
	case errors.As(err, &ex):
		if ex.msg != "" {
			fmt.Fprintf(stderr, "goreactor: %s\n", ex.msg)
		}
		return ex.code
	default:
		msg = cli.Explain(err)
	}
	fmt.Fprintf(stderr, "goreactor: %s\n", msg)
	return exitFailed
}

// exitError ends run with code after printing msg.
type exitError struct {
	code int
	msg  string
}

func (e exitError) Error() string { return e.msg }

// flags returns a subcommand's flag set with the connection flags.
func flags(name string, ev env, c *conn) (*flag.FlagSet, *envflag.Env) {
	fs := flag.NewFlagSet("goreactor "+name, flag.ContinueOnError)
	fs.SetOutput(ev.stderr)
	e := envflag.New(ev.getenv)
	c.declare(fs, e)
	return fs, e
}

// parseFlags parses a subcommand's command line, the environment's values
// checked, and returns its arguments.
func parseFlags(fs *flag.FlagSet, e *envflag.Env, args []string) ([]string, error) {
	pos, err := parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil, err
	}
	if err != nil {
		return nil, exitError{code: exitUsage} // the flag package said why
	}
	if err := e.Err(); err != nil {
		return nil, usageError{err}
	}
	return pos, nil
}

// open connects to Redis and returns an engine with no definitions that
// wakes runs on the workers' first queue.
func (c *conn) open(ctx context.Context, stderr io.Writer) (*reactor.Engine, func(), error) {
	ep, err := c.target.Parse()
	if err != nil {
		return nil, nil, usageError{err}
	}
	_, queue, err := envconfig.ParseQueues(c.queues)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("-queue: %w", err)}
	}
	if err := envflag.CheckQueueShards(c.shards); err != nil {
		return nil, nil, usageError{err}
	}
	if c.prefix == "" {
		return nil, nil, usagef("-prefix: must not be empty")
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	redislog.Set(log)
	rdb, err := ep.Dial(ctx, pingTimeout)
	if err != nil {
		return nil, nil, err
	}
	client, err := worker.NewClientWithConfig(rdb, worker.ClientConfig{Queue: queue, Shards: c.shards})
	if err != nil {
		_ = rdb.Close()
		return nil, nil, usageError{err}
	}
	e, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: c.prefix, Logger: log, Enqueuer: client})
	if err != nil {
		_ = client.Close()
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("start engine: %w", err)
	}
	return e, func() { _ = client.Close(); _ = rdb.Close() }, nil
}

func continueCmd(ctx context.Context, ev env, args []string) error {
	var (
		c                    conn
		payloadArg, corr, by string
		wait                 time.Duration
	)
	fs, e := flags("continue", ev, &c)
	fs.StringVar(&payloadArg, "payload", "", "the payload: JSON inline, @FILE to read it from a file, or - for stdin (required)")
	fs.StringVar(&corr, "correlation", "", "continue the run whose interrupt claimed this correlation id (instead of <run-id> <step>)")
	fs.StringVar(&by, "by", senderOf(ev.getenv), "who sends the payload, recorded on the run's audit stream")
	fs.DurationVar(&wait, "wait", defaultWait, "wait this long for the worker to take or refuse the payload; 0: do not wait")
	pos, err := parseFlags(fs, e, args)
	if err != nil {
		return err
	}
	var t cli.Target
	switch {
	case corr != "" && len(pos) > 0:
		return usagef("continue: give <run-id> <step> or --correlation, not both")
	case corr != "":
		t.Correlation = corr
	case len(pos) != 2:
		return usagef("continue: want <run-id> <step> (or --correlation ID), got %d argument(s)", len(pos))
	default:
		t.RunID, t.Step = pos[0], pos[1]
	}
	if payloadArg == "" {
		return usagef("continue: --payload is required (JSON, @FILE or -)")
	}
	if wait < 0 {
		return usagef("continue: --wait %s: must not be negative", wait)
	}
	payload, err := readPayload(payloadArg, ev.stdin)
	if err != nil {
		return usageError{err}
	}
	engine, closeEngine, err := c.open(ctx, ev.stderr)
	if err != nil {
		return err
	}
	defer closeEngine()

	cont, err := cli.Continue(ctx, engine, t, payload, by)
	if cont == nil {
		return err
	}
	fmt.Fprintln(ev.stdout, cli.Recorded(cont))
	if err != nil { // recorded, not woken: the sweeper wakes it
		fmt.Fprintf(ev.stderr, "goreactor: warning: %v\n", err)
	}
	if wait == 0 {
		return nil
	}
	if cont.Received < cont.Accepts {
		fmt.Fprintf(ev.stdout, "not waiting: the worker checks the payloads once all %d are in\n", cont.Accepts)
		return nil
	}
	out, err := cli.Wait(ctx, engine, cont, wait)
	switch {
	case errors.Is(err, cli.ErrUndecided):
		return exitError{code: exitUndecided, msg: fmt.Sprintf("%s within --wait %s; the payload is recorded, and the run goes on when a worker gets to it", err, wait)}
	case err != nil:
		return err
	case out.Refused != "":
		return exitError{code: exitFailed, msg: fmt.Sprintf("refused by the worker: %s (run %s still waits at %s; send a corrected payload)", out.Refused, cont.RunID, cont.Step)}
	}
	fmt.Fprintf(ev.stdout, "taken: run %s went on past %s and is %s\n", cont.RunID, cont.Step, out.Status)
	return nil
}

// senderOf is the default --by: $USER, else "cli".
func senderOf(getenv func(string) string) string {
	if u := getenv("USER"); u != "" {
		return u
	}
	return "cli"
}

// readPayload reads --payload: JSON inline, @FILE, or - for stdin.
func readPayload(arg string, stdin io.Reader) (json.RawMessage, error) {
	var (
		data []byte
		err  error
		from = "--payload"
	)
	switch {
	case arg == "-":
		from = "the payload on stdin"
		data, err = io.ReadAll(io.LimitReader(stdin, maxPayload+1))
	case strings.HasPrefix(arg, "@"):
		from = "the payload in " + arg[1:]
		data, err = os.ReadFile(arg[1:])
	default:
		data = []byte(arg)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", from, err)
	}
	if len(data) > maxPayload {
		return nil, fmt.Errorf("%s is over %d bytes", from, maxPayload)
	}
	if !json.Valid(data) {
		return nil, fmt.Errorf("%s is not valid JSON", from)
	}
	return json.RawMessage(data), nil
}

func listCmd(ctx context.Context, ev env, args []string) error {
	var (
		c           conn
		reactorName string
		limit       int
		asJSON      bool
	)
	fs, e := flags("list", ev, &c)
	fs.StringVar(&reactorName, "reactor", "", "only the runs of this reactor")
	fs.IntVar(&limit, "limit", defaultLimit, "at most this many runs")
	fs.BoolVar(&asJSON, "json", false, "print a JSON array")
	pos, err := parseFlags(fs, e, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] != string(reactor.StatusPaused) {
		return usagef("list: want `list paused` (the runs waiting at an interrupt)")
	}
	if limit < 1 {
		return usagef("list: --limit %d: must be at least 1", limit)
	}
	engine, closeEngine, err := c.open(ctx, ev.stderr)
	if err != nil {
		return err
	}
	defer closeEngine()
	runs, err := cli.List(ctx, engine, reactorName, limit)
	if err != nil {
		return err
	}
	return cli.PrintList(ev.stdout, runs, asJSON)
}

func showCmd(ctx context.Context, ev env, args []string) error {
	var (
		c      conn
		asJSON bool
	)
	fs, e := flags("show", ev, &c)
	fs.BoolVar(&asJSON, "json", false, "print the interrupt as JSON")
	pos, err := parseFlags(fs, e, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("show: want <run-id>")
	}
	engine, closeEngine, err := c.open(ctx, ev.stderr)
	if err != nil {
		return err
	}
	defer closeEngine()
	info, err := engine.Interrupt(ctx, pos[0])
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(ev.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(cli.InterruptOf(info))
	}
	cli.Show(ev.stdout, info)
	return nil
}
