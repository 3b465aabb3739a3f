// Package fence lets a run of singleton-controller prove, inside each of its database
// transactions, that it is still the job's current run (fencing), on PostgreSQL and on
// MariaDB/MySQL through database/sql. See docs/fencing.md in the repository for the contract.
//
//	run, err := fence.FromEnv()                 // SINGLETON_* variables
//	f, err := fence.New(db, run)                // db: *sql.DB or *sql.Conn (pgx stdlib or go-sql-driver/mysql)
//	attempt, err := f.Register(ctx)             // once, before the work
//	err = f.InTx(ctx, nil, func(tx *sql.Tx) error { ... })  // fenced first, committed at the end
//	os.Exit(fence.ExitCode(err))                // 0, 1, 2 or 3
package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// Engine is the database's kind; New tells it from the driver.
type Engine int

const (
	PostgreSQL Engine = iota + 1 // github.com/jackc/pgx (stdlib)
	MySQL                        // MariaDB or MySQL, github.com/go-sql-driver/mysql
)

func (e Engine) String() string {
	switch e {
	case PostgreSQL:
		return "PostgreSQL"
	case MySQL:
		return "MySQL"
	}
	return "unknown engine"
}

// Option changes what New builds.
type Option func(*Fencer)

// WithTablePrefix sets the backstop's table prefix (the SingletonJob's tablePrefix); the
// functions called are <prefix>attempt and <prefix>fence. Default "singleton_".
func WithTablePrefix(prefix string) Option { return func(f *Fencer) { f.prefix = prefix } }

// WithEngine names the engine when New cannot tell it from the driver (another driver, or one
// wrapped for tracing).
func WithEngine(e Engine) Option { return func(f *Fencer) { f.engine = e } }

// The prefix goes into SQL text (a function name cannot be a parameter): only this shape is let
// through, as the controller allows it.
var prefixPattern = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)

// Fencer fences one run's transactions on one database. It is safe for concurrent use as far as
// its *sql.DB or *sql.Conn is.
type Fencer struct {
	run    Run
	engine Engine
	prefix string
	db     *sql.DB   // either this,
	conn   *sql.Conn // or this

	attemptSQL, fenceSQL string
}

// New binds run to a database: a *sql.DB, or a *sql.Conn to do everything on one connection. A
// *sql.Tx does not compile here: registration must not share a transaction. The engine comes
// from the driver (pgx → PostgreSQL, go-sql-driver/mysql → MySQL) unless WithEngine names it.
// Errors: *ConfigError (bad prefix, run without SINGLETON_ATTEMPT, unknown driver), *MisuseError
// (nil handle).
func New[H *sql.DB | *sql.Conn](h H, run Run, opts ...Option) (*Fencer, error) {
	f := &Fencer{run: run, prefix: "singleton_"}
	for _, o := range opts {
		o(f)
	}
	if !prefixPattern.MatchString(f.prefix) {
		return nil, &ConfigError{Msg: "table prefix " + strconv.Quote(f.prefix) + " must match " + prefixPattern.String()}
	}
	if err := run.check(); err != nil {
		return nil, err
	}
	var driverValue any
	switch h := any(h).(type) {
	case *sql.DB:
		if h == nil {
			return nil, &MisuseError{Msg: "New needs a *sql.DB or *sql.Conn, got nil"}
		}
		f.db, driverValue = h, h.Driver()
	case *sql.Conn:
		if h == nil {
			return nil, &MisuseError{Msg: "New needs a *sql.DB or *sql.Conn, got nil"}
		}
		f.conn = h
		if err := h.Raw(func(dc any) error { driverValue = dc; return nil }); err != nil {
			return nil, err
		}
	}
	if f.engine == 0 {
		f.engine = engineOf(driverValue)
	}
	switch f.engine {
	case PostgreSQL:
		f.attemptSQL, f.fenceSQL = "SELECT "+f.prefix+"attempt($1, $2, $3)", "SELECT "+f.prefix+"fence($1, $2, $3)"
	case MySQL:
		f.attemptSQL, f.fenceSQL = "SELECT "+f.prefix+"attempt(?, ?, ?)", "SELECT "+f.prefix+"fence(?, ?, ?)"
	default:
		return nil, &ConfigError{Msg: fmt.Sprintf("cannot tell the database engine from driver %T: pass fence.WithEngine", driverValue)}
	}
	return f, nil
}

// engineOf tells the engine by the driver's package, so that the library imports no driver.
func engineOf(driverValue any) Engine {
	t := reflect.TypeOf(driverValue)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == nil:
		return 0
	case strings.HasPrefix(t.PkgPath(), "github.com/jackc/pgx/"):
		return PostgreSQL
	case t.PkgPath() == mysqlPkg:
		return MySQL
	}
	return 0
}

// Run returns the run this Fencer fences.
func (f *Fencer) Run() Run { return f.run }

// Engine returns the database's engine.
func (f *Fencer) Engine() Engine { return f.engine }

// Register registers this pod as the run's newest attempt, in a transaction of its own, and
// returns its number in the run (1, 2, ...; the same again for the same attempt). Call it once
// when the process starts, before the work: from then on no older pod of the run commits a fenced
// write. It refuses (*MisuseError, nothing registered) when the connection already has a
// transaction open: PostgreSQL and MariaDB let that be seen, MySQL does not. A refusal is a
// *FenceRefused.
func (f *Fencer) Register(ctx context.Context) (int, error) {
	conn := f.conn
	if conn == nil {
		c, err := f.db.Conn(ctx)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		conn = c
	}
	if err := f.refuseOpenTransaction(ctx, conn); err != nil {
		return 0, err
	}
	// An explicit transaction, not autocommit: a MariaDB session may have autocommit off.
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	var n int
	if err := tx.QueryRowContext(ctx, f.attemptSQL, f.run.Job, f.run.Token, f.run.Attempt).Scan(&n); err != nil {
		_ = tx.Rollback()
		return 0, classify(err)
	}
	return n, tx.Commit()
}

// refuseOpenTransaction asks the server, as database/sql cannot know of a BEGIN sent as SQL text.
func (f *Fencer) refuseOpenTransaction(ctx context.Context, conn *sql.Conn) error {
	open := &MisuseError{Msg: "Register needs a connection without an open transaction: it commits the registration on its own"}
	switch f.engine {
	case PostgreSQL:
		// A setting made local to the transaction survives into the next statement only inside a
		// transaction block; outside, it ends with its own statement. No error is logged.
		if _, err := conn.ExecContext(ctx, "SELECT pg_catalog.set_config('singleton.register_probe', 'open', true)"); err != nil {
			if s, _ := serverError(err); s.state == "25P02" { // a failed transaction is open
				return open
			}
			return err
		}
		var v sql.NullString
		if err := conn.QueryRowContext(ctx, "SELECT pg_catalog.current_setting('singleton.register_probe', true)").Scan(&v); err != nil {
			return err
		}
		if v.String == "open" {
			return open
		}
	case MySQL:
		var in int
		err := conn.QueryRowContext(ctx, "SELECT @@in_transaction").Scan(&in)
		if s, _ := serverError(err); s.errno == 1193 { // MySQL: no such variable, cannot tell
			return nil
		}
		if err != nil {
			return err
		}
		if in != 0 {
			return open
		}
	}
	return nil
}

// Fence proves, as the first statement of tx, that this run and attempt may still commit, and
// returns the token. It holds the job's fence row until tx ends. Errors:
//   - *MisuseError, before any SQL: tx is nil, or already committed or rolled back;
//   - *FenceRefused (errors.Is ErrStaleToken, ...) and any other error: Fence has rolled tx back.
//     MariaDB/MySQL leave a transaction open after a refused statement; a caller going on would
//     commit writes the fence refused. The caller must stop: tx.Commit now returns sql.ErrTxDone.
func (f *Fencer) Fence(ctx context.Context, tx *sql.Tx) (int64, error) {
	if tx == nil {
		return 0, &MisuseError{Msg: "Fence needs the open *sql.Tx it fences, got nil"}
	}
	var token int64
	err := tx.QueryRowContext(ctx, f.fenceSQL, f.run.Job, f.run.Token, f.run.Attempt).Scan(&token)
	if errors.Is(err, sql.ErrTxDone) { // database/sql says so without a round trip
		return 0, &MisuseError{Msg: "Fence needs an open transaction; this one is already committed or rolled back"}
	}
	if err != nil {
		_ = tx.Rollback()
		return 0, classify(err)
	}
	return token, nil
}

// InTx begins a transaction (opts may be nil), fences it first, runs fn and commits. On any error
// (a refusal, fn's error, a panic) it rolls back and returns (or re-panics) it unchanged, so
// nothing fn wrote commits. Pass the error to ExitCode.
func (f *Fencer) InTx(ctx context.Context, opts *sql.TxOptions, fn func(tx *sql.Tx) error) error {
	if fn == nil {
		return &MisuseError{Msg: "InTx needs a function to run"}
	}
	var tx *sql.Tx
	var err error
	if f.conn != nil {
		tx, err = f.conn.BeginTx(ctx, opts)
	} else {
		tx, err = f.db.BeginTx(ctx, opts)
	}
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback() // a no-op (sql.ErrTxDone) when already over
		}
	}()
	if _, err := f.Fence(ctx, tx); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	committed = true
	return tx.Commit()
}
