package fence

import (
	"errors"
	"fmt"
	"iter"
	"reflect"
	"strings"
)

// The kinds of [FenceRefused], for errors.Is. A refusal never turns into a success on retry: the
// run must stop without committing.
var (
	// ErrStaleToken (SF001): a newer run holds the fence, or this run's period was decided (its
	// token is retired).
	ErrStaleToken = errors.New("stale fencing token")
	// ErrNotPermitted (SF002): this database user/role may not fence the job.
	ErrNotPermitted = errors.New("not permitted to fence the job")
	// ErrNeverIssued (SF003): the controller never issued this token for the job.
	ErrNeverIssued = errors.New("fencing token never issued")
	// ErrAttemptSuperseded (SF004): a newer pod of this run registered, or this one never did.
	ErrAttemptSuperseded = errors.New("attempt superseded")
)

var kinds = map[string]error{
	"SF001": ErrStaleToken,
	"SF002": ErrNotPermitted,
	"SF003": ErrNeverIssued,
	"SF004": ErrAttemptSuperseded,
}

// MariaDB/MySQL raise the same refusals with these error numbers too, because some drivers drop
// the SQLSTATE.
var errnos = map[int]string{31001: "SF001", 31002: "SF002", 31003: "SF003", 31004: "SF004"}

// FenceRefused is the database refusing this run (SQLSTATE SF001 to SF004). Match the kind with
// errors.Is(err, ErrStaleToken) and so on; errors.As still reaches the driver's own error.
type FenceRefused struct {
	SQLState string // SF001 to SF004
	Message  string // the server's message, e.g. "stale fencing token 41 for job a/b: current is 42"
	Err      error  // the driver's error
}

func (e *FenceRefused) Error() string {
	return fmt.Sprintf("refused by the fence (SQLSTATE %s): %s", e.SQLState, e.Message)
}

func (e *FenceRefused) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrStaleToken) and the other kinds work.
func (e *FenceRefused) Is(target error) bool { return kinds[e.SQLState] == target }

// ConfigError is bad input: a missing or invalid SINGLETON_* variable (Var names it), a bad
// option, or arguments the database rejected as invalid (SQLSTATE 22023).
type ConfigError struct {
	Var string // the environment variable, or empty
	Msg string
	Err error // the cause, if any
}

func (e *ConfigError) Error() string {
	if e.Var != "" {
		return "configuration: " + e.Var + ": " + e.Msg
	}
	return "configuration: " + e.Msg
}

func (e *ConfigError) Unwrap() error { return e.Err }

// MisuseError is the library called the wrong way (no transaction open for Fence, one already
// open for Register, ...). Nothing was sent to the database.
type MisuseError struct{ Msg string }

func (e *MisuseError) Error() string { return "misuse: " + e.Msg }

// ExitCode gives the process's exit code for err, as the chart's podFailurePolicy example
// expects: 0 success, 2 bad input/configuration/misuse, 3 refused by the fence (FailJob: no retry
// can help), 1 anything else (a retry may help). err may wrap the library's errors or a driver's.
func ExitCode(err error) int {
	var config *ConfigError
	var misuse *MisuseError
	var refused *FenceRefused
	switch {
	case err == nil:
		return 0
	case errors.As(err, &refused):
		return 3
	case errors.As(err, &config), errors.As(err, &misuse):
		return 2
	}
	// A refusal straight from a driver: the caller's own SQL called the fence.
	if s, ok := serverError(err); ok && kinds[s.state] != nil {
		return 3
	}
	return 1
}

// classify turns a driver's error into a *FenceRefused or *ConfigError where it is one, else
// returns it unchanged.
func classify(err error) error {
	s, ok := serverError(err)
	if !ok {
		return err
	}
	if _, refused := kinds[s.state]; refused {
		return &FenceRefused{SQLState: s.state, Message: s.msg, Err: err}
	}
	if s.state == "22023" {
		return &ConfigError{Msg: s.msg, Err: err}
	}
	return err
}

// dbError is what the library needs of a server's error.
type dbError struct {
	state string // SQLSTATE; from MariaDB/MySQL without one, derived from errno where known
	errno int    // MariaDB/MySQL only
	msg   string
}

// serverError finds the server's error in err's chain without importing a driver, so a
// PostgreSQL-only program does not link the MySQL driver and the other way round:
//   - pgx's *pgconn.PgError has a SQLState() method (so does lib/pq's *pq.Error);
//   - go-sql-driver's *mysql.MySQLError has only exported fields (Number, SQLState [5]byte,
//     Message), read by name once its type is recognized. Those fields are the driver's v1 API.
//     A build-tagged file would need every user to remember the tag, and forgetting it would
//     silently turn exit code 3 into 1 (a retried run); parsing Error() would depend on its text.
func serverError(err error) (dbError, bool) {
	for e := range chain(err) {
		if s, isPg := e.(interface{ SQLState() string }); isPg {
			return dbError{state: s.SQLState(), msg: stringField(e, "Message", e.Error())}, true
		}
		v := reflect.Indirect(reflect.ValueOf(e))
		if v.Kind() != reflect.Struct || v.Type().PkgPath() != mysqlPkg || v.Type().Name() != "MySQLError" {
			continue
		}
		d := dbError{msg: stringField(e, "Message", e.Error())}
		if f := v.FieldByName("Number"); f.CanUint() {
			d.errno = int(f.Uint())
		}
		if f := v.FieldByName("SQLState"); f.Kind() == reflect.Array && f.Len() == 5 && f.Type().Elem().Kind() == reflect.Uint8 {
			b := make([]byte, 5)
			reflect.Copy(reflect.ValueOf(b), f)
			if strings.Trim(string(b), "\x00") != "" {
				d.state = string(b)
			}
		}
		// By SQLSTATE where the driver gives it, else by the refusals' error numbers.
		if d.state == "" {
			d.state = errnos[d.errno]
		}
		return d, true
	}
	return dbError{}, false
}

const mysqlPkg = "github.com/go-sql-driver/mysql"

func stringField(x any, name, fallback string) string {
	v := reflect.Indirect(reflect.ValueOf(x))
	if v.Kind() == reflect.Struct {
		if f := v.FieldByName(name); f.Kind() == reflect.String && f.String() != "" {
			return f.String()
		}
	}
	return fallback
}

// chain yields err and every error it wraps, depth first, as errors.As visits them.
func chain(err error) iter.Seq[error] {
	return func(yield func(error) bool) {
		var walk func(error) bool
		walk = func(e error) bool {
			if e == nil {
				return true
			}
			if !yield(e) {
				return false
			}
			switch u := e.(type) {
			case interface{ Unwrap() error }:
				return walk(u.Unwrap())
			case interface{ Unwrap() []error }:
				for _, inner := range u.Unwrap() {
					if !walk(inner) {
						return false
					}
				}
			}
			return true
		}
		walk(err)
	}
}
