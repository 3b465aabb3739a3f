// The billing example's workload in Go: the same run as the Rust reference
// (examples/billing/workload) and invoice-run.sh, with the fence library singleton.dev/fence
// (clients/go) over database/sql and pgx.
//
//  1. Read the run: SINGLETON_JOB, SINGLETON_PERIOD, SINGLETON_FENCING_TOKEN,
//     SINGLETON_IDEMPOTENCY_KEY and SINGLETON_ATTEMPT (the pod's uid), set by the controller on
//     every container of a run (fence.FromLookup).
//  2. Register this pod as the run's newest attempt (fence.Fencer.Register: singleton_attempt in
//     a transaction of its own). From then on no older pod of this run commits a fenced write.
//  3. Work (BILLING_WORK_SECONDS, 0 by default): what takes time before the writes.
//  4. BEGIN; SELECT singleton_fence(job, token, attempt) (fence.Fencer.InTx): refused (SQLSTATE
//     SF001 to SF004) unless this run's token is the job's current one and this pod its newest
//     attempt; holds the fence row's lock until COMMIT.
//  5. The writes: the invoices, keyed by (period, customer), so a retry changes nothing; the run's
//     summary in invoice_runs; and one row in run_attempts, the run's ledger entry, which is not
//     idempotent on purpose (as a debit of a balance is not): only the fence keeps two pods of
//     the run from both making it.
//  6. COMMIT.
package main

import (
	"context"
	"crypto/x509"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"singleton.dev/fence"
)

// Committed is a run that committed.
type Committed struct {
	Job     string
	Period  time.Time
	Token   int64
	Attempt string
	Seq     int // this attempt's number in the run (1 for the run's first pod)
	// Invoices of the period in the table after the commit (this run's and any earlier run's of
	// the same period).
	Invoices int64
}

func (c *Committed) String() string {
	return fmt.Sprintf("committed %d invoice(s) for %s period %s under fencing token %d, attempt #%d (%s)",
		c.Invoices, c.Job, timestamp(c.Period), c.Token, c.Seq, c.Attempt)
}

// timestamp prints an instant as the Rust workload does (jiff): RFC 3339 in UTC, fractional
// seconds only when there are some.
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// bad is bad input (exit code 2): the library's own kind, so fence.ExitCode judges every error.
func bad(variable, msg string) error { return &fence.ConfigError{Var: variable, Msg: msg} }

// Run does steps 1 to 6 with the settings get returns (os.LookupEnv's shape: flags over the
// environment in main), printing its progress to out.
func Run(ctx context.Context, get func(string) (string, bool), out io.Writer) (*Committed, error) {
	val := func(name string) string { v, _ := get(name); return v }
	prefix, err := tablePrefix(val("BILLING_FENCE_FUNCTION"))
	if err != nil {
		return nil, err
	}
	run, err := fence.FromLookup(get)
	if err != nil {
		return nil, err
	}
	switch {
	case strings.TrimSpace(run.Job) == "" || strings.TrimSpace(run.IdempotencyKey) == "":
		return nil, bad("", "SINGLETON_JOB and SINGLETON_IDEMPOTENCY_KEY must not be empty")
	case run.Period.IsZero():
		return nil, bad("SINGLETON_PERIOD", "is not set (the controller sets it on every run)")
	}
	work, err := workSeconds(val("BILLING_WORK_SECONDS"))
	if err != nil {
		return nil, err
	}
	config, err := connConfig(val("DATABASE_URL"), val("PGSSLROOTCERT"))
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*config)
	defer db.Close()
	// Checks the attempt (SINGLETON_ATTEMPT) and the prefix before any SQL.
	f, err := fence.New(db, run, fence.WithTablePrefix(prefix))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "invoice run for %s, period %s, fencing token %d\n", run.Job, timestamp(run.Period), run.Token)

	// 2. Registration, in a transaction of its own.
	seq, err := f.Register(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "registered as attempt #%d (%s) of this run\n", seq, run.Attempt)
	// 3. The work. A SIGTERM does not cut it short (main): the fence decides.
	if work > 0 {
		fmt.Fprintf(out, "working for %d s before the fenced writes\n", work)
		time.Sleep(time.Duration(work) * time.Second)
	}
	// 4 to 6: one transaction, fenced first; rolled back on any error.
	var invoices int64
	err = f.InTx(ctx, nil, func(tx *sql.Tx) error {
		n, err := invoice(ctx, tx, run, seq)
		invoices = n
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Committed{Job: run.Job, Period: run.Period, Token: run.Token, Attempt: run.Attempt, Seq: seq, Invoices: invoices}, nil
}

// invoice is step 5, in the fenced transaction tx. Returns the period's invoices.
func invoice(ctx context.Context, tx *sql.Tx, run fence.Run, seq int) (int64, error) {
	// The natural key (period, customer) makes a retry of this run a no-op.
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO invoices (period, customer, amount_cents, fencing_token, idempotency_key)
		 SELECT $1, customer, monthly_cents, $2, $3 || '/' || customer FROM customers
		 ON CONFLICT (period, customer) DO NOTHING`,
		run.Period, run.Token, run.IdempotencyKey); err != nil {
		return 0, err
	}
	// The conditional-update pattern, for stores without a fence function.
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO invoice_runs AS r (period, token, invoices, attempt)
		 SELECT $1, $2, count(*), $3 FROM invoices WHERE period = $1
		 ON CONFLICT (period) DO UPDATE
		   SET token = EXCLUDED.token, invoices = EXCLUDED.invoices, finished_at = now(),
		       attempt = EXCLUDED.attempt
		   WHERE r.token <= EXCLUDED.token`,
		run.Period, run.Token, run.Attempt); err != nil {
		return 0, err
	}
	// The run's ledger entry: which attempt (pod) committed, at the database's time. Not
	// idempotent on purpose, as a debit is not.
	if _, err := tx.ExecContext(ctx,
		"INSERT INTO run_attempts (period, token, attempt, seq) VALUES ($1, $2, $3, $4)",
		run.Period, run.Token, run.Attempt, seq); err != nil {
		return 0, err
	}
	var n int64
	err := tx.QueryRowContext(ctx, "SELECT count(*) FROM invoices WHERE period = $1", run.Period).Scan(&n)
	return n, err
}

// A plain lower-case SQL identifier, as the Rust workload accepts for the fence function.
var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_$]{0,62}$`)

// tablePrefix is the backstop's table prefix from the fence function's name (`<prefix>fence`,
// BILLING_FENCE_FUNCTION, singleton_fence by default): the library calls <prefix>attempt and
// <prefix>fence, and checks the prefix's shape itself.
func tablePrefix(fenceFunction string) (string, error) {
	if fenceFunction == "" {
		fenceFunction = "singleton_fence"
	}
	if !identifier.MatchString(fenceFunction) {
		return "", bad("BILLING_FENCE_FUNCTION", strconv.Quote(fenceFunction)+" is not a lower-case SQL identifier")
	}
	prefix, ok := strings.CutSuffix(fenceFunction, "fence")
	if !ok {
		return "", bad("BILLING_FENCE_FUNCTION", strconv.Quote(fenceFunction)+" does not end in `fence`: cannot name its attempt function")
	}
	return prefix, nil
}

func workSeconds(s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, bad("BILLING_WORK_SECONDS", strconv.Quote(s)+" is not a number of seconds")
	}
	return n, nil
}

// connConfig reads DATABASE_URL as the Rust workload does: `sslmode=disable` is plain TCP; any
// other sslmode (and none) is TLS with the server's certificate and host name verified
// (verify-full), against rootCert (PGSSLROOTCERT) or else the system's CAs.
func connConfig(databaseURL, rootCert string) (*pgx.ConnConfig, error) {
	if databaseURL == "" {
		return nil, bad("DATABASE_URL", "is not set")
	}
	base, query, _ := strings.Cut(databaseURL, "?")
	verified := true
	var kept []string
	for _, pair := range strings.Split(query, "&") {
		key, value, _ := strings.Cut(pair, "=")
		switch {
		case pair == "":
		case key != "sslmode":
			kept = append(kept, pair)
		case value == "disable":
			verified = false
		case value == "prefer", value == "require", value == "verify-ca", value == "verify-full":
			verified = true
		default:
			return nil, bad("DATABASE_URL", "unknown sslmode "+strconv.Quote(value))
		}
	}
	if verified {
		kept = append(kept, "sslmode=verify-full")
		if rootCert != "" {
			kept = append(kept, "sslrootcert="+url.QueryEscape(rootCert))
		} else if pool, err := x509.SystemCertPool(); err != nil || len(pool.Subjects()) == 0 { //nolint:staticcheck // a count, on Linux
			return nil, bad("", "no CA certificate to verify the database with: set PGSSLROOTCERT, or sslmode=disable")
		}
	} else {
		kept = append(kept, "sslmode=disable")
	}
	config, err := pgx.ParseConfig(base + "?" + strings.Join(kept, "&"))
	if err != nil {
		return nil, bad("DATABASE_URL", err.Error())
	}
	return config, nil
}

// describe says what went wrong as the Rust workload does: "bad input: ...", "refused by the
// fence (SQLSTATE SF00n): ...", or "database: ...".
func describe(err error) string {
	var refused *fence.FenceRefused
	var config *fence.ConfigError
	var misuse *fence.MisuseError
	var pg *pgconn.PgError
	switch {
	case errors.As(err, &refused):
		return refused.Error()
	case errors.As(err, &config):
		if config.Var != "" {
			return "bad input: " + config.Var + ": " + config.Msg
		}
		return "bad input: " + config.Msg
	case errors.As(err, &misuse):
		return "bad input: " + misuse.Error()
	case errors.As(err, &pg):
		return fmt.Sprintf("database: %s (SQLSTATE %s)", pg.Message, pg.Code)
	}
	return "database: " + err.Error()
}
