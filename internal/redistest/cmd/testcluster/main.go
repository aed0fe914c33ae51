// Command testcluster starts a Redis Cluster for goreactor's tests and runs
// a command against it:
//
//	go run ./internal/redistest/cmd/testcluster [flags] [-- command [args...]]
//
// It starts the nodes on free ports of 127.0.0.1 in a temporary directory,
// waits until the cluster is ready (every node at cluster_state:ok, every
// replica attached and in sync: redistest.LaunchCluster), runs the command
// with GOREACTOR_TEST_CLUSTER set to the nodes' addresses, kills the nodes,
// removes the directory and exits with the command's status. Without a
// command it prints the variable to export and serves until SIGINT or
// SIGTERM. The nodes are killed however it ends: the command's failure, a
// signal (passed on to the command, which ends first), or this process's
// own death (Linux: the kernel kills them).
//
// make test-cluster runs the cluster suites through it.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/goreactor/goreactor/internal/redistest"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("testcluster", flag.ContinueOnError)
	masters := fs.Int("masters", 3, "number of masters")
	replicas := fs.Int("replicas", 1, "replicas of each master")
	nodeTimeout := fs.Duration("node-timeout", 5*time.Second, "cluster-node-timeout: how long a master is unreachable before its replica is promoted")
	keep := fs.String("keep", "", "keep the nodes' files and logs in this directory (created if needed) instead of a temporary one")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: testcluster [flags] [-- command [args...]]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	command := fs.Args()

	// Caught from the start: a signal during the launch still stops the
	// nodes started so far.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)

	cfg := redistest.ClusterConfig{Masters: *masters, Replicas: *replicas, NodeTimeout: *nodeTimeout, Dir: *keep}
	if *keep != "" {
		if err := os.MkdirAll(*keep, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, "testcluster:", err)
			return 1
		}
	}
	start := time.Now()
	cluster, err := redistest.LaunchCluster(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testcluster:", err)
		return 1
	}
	defer cluster.Stop()
	addrs := strings.Join(cluster.Addrs, ",")
	fmt.Fprintf(os.Stderr, "testcluster: %d masters %v with %d replica(s) each, ready in %v (files in %s)\n",
		*masters, cluster.Masters(), *replicas, time.Since(start).Round(time.Millisecond), cluster.Dir())

	if len(command) == 0 {
		fmt.Printf("export %s=%s\n", redistest.EnvCluster, addrs)
		sig := <-sigs
		fmt.Fprintln(os.Stderr, "testcluster:", sig, "- stopping the nodes")
		return 0
	}

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), redistest.EnvCluster+"="+addrs)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testcluster:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			// The command stops first, so it sees the cluster to the end.
			_ = cmd.Process.Signal(sig)
		case err := <-done:
			var exit *exec.ExitError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &exit) && exit.ExitCode() > 0:
				return exit.ExitCode()
			default:
				fmt.Fprintln(os.Stderr, "testcluster:", command[0]+":", err)
				return 1
			}
		}
	}
}
