package main

// The workload against the real PostgreSQL (DATABASE_URL; ./test.sh takes it from
// hack/postgres.sh url). Each test has a database of its own, with the controller's schema
// (clients/testdata/postgres.sql, generated from the controller's code) and the example's
// (../schema.sql), dropped at its end. The controller's side, claiming a period (which advances
// the fence to its token) and retiring a token, is done here in SQL as the controller does it.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"singleton.dev/fence"
)

// binary is the workload built from this package, run as a Job runs it.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "billing-workload-go")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "billing-workload")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the workload:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	jan = "2025-01-01T02:00:00Z"
	feb = "2025-02-01T02:00:00Z"
)

// world is one test's database.
type world struct {
	t   *testing.T
	db  *sql.DB // as the admin
	url string  // the workload's DATABASE_URL
	job string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	raw := os.Getenv("DATABASE_URL")
	if raw == "" {
		t.Fatal("DATABASE_URL is not set: these tests need a real PostgreSQL (run ./test.sh, or DATABASE_URL=$(hack/postgres.sh url))")
	}
	admin, err := sql.Open("pgx", raw)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "billing_go_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("CREATE DATABASE: %v", err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	w := &world{t: t, url: u.String(), job: "billing/invoices"}
	if w.db, err = sql.Open("pgx", w.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.db.Close()
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Errorf("dropping %s: %v", name, err)
		}
		admin.Close()
	})
	// The controller's tables and functions, then the example's tables, as users create them.
	for _, file := range []string{"../../../clients/testdata/postgres.sql", "../schema.sql"} {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.db.Exec(string(text)); err != nil { // no arguments: one simple query
			t.Fatalf("%s: %v", file, err)
		}
	}
	return w
}

// claim claims period for token and advances the fence to it, in one transaction, as the
// controller does before it creates the run's Job.
func (w *world) claim(period string, token int64) {
	w.t.Helper()
	tx, err := w.db.Begin()
	if err != nil {
		w.t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec("INSERT INTO singleton_claims (job, period, token, job_name) VALUES ($1, $2, $3, $4)",
		w.job, period, token, fmt.Sprintf("invoices-%d", token)); err != nil {
		w.t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO singleton_fences (job, token) VALUES ($1, $2)
		ON CONFLICT (job) DO UPDATE SET token = EXCLUDED.token`, w.job, token); err != nil {
		w.t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		w.t.Fatal(err)
	}
}

// retire marks token's period decided, as the controller does once the run's Job is over.
func (w *world) retire(token int64) {
	w.t.Helper()
	if _, err := w.db.Exec("UPDATE singleton_fences SET retired = $1 WHERE job = $2", token, w.job); err != nil {
		w.t.Fatal(err)
	}
}

// settings of a run of period with token, as attempt (pod) attempt, as the controller sets them.
func (w *world) settings(period string, token int64, attempt string) map[string]string {
	key := sha256.Sum256([]byte(w.job + "/" + period))
	return map[string]string{
		"DATABASE_URL":              w.url,
		"SINGLETON_JOB":             w.job,
		"SINGLETON_PERIOD":          period,
		"SINGLETON_FENCING_TOKEN":   strconv.FormatInt(token, 10),
		"SINGLETON_IDEMPOTENCY_KEY": hex.EncodeToString(key[:]),
		"SINGLETON_ATTEMPT":         attempt,
	}
}

func lookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// run runs the workload in this process.
func (w *world) run(settings map[string]string) (*Committed, error) {
	return Run(context.Background(), lookup(settings), io.Discard)
}

// column is the column of the period's rows of table, ordered by order.
func column[T any](w *world, col, table, period, order string) []T {
	w.t.Helper()
	rows, err := w.db.Query(fmt.Sprintf("SELECT %s FROM %s WHERE period = $1 ORDER BY %s", col, table, order), period)
	if err != nil {
		w.t.Fatal(err)
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			w.t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

// invoices: the tokens that wrote the period's invoices, by customer.
func (w *world) invoices(period string) []int64 {
	return column[int64](w, "fencing_token", "invoices", period, "customer")
}

// attempts: the attempts that committed the period's writes (run_attempts), in commit order.
func (w *world) attempts(period string) []string {
	return column[string](w, "attempt", "run_attempts", period, "committed_at")
}

// summaries: the tokens of the period's invoice_runs row (none or one).
func (w *world) summaries(period string) []int64 {
	return column[int64](w, "token", "invoice_runs", period, "token")
}

// nothingWritten fails the test if any of the example's tables has a row of period.
func (w *world) nothingWritten(period string) {
	w.t.Helper()
	inv, att, sum := w.invoices(period), w.attempts(period), w.summaries(period)
	if len(inv)+len(att)+len(sum) > 0 {
		w.t.Fatalf("rows written for %s: invoices %v, run_attempts %v, invoice_runs %v", period, inv, att, sum)
	}
}

func TestTheCurrentTokenCommitsOnceAndARetryChangesNothing(t *testing.T) {
	w := newWorld(t)
	w.claim(jan, 1)
	for range 2 { // the same pod's run again (a retry): the natural key keeps one invoice each
		done, err := w.run(w.settings(jan, 1, "pod-a"))
		if err != nil {
			t.Fatal(err)
		}
		if done.Invoices != 3 || done.Seq != 1 {
			t.Fatalf("committed %+v", done)
		}
	}
	if got := w.invoices(jan); !slices.Equal(got, []int64{1, 1, 1}) {
		t.Fatalf("invoices: %v", got)
	}
	// The ledger is not idempotent, on purpose: each commit is a row.
	if got := w.attempts(jan); !slices.Equal(got, []string{"pod-a", "pod-a"}) {
		t.Fatalf("run_attempts: %v", got)
	}
}

func TestAStaleTokenCommitsNothing(t *testing.T) {
	w := newWorld(t)
	w.claim(jan, 1)
	// February's claim advances the fence to 2 before January's run (paused, say) starts.
	w.claim(feb, 2)
	_, err := w.run(w.settings(jan, 1, "pod-a"))
	if !errors.Is(err, fence.ErrStaleToken) || fence.ExitCode(err) != 3 {
		t.Fatalf("want a stale token (exit 3), got %v (exit %d)", err, fence.ExitCode(err))
	}
	w.nothingWritten(jan)
	// The current run is unaffected.
	done, err := w.run(w.settings(feb, 2, "pod-b"))
	if err != nil || done.Invoices != 3 {
		t.Fatalf("the current run: %+v, %v", done, err)
	}
}

// The fence itself (step 4): a run whose token was current when it registered is overtaken by a
// newer run during its work, and its transaction is refused at the fence.
func TestARunOvertakenDuringItsWorkIsRefusedAtTheFence(t *testing.T) {
	w := newWorld(t)
	w.claim(jan, 1)
	s := w.settings(jan, 1, "pod-a")
	s["BILLING_WORK_SECONDS"] = "2"
	result := make(chan error, 1)
	go func() { _, err := w.run(s); result <- err }()
	w.waitRegistered(1, "pod-a")
	w.claim(feb, 2)
	err := <-result
	var refused *fence.FenceRefused
	if !errors.As(err, &refused) || refused.SQLState != "SF001" {
		t.Fatalf("want SF001 at the fence, got %v", err)
	}
	w.nothingWritten(jan)
}

func TestARetiredTokenAndATokenNeverIssuedAreRefused(t *testing.T) {
	w := newWorld(t)
	w.claim(jan, 1)
	// A token above the fence never came from the controller.
	if _, err := w.run(w.settings(jan, 2, "pod-a")); !errors.Is(err, fence.ErrNeverIssued) {
		t.Fatalf("want SF003, got %v", err)
	}
	// January is decided: its token is retired although it is still the stored fence.
	w.retire(1)
	if _, err := w.run(w.settings(jan, 1, "pod-a")); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("want SF001 (retired), got %v", err)
	}
	w.nothingWritten(jan)
}

// waitRegistered waits (5 s at most) until attempt registered for token.
func (w *world) waitRegistered(token int64, attempt string) {
	w.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		err := w.db.QueryRow("SELECT count(*) FROM singleton_attempts WHERE job = $1 AND token = $2 AND attempt = $3",
			w.job, token, attempt).Scan(&n)
		if err != nil {
			w.t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s did not register within 5 s", attempt)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A pod of a run that works while its replacement starts (its node stopped answering, say) is
// fenced out by the replacement's registration: only the replacement commits, once.
func TestAnOlderPodOfTheRunCommitsNothingOnceItsReplacementRegistered(t *testing.T) {
	w := newWorld(t)
	w.claim(jan, 1)
	old := w.settings(jan, 1, "pod-a")
	old["BILLING_WORK_SECONDS"] = "2"
	result := make(chan error, 1)
	go func() { _, err := w.run(old); result <- err }()
	w.waitRegistered(1, "pod-a")
	done, err := w.run(w.settings(jan, 1, "pod-b"))
	if err != nil || done.Seq != 2 {
		t.Fatalf("the replacement: %+v, %v", done, err)
	}
	if err := <-result; !errors.Is(err, fence.ErrAttemptSuperseded) || fence.ExitCode(err) != 3 {
		t.Fatalf("the older pod: want SF004, got %v", err)
	}
	if got := w.attempts(jan); !slices.Equal(got, []string{"pod-b"}) {
		t.Fatalf("run_attempts: %v", got)
	}
	if got := w.invoices(jan); !slices.Equal(got, []int64{1, 1, 1}) {
		t.Fatalf("invoices: %v", got)
	}
}

// exe runs the binary with exactly these environment variables and arguments.
func exe(settings map[string]string, args ...string) (stdout, stderr string, code int) {
	cmd := exec.Command(binary, args...)
	cmd.Env = []string{}
	for k, v := range settings {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		code = -1
	}
	return out.String(), errOut.String(), code
}

func TestTheBinaryPrintsItsRunAndExits3WhenFencedOut(t *testing.T) {
	w := newWorld(t)
	w.claim(jan, 1)
	out, errOut, code := exe(w.settings(jan, 1, "pod-a"))
	want := []string{
		"invoice run for billing/invoices, period 2025-01-01T02:00:00Z, fencing token 1",
		"registered as attempt #1 (pod-a) of this run",
		"committed 3 invoice(s) for billing/invoices period 2025-01-01T02:00:00Z under fencing token 1, attempt #1 (pod-a)",
	}
	if code != 0 || out != strings.Join(want, "\n")+"\n" {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	w.claim(feb, 2)
	stale := w.settings(jan, 1, "pod-c")
	_, errOut, code = exe(stale)
	if code != 3 || !strings.HasPrefix(errOut, "billing-workload: refused by the fence (SQLSTATE SF001): stale fencing token 1") {
		t.Fatalf("stale: exit %d, stderr %q", code, errOut)
	}
	if got := w.attempts(jan); !slices.Equal(got, []string{"pod-a"}) {
		t.Fatalf("the stale run wrote: run_attempts %v", got)
	}
}

func TestBadInputExits2AndWritesNothing(t *testing.T) {
	w := newWorld(t)
	w.claim(feb, 2)
	for _, c := range []struct{ variable, value, says string }{
		{"SINGLETON_PERIOD", "not a time", "bad input: SINGLETON_PERIOD"},
		{"SINGLETON_PERIOD", "", "bad input: SINGLETON_PERIOD: is not set"},
		{"BILLING_FENCE_FUNCTION", "x; DROP TABLE invoices", "not a lower-case SQL identifier"},
		{"BILLING_FENCE_FUNCTION", "singleton_check", "does not end in `fence`"},
		{"SINGLETON_FENCING_TOKEN", "-1", "bad input: SINGLETON_FENCING_TOKEN"},
		{"SINGLETON_ATTEMPT", "", "bad input: SINGLETON_ATTEMPT"},
		{"SINGLETON_IDEMPOTENCY_KEY", "", "must not be empty"},
		{"DATABASE_URL", w.url + "&sslmode=allow-anything", "unknown sslmode"},
		{"BILLING_WORK_SECONDS", "soon", "bad input: BILLING_WORK_SECONDS"},
	} {
		s := w.settings(feb, 2, "pod-a")
		s[c.variable] = c.value
		out, errOut, code := exe(s)
		if code != 2 || !strings.Contains(errOut, c.says) || out != "" {
			t.Errorf("%s=%q: exit %d, stdout %q, stderr %q (want 2, %q)", c.variable, c.value, code, out, errOut, c.says)
		}
	}
	if _, errOut, code := exe(w.settings(feb, 2, "pod-a"), "--no-such-flag"); code != 2 {
		t.Errorf("an unknown flag: exit %d, %s", code, errOut)
	}
	w.nothingWritten(feb)
	// Flags stand for the variables: the same run from flags alone commits.
	s := w.settings(feb, 2, "pod-a")
	out, errOut, code := exe(map[string]string{}, "--database-url", s["DATABASE_URL"], "--job", s["SINGLETON_JOB"],
		"--period", feb, "--token", "2", "--idempotency-key", s["SINGLETON_IDEMPOTENCY_KEY"], "--attempt", "pod-a")
	if code != 0 || !strings.Contains(out, "committed 3 invoice(s)") {
		t.Fatalf("from flags: exit %d\n%s%s", code, out, errOut)
	}
}

// SIGTERM does not stop a run half-way: it goes on to its transaction and the fence decides. The
// first run commits; the second is overtaken by a newer run after its SIGTERM and is refused.
func TestSIGTERMFinishesTheRunAndTheFenceDecides(t *testing.T) {
	w := newWorld(t)
	for _, c := range []struct {
		period        string
		token         int64
		before, newer func()
		code          int
		outcome       string
	}{
		{jan, 1, func() { w.claim(jan, 1) }, func() {}, 0, "committed 3 invoice(s)"},
		{feb, 2, func() { w.claim(feb, 2) }, func() { w.claim("2025-03-01T02:00:00Z", 3) }, 3, "SQLSTATE SF001"},
	} {
		c.before()
		s := w.settings(c.period, c.token, "pod-a")
		s["BILLING_WORK_SECONDS"] = "2"
		cmd := exec.Command(binary)
		for k, v := range s {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			out.WriteString(lines.Text() + "\n")
			if strings.HasPrefix(lines.Text(), "working for 2 s") {
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				c.newer()
			}
		}
		_ = cmd.Wait()
		code := cmd.ProcessState.ExitCode()
		all := out.String() + errOut.String()
		if code != c.code || !strings.Contains(out.String(), "SIGTERM: finishing this run") || !strings.Contains(all, c.outcome) {
			t.Fatalf("token %d: exit %d (want %d)\n%s", c.token, code, c.code, all)
		}
	}
	w.nothingWritten(feb)
	if got := w.invoices(jan); !slices.Equal(got, []int64{1, 1, 1}) {
		t.Fatalf("invoices: %v", got)
	}
}
