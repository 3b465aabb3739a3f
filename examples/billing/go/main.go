// Command billing-workload is the invoice run of examples/billing, in Go. Exit codes: 0 committed
// (or already committed by this same run), 2 bad input, 3 refused by the fence (do not retry), 1
// anything else (a retry may succeed).
//
// SIGTERM (the pod deleted, say by a Replace) does not stop a run half-way: it goes on to its one
// transaction, and the fence decides whether that commits. A run frozen or paused past the start
// of a newer run is refused there, which is the point of the example. (The kubelet's SIGKILL
// after the grace period still ends it; nothing uncommitted survives that either.)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"singleton.dev/fence"
)

// settings: every flag can come from the environment instead, as in a Job.
var settings = []struct{ flag, env, usage string }{
	{"database-url", "DATABASE_URL", "the billing database, a postgres:// URL; sslmode=disable is plain TCP, any other sslmode (and none) TLS with the certificate and host name verified"},
	{"sslrootcert", "PGSSLROOTCERT", "PEM file of the CA that signed the server's certificate (else the system's CAs)"},
	{"job", "SINGLETON_JOB", "namespace/name of the SingletonJob: the fence's key"},
	{"period", "SINGLETON_PERIOD", "the run's scheduled instant (RFC 3339)"},
	{"token", "SINGLETON_FENCING_TOKEN", "the run's fencing token"},
	{"idempotency-key", "SINGLETON_IDEMPOTENCY_KEY", "stable per job and period: the key for external calls"},
	{"fence-function", "BILLING_FENCE_FUNCTION", "the fence function, <tablePrefix>fence of the SingletonJob's backstop (default singleton_fence)"},
	{"work-seconds", "BILLING_WORK_SECONDS", "seconds of work before the fenced transaction (default 0)"},
	{"attempt", "SINGLETON_ATTEMPT", "this attempt's id: the pod's uid, which the controller passes on every container"},
}

// lookupFlags parses args; the settings then come from a flag when given, else the environment.
func lookupFlags(args []string) (func(string) (string, bool), error) {
	fs := flag.NewFlagSet("billing-workload", flag.ContinueOnError)
	values := map[string]*string{}
	for _, s := range settings {
		values[s.env] = fs.String(s.flag, "", s.usage+" [env "+s.env+"]")
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return func(env string) (string, bool) {
		for _, s := range settings {
			if s.env == env && given[s.flag] {
				return *values[env], true
			}
		}
		return os.LookupEnv(env)
	}, nil
}

func main() {
	get, err := lookupFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "billing-workload: %s\n", describe(&fence.ConfigError{Msg: err.Error()}))
		os.Exit(2)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() {
		for range term {
			fmt.Println("SIGTERM: finishing this run; the fence decides whether it commits")
		}
	}()
	done, err := Run(context.Background(), get, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "billing-workload: %s\n", describe(err))
		os.Exit(fence.ExitCode(err))
	}
	fmt.Println(done)
}
