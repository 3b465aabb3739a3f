package fence_test

// No database: the environment, the options, the exit codes.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"singleton.dev/fence"
)

var key = strings.Repeat("0123456789abcdef", 4)

func fullEnv() map[string]string {
	return map[string]string{
		"SINGLETON_JOB":             "billing/invoices",
		"SINGLETON_FENCING_TOKEN":   "42",
		"SINGLETON_ATTEMPT":         "6f1c-uid",
		"SINGLETON_PERIOD":          "2027-03-28T01:00:00Z",
		"SINGLETON_IDEMPOTENCY_KEY": key,
		"SINGLETON_PREVIOUS_PERIOD": "",
		"SINGLETON_NEXT_PERIOD":     "2027-03-29T01:00:00Z",
		"SINGLETON_TIME_ZONE":       "Europe/Berlin",
		"SINGLETON_BUSINESS_DATE":   "2027-03-28",
		"SINGLETON_PERIOD_KEY":      "2027-03-28T03:00:00+02:00[Europe/Berlin]",
	}
}

func lookup(env map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := env[k]; return v, ok }
}

func TestFromEnvParsesTheWindow(t *testing.T) {
	for k, v := range fullEnv() {
		t.Setenv(k, v)
	}
	r, err := fence.FromEnv()
	if err != nil {
		t.Fatal(err)
	}
	want := fence.Run{
		Job: "billing/invoices", Token: 42, Attempt: "6f1c-uid",
		Period:         time.Date(2027, 3, 28, 1, 0, 0, 0, time.UTC),
		IdempotencyKey: key,
		NextPeriod:     time.Date(2027, 3, 29, 1, 0, 0, 0, time.UTC),
		TimeZone:       "Europe/Berlin", BusinessDate: "2027-03-28",
		PeriodKey: "2027-03-28T03:00:00+02:00[Europe/Berlin]",
	}
	if r != want {
		t.Fatalf("got  %+v\nwant %+v", r, want)
	}
	if !r.PreviousPeriod.IsZero() {
		t.Fatalf("empty SINGLETON_PREVIOUS_PERIOD gave %v; want none (zero)", r.PreviousPeriod)
	}
	if got := r.Key("stripe/charge"); got != key+"/stripe/charge" {
		t.Fatalf("Key = %q", got)
	}
}

func TestFromLookupDefaultsAndOptionalValues(t *testing.T) {
	env := map[string]string{"SINGLETON_JOB": "a/b", "SINGLETON_FENCING_TOKEN": "9223372036854775807",
		"SINGLETON_PREVIOUS_PERIOD": "2026-12-06T11:00:00+01:00"}
	r, err := fence.FromLookup(lookup(env))
	if err != nil {
		t.Fatal(err)
	}
	if r.Token != 1<<63-1 || r.TimeZone != "UTC" || !r.NextPeriod.IsZero() || r.Attempt != "" {
		t.Fatalf("got %+v", r)
	}
	if !r.PreviousPeriod.Equal(time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)) || r.PreviousPeriod.Location() != time.UTC {
		t.Fatalf("PreviousPeriod = %v; want 2026-12-06T10:00:00Z", r.PreviousPeriod)
	}
}

func TestFromLookupRefusesBadValues(t *testing.T) {
	for _, c := range []struct{ variable, value string }{
		{"SINGLETON_JOB", ""},
		{"SINGLETON_FENCING_TOKEN", ""},
		{"SINGLETON_FENCING_TOKEN", "0"},
		{"SINGLETON_FENCING_TOKEN", "-1"},
		{"SINGLETON_FENCING_TOKEN", "+5"},
		{"SINGLETON_FENCING_TOKEN", "4x"},
		{"SINGLETON_FENCING_TOKEN", "9223372036854775808"},
		{"SINGLETON_PERIOD", "2027-03-28 01:00"},
		{"SINGLETON_PREVIOUS_PERIOD", "yesterday"},
		{"SINGLETON_NEXT_PERIOD", "2027-13-01T00:00:00Z"},
		{"SINGLETON_IDEMPOTENCY_KEY", key[:63]},
		{"SINGLETON_IDEMPOTENCY_KEY", "g" + key[1:]},
		{"SINGLETON_BUSINESS_DATE", "28.03.2027"},
	} {
		t.Run(c.variable+"="+c.value, func(t *testing.T) {
			env := fullEnv()
			if c.value == "" {
				delete(env, c.variable)
			} else {
				env[c.variable] = c.value
			}
			_, err := fence.FromLookup(lookup(env))
			var config *fence.ConfigError
			if !errors.As(err, &config) || config.Var != c.variable || !strings.Contains(err.Error(), c.variable) {
				t.Fatalf("got %v; want a ConfigError naming %s", err, c.variable)
			}
			if code := fence.ExitCode(err); code != 2 {
				t.Fatalf("ExitCode = %d; want 2", code)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	refused := &fence.FenceRefused{SQLState: "SF004", Message: "superseded"}
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{&fence.ConfigError{Var: "SINGLETON_JOB", Msg: "is not set"}, 2},
		{&fence.MisuseError{Msg: "no transaction"}, 2},
		{refused, 3},
		{fmt.Errorf("invoicing: %w", refused), 3},
		{errors.New("connection refused"), 1},
		{context.DeadlineExceeded, 1},
	} {
		if got := fence.ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d; want %d", c.err, got, c.want)
		}
	}
	for state, kind := range map[string]error{"SF001": fence.ErrStaleToken, "SF002": fence.ErrNotPermitted,
		"SF003": fence.ErrNeverIssued, "SF004": fence.ErrAttemptSuperseded} {
		err := fmt.Errorf("wrapped: %w", &fence.FenceRefused{SQLState: state})
		if !errors.Is(err, kind) || errors.Is(err, fence.ErrStaleToken) != (state == "SF001") {
			t.Errorf("%s does not match exactly its kind %v", state, kind)
		}
	}
}

// A driver New does not know, registered for the option tests (sql.Open does not connect).
type unknownDriver struct{}

func (unknownDriver) Open(string) (driver.Conn, error) { return nil, errors.New("not a database") }

func init() { sql.Register("fence-test-unknown", unknownDriver{}) }

func TestNewRefusesBadConfiguration(t *testing.T) {
	pg, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	run := fence.Run{Job: "a/b", Token: 1, Attempt: "pod"}
	var config *fence.ConfigError
	for _, prefix := range []string{"", "Singleton_", "1st_", "a-b_", "a b", "x;drop", strings.Repeat("a", 33)} {
		if _, err := fence.New(pg, run, fence.WithTablePrefix(prefix)); !errors.As(err, &config) || fence.ExitCode(err) != 2 {
			t.Errorf("prefix %q: got %v; want a ConfigError", prefix, err)
		}
	}
	for _, prefix := range []string{"singleton_", "a", "tenant_42_", strings.Repeat("a", 32)} {
		if _, err := fence.New(pg, run, fence.WithTablePrefix(prefix)); err != nil {
			t.Errorf("prefix %q: %v", prefix, err)
		}
	}
	for _, bad := range []fence.Run{{Token: 1, Attempt: "pod"}, {Job: "a/b", Attempt: "pod"}, {Job: "a/b", Token: 1},
		{Job: "a/b", Token: 1, Attempt: strings.Repeat("x", 254)}} {
		if _, err := fence.New(pg, bad); !errors.As(err, &config) {
			t.Errorf("run %+v: got %v; want a ConfigError", bad, err)
		}
	}
	var misuse *fence.MisuseError
	if _, err := fence.New((*sql.DB)(nil), run); !errors.As(err, &misuse) {
		t.Errorf("nil *sql.DB: got %v; want a MisuseError", err)
	}
	other, _ := sql.Open("fence-test-unknown", "")
	if _, err := fence.New(other, run); !errors.As(err, &config) || !strings.Contains(err.Error(), "WithEngine") {
		t.Errorf("unknown driver: got %v; want a ConfigError pointing at WithEngine", err)
	}
	if f, err := fence.New(other, run, fence.WithEngine(fence.MySQL)); err != nil || f.Engine() != fence.MySQL {
		t.Errorf("WithEngine: %v", err)
	}
	if _, err := fence.New(pg, run, fence.WithEngine(fence.MySQL)); err != nil {
		t.Errorf("WithEngine overriding detection: %v", err)
	}
}
