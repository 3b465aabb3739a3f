package fence_test

// Against both real engines: every refusal, the rollback, and the misuse checks.

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"singleton.dev/fence"
)

func newFencer[H *sql.DB | *sql.Conn](t *testing.T, h H, job string, token int64, attempt string) *fence.Fencer {
	t.Helper()
	f, err := fence.New(h, fence.Run{Job: job, Token: token, Attempt: attempt})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func register(t *testing.T, f *fence.Fencer, want int) {
	t.Helper()
	n, err := f.Register(context.Background())
	if err != nil || n != want {
		t.Fatalf("Register = %d, %v; want %d", n, err, want)
	}
}

// write is a fenced transaction's work: one row of the job.
func write(job string, ran *bool) func(tx *sql.Tx) error {
	return func(tx *sql.Tx) error {
		*ran = true
		_, err := tx.Exec("INSERT INTO go_writes (job, token) VALUES ('" + job + "', 0)")
		return err
	}
}

// begin opens a transaction that is rolled back when the test ends, whatever happens: a session
// left holding locks would make dropping the database wait.
func begin(t *testing.T, b interface {
	BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
}) *sql.Tx {
	t.Helper()
	tx, err := b.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	return tx
}

// wantRefused checks err is a *fence.FenceRefused of kind with sqlstate, exit code 3.
func wantRefused(t *testing.T, err error, kind error, sqlstate, msgPart string) {
	t.Helper()
	var refused *fence.FenceRefused
	if !errors.As(err, &refused) || !errors.Is(err, kind) {
		t.Fatalf("got %v (%T); want a FenceRefused %v", err, err, kind)
	}
	if refused.SQLState != sqlstate || !strings.Contains(refused.Message, msgPart) {
		t.Fatalf("got SQLSTATE %s %q; want %s and %q", refused.SQLState, refused.Message, sqlstate, msgPart)
	}
	if refused.Err == nil {
		t.Fatal("FenceRefused does not carry the driver's error")
	}
	if c := fence.ExitCode(err); c != 3 {
		t.Fatalf("ExitCode = %d; want 3", c)
	}
}

func TestEngineDetected(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		want := map[string]fence.Engine{"postgres": fence.PostgreSQL, "mariadb": fence.MySQL}[e.name]
		if got := newFencer(t, e.db, "a/b", 1, "pod").Engine(); got != want {
			t.Fatalf("from *sql.DB: %v; want %v", got, want)
		}
		conn, err := e.db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if got := newFencer(t, conn, "a/b", 1, "pod").Engine(); got != want {
			t.Fatalf("from *sql.Conn: %v; want %v", got, want)
		}
	})
}

func TestRegisteredAttemptCommits(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		ctx := context.Background()
		job := "billing/commits"
		e.issue(t, job, 42)
		f := newFencer(t, e.db, job, 42, "pod-a")
		register(t, f, 1)
		register(t, f, 1) // the same attempt again gets its number again
		var ran bool
		if err := f.InTx(ctx, nil, write(job, &ran)); err != nil {
			t.Fatal(err)
		}
		if n := e.writes(t, job); !ran || n != 1 {
			t.Fatalf("ran %v, %d row(s) committed; want 1", ran, n)
		}
		// Fence by hand, on a dedicated connection, twice in the same transaction.
		conn, err := e.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fc := newFencer(t, conn, job, 42, "pod-a")
		tx := begin(t, conn)
		for range 2 {
			if token, err := fc.Fence(ctx, tx); err != nil || token != 42 {
				t.Fatalf("Fence = %d, %v; want 42", token, err)
			}
		}
		if _, err := tx.Exec("INSERT INTO go_writes (job, token) VALUES ('" + job + "', 42)"); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if n := e.writes(t, job); n != 2 {
			t.Fatalf("%d row(s); want 2", n)
		}
	})
}

func TestStaleToken(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		job := "billing/stale"
		e.issue(t, job, 41)
		f := newFencer(t, e.db, job, 41, "pod-a")
		register(t, f, 1)
		e.issue(t, job, 42) // a newer run claimed the job
		var ran bool
		err := f.InTx(context.Background(), nil, write(job, &ran))
		wantRefused(t, err, fence.ErrStaleToken, "SF001", "stale fencing token 41 for job billing/stale: current is 42")
		if n := e.writes(t, job); ran || n != 0 {
			t.Fatalf("callback ran %v, %d row(s) committed; want none", ran, n)
		}
		_, err = f.Register(context.Background())
		wantRefused(t, err, fence.ErrStaleToken, "SF001", "current is 42")
	})
}

func TestRetiredToken(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		job := "billing/retired"
		e.issue(t, job, 42)
		f := newFencer(t, e.db, job, 42, "pod-a")
		register(t, f, 1)
		e.retire(t, job, 42) // the period was decided
		var ran bool
		err := f.InTx(context.Background(), nil, write(job, &ran))
		wantRefused(t, err, fence.ErrStaleToken, "SF001", "is retired")
		if n := e.writes(t, job); ran || n != 0 {
			t.Fatalf("callback ran %v, %d row(s) committed; want none", ran, n)
		}
	})
}

func TestNeverIssued(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		ctx := context.Background()
		var ran bool
		// No fence row for the job at all.
		f := newFencer(t, e.db, "billing/unknown", 1, "pod-a")
		_, err := f.Register(ctx)
		wantRefused(t, err, fence.ErrNeverIssued, "SF003", "was never issued")
		wantRefused(t, f.InTx(ctx, nil, write("billing/unknown", &ran)), fence.ErrNeverIssued, "SF003", "was never issued")
		// A token above the newest issued.
		e.issue(t, "billing/above", 42)
		f = newFencer(t, e.db, "billing/above", 43, "pod-a")
		_, err = f.Register(ctx)
		wantRefused(t, err, fence.ErrNeverIssued, "SF003", "the newest is 42")
		if ran || e.writes(t, "billing/unknown") != 0 {
			t.Fatal("something committed")
		}
	})
}

func TestAttemptSuperseded(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		ctx := context.Background()
		job := "billing/attempts"
		e.issue(t, job, 42)
		a := newFencer(t, e.db, job, 42, "pod-a")
		b := newFencer(t, e.db, job, 42, "pod-b")
		register(t, a, 1)
		register(t, b, 2) // the replacement pod
		var ran bool
		wantRefused(t, a.InTx(ctx, nil, write(job, &ran)), fence.ErrAttemptSuperseded, "SF004", "was superseded by attempt #2 (pod-b)")
		if n := e.writes(t, job); ran || n != 0 {
			t.Fatalf("callback ran %v, %d row(s) committed; want none", ran, n)
		}
		_, err := a.Register(ctx) // an older pod cannot come back
		wantRefused(t, err, fence.ErrAttemptSuperseded, "SF004", "superseded")
		c := newFencer(t, e.db, job, 42, "pod-c") // never registered
		wantRefused(t, c.InTx(ctx, nil, write(job, &ran)), fence.ErrAttemptSuperseded, "SF004", "is not registered")
		if err := b.InTx(ctx, nil, write(job, &ran)); err != nil {
			t.Fatal(err)
		}
		if n := e.writes(t, job); n != 1 {
			t.Fatalf("%d row(s); want the newest attempt's 1", n)
		}
	})
}

func TestNotPermitted(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		job := "billing/someone-elses"
		e.issue(t, job, 42) // owned by the admin user
		f := newFencer(t, e.stranger(t), job, 42, "pod-a")
		_, err := f.Register(context.Background())
		wantRefused(t, err, fence.ErrNotPermitted, "SF002", "may not fence job billing/someone-elses")
		var ran bool
		wantRefused(t, f.InTx(context.Background(), nil, write(job, &ran)), fence.ErrNotPermitted, "SF002", "may not fence")
	})
}

// A refused fence rolls the caller's transaction back: on MariaDB the refused statement would
// otherwise leave it open, and a write made before the fence would commit.
func TestRefusalRollsBackCallersTransaction(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		ctx := context.Background()
		job := "billing/rollback"
		e.issue(t, job, 42)
		f := newFencer(t, e.db, job, 41, "pod-a")
		tx := begin(t, e.db)
		if _, err := tx.Exec("INSERT INTO go_writes (job, token) VALUES ('" + job + "', 41)"); err != nil {
			t.Fatal(err)
		}
		_, err := f.Fence(ctx, tx)
		wantRefused(t, err, fence.ErrStaleToken, "SF001", "current is 42")
		if err := tx.Commit(); !errors.Is(err, sql.ErrTxDone) {
			t.Fatalf("Commit after a refusal = %v; want sql.ErrTxDone", err)
		}
		if n := e.writes(t, job); n != 0 {
			t.Fatalf("%d row(s) committed; want none", n)
		}
	})
}

func TestFenceWithoutTransaction(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		ctx := context.Background()
		job := "billing/no-tx"
		e.issue(t, job, 42)
		f := newFencer(t, e.db, job, 41, "pod-a") // stale: a call that reached the database would count
		before := e.rejections(t)
		var misuse *fence.MisuseError
		if _, err := f.Fence(ctx, nil); !errors.As(err, &misuse) || fence.ExitCode(err) != 2 {
			t.Fatalf("Fence(nil) = %v; want a MisuseError, exit code 2", err)
		}
		for _, end := range []func(*sql.Tx) error{(*sql.Tx).Commit, (*sql.Tx).Rollback} {
			tx := begin(t, e.db)
			if err := end(tx); err != nil {
				t.Fatal(err)
			}
			if _, err := f.Fence(ctx, tx); !errors.As(err, &misuse) || fence.ExitCode(err) != 2 {
				t.Fatalf("Fence(finished tx) = %v; want a MisuseError, exit code 2", err)
			}
		}
		if after := e.rejections(t); after != before {
			t.Fatalf("refusals went from %d to %d: SQL was sent", before, after)
		}
		// The control: the same call in an open transaction reaches the database.
		_, err := f.Fence(ctx, begin(t, e.db))
		wantRefused(t, err, fence.ErrStaleToken, "SF001", "stale")
		if after := e.rejections(t); after != before+1 {
			t.Fatalf("refusals went from %d to %d; want one more", before, after)
		}
	})
}

func TestRegisterRefusesOpenTransaction(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		ctx := context.Background()
		job := "billing/register-in-tx"
		e.issue(t, job, 42)
		conn, err := e.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		f := newFencer(t, conn, job, 42, "pod-a")
		var misuse *fence.MisuseError
		// A BEGIN sent as SQL text, which database/sql does not know of.
		if _, err := conn.ExecContext(ctx, "BEGIN"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Register(ctx); !errors.As(err, &misuse) || fence.ExitCode(err) != 2 {
			t.Fatalf("Register in a BEGIN = %v; want a MisuseError", err)
		}
		if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		// A *sql.Tx open on the same connection.
		tx := begin(t, conn)
		if _, err := f.Register(ctx); !errors.As(err, &misuse) {
			t.Fatalf("Register in a *sql.Tx = %v; want a MisuseError", err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		// Nothing was registered: the attempt's first registration is #1.
		register(t, f, 1)
	})
}

func TestCallbackErrorRollsBack(t *testing.T) {
	eachEngine(t, func(t *testing.T, e *engine) {
		ctx := context.Background()
		job := "billing/callback-error"
		e.issue(t, job, 42)
		f := newFencer(t, e.db, job, 42, "pod-a")
		register(t, f, 1)
		boom := errors.New("boom")
		var ran bool
		err := f.InTx(ctx, nil, func(tx *sql.Tx) error {
			if err := write(job, &ran)(tx); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) || fence.ExitCode(err) != 1 {
			t.Fatalf("InTx = %v (exit %d); want boom, exit code 1", err, fence.ExitCode(err))
		}
		func() {
			defer func() {
				if r := recover(); r != "panic" {
					t.Fatalf("recovered %v; want the callback's panic", r)
				}
			}()
			_ = f.InTx(ctx, nil, func(tx *sql.Tx) error {
				_ = write(job, &ran)(tx)
				panic("panic")
			})
		}()
		if n := e.writes(t, job); !ran || n != 0 {
			t.Fatalf("ran %v, %d row(s) committed; want none", ran, n)
		}
	})
}
