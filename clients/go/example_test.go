package fence_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	_ "github.com/jackc/pgx/v5/stdlib" // or _ "github.com/go-sql-driver/mysql"

	"singleton.dev/fence"
)

// A run's whole life: read the environment, register once, write in fenced transactions, and
// exit with the code the Job's podFailurePolicy expects.
func Example() {
	os.Exit(fence.ExitCode(invoiceRun(context.Background())))
}

func invoiceRun(ctx context.Context) error {
	run, err := fence.FromEnv()
	if err != nil {
		return err // exit code 2
	}
	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer db.Close()
	f, err := fence.New(db, run)
	if err != nil {
		return err
	}
	if _, err := f.Register(ctx); err != nil {
		return err // a refusal: exit code 3
	}
	return f.InTx(ctx, nil, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx,
			"INSERT INTO invoices (period, idempotency_key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
			run.Period, run.Key("invoices"))
		if err != nil {
			return fmt.Errorf("invoices: %w", err)
		}
		return nil
	})
}
