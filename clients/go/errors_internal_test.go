package fence

// The driver errors as the drivers build them, including what no server here sends: MySQL
// refusals without a SQLSTATE (mapped by error number).

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassifyDriverErrors(t *testing.T) {
	sf := func(s string) (b [5]byte) { copy(b[:], s); return b }
	for _, c := range []struct {
		name  string
		err   error
		state string // "" : not a refusal
		kind  error
		msg   string
	}{
		{"pgx", &pgconn.PgError{Code: "SF001", Message: "stale fencing token 41"}, "SF001", ErrStaleToken, "stale fencing token 41"},
		{"pgx wrapped", fmt.Errorf("x: %w", &pgconn.PgError{Code: "SF004", Message: "m"}), "SF004", ErrAttemptSuperseded, "m"},
		{"mysql sqlstate", &mysql.MySQLError{Number: 31002, SQLState: sf("SF002"), Message: "user x may not fence"}, "SF002", ErrNotPermitted, "user x may not fence"},
		{"mysql errno only", &mysql.MySQLError{Number: 31003, Message: "never issued"}, "SF003", ErrNeverIssued, "never issued"},
		{"mysql joined", errors.Join(errors.New("a"), &mysql.MySQLError{Number: 31001, Message: "m"}), "SF001", ErrStaleToken, "m"},
		{"mysql other", &mysql.MySQLError{Number: 1062, SQLState: sf("23000"), Message: "dup"}, "", nil, ""},
		{"pgx other", &pgconn.PgError{Code: "40001"}, "", nil, ""},
		{"plain", errors.New("eof"), "", nil, ""},
	} {
		got := classify(c.err)
		var refused *FenceRefused
		if c.state == "" {
			if got != c.err || ExitCode(c.err) != 1 {
				t.Errorf("%s: classify = %v, exit %d; want it unchanged, exit 1", c.name, got, ExitCode(c.err))
			}
			continue
		}
		if !errors.As(got, &refused) || refused.SQLState != c.state || refused.Message != c.msg || !errors.Is(got, c.kind) {
			t.Errorf("%s: classify = %#v; want %s %q", c.name, got, c.state, c.msg)
		}
		if ExitCode(c.err) != 3 || ExitCode(got) != 3 {
			t.Errorf("%s: exit codes %d (raw), %d (classified); want 3", c.name, ExitCode(c.err), ExitCode(got))
		}
	}
	var config *ConfigError
	if err := classify(&pgconn.PgError{Code: "22023", Message: "attempt must not be empty"}); !errors.As(err, &config) || ExitCode(err) != 2 {
		t.Errorf("22023: got %v; want a ConfigError", err)
	}
}
