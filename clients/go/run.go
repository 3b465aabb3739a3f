package fence

import (
	"encoding/hex"
	"math"
	"os"
	"strconv"
	"time"
)

// Run is what singleton-controller tells a run (a Job's pod) through its environment.
type Run struct {
	Job     string // SINGLETON_JOB: the fence's key, e.g. "billing/invoices"
	Token   int64  // SINGLETON_FENCING_TOKEN: 1 to 2^63-1
	Attempt string // SINGLETON_ATTEMPT: this pod's uid; Register and Fence need it

	Period         time.Time // SINGLETON_PERIOD: the scheduled instant (UTC)
	IdempotencyKey string    // SINGLETON_IDEMPOTENCY_KEY: 64 hex chars, the same for every retry of the period
	// The run covers [PreviousPeriod, Period). Zero when SINGLETON_PREVIOUS_PERIOD is empty: the
	// first run.
	PreviousPeriod time.Time
	NextPeriod     time.Time // SINGLETON_NEXT_PERIOD; zero when empty: the last run
	TimeZone       string    // SINGLETON_TIME_ZONE: IANA name, "UTC" when unset
	BusinessDate   string    // SINGLETON_BUSINESS_DATE: YYYY-MM-DD, the period's local date
	PeriodKey      string    // SINGLETON_PERIOD_KEY: RFC 9557, e.g. 2027-03-28T03:00:00+02:00[Europe/Berlin]
}

// Key returns the idempotency key for one external call of this run: IdempotencyKey + "/" +
// suffix, stable across retries of the period.
func (r Run) Key(suffix string) string { return r.IdempotencyKey + "/" + suffix }

// FromEnv reads the run from the process's environment. SINGLETON_JOB and
// SINGLETON_FENCING_TOKEN are required (SINGLETON_ATTEMPT is checked by Register and Fence); the
// others are checked when set. The error is a *ConfigError naming the variable (exit code 2).
func FromEnv() (Run, error) { return FromLookup(os.LookupEnv) }

// FromLookup is FromEnv reading the variables from lookup instead (os.LookupEnv's shape), for
// tests and for programs that take the values from elsewhere.
func FromLookup(lookup func(string) (string, bool)) (Run, error) {
	get := func(name string) string { v, _ := lookup(name); return v }
	bad := func(name, msg string, cause error) (Run, error) {
		return Run{}, &ConfigError{Var: name, Msg: msg, Err: cause}
	}
	r := Run{
		Job:            get("SINGLETON_JOB"),
		Attempt:        get("SINGLETON_ATTEMPT"),
		IdempotencyKey: get("SINGLETON_IDEMPOTENCY_KEY"),
		TimeZone:       get("SINGLETON_TIME_ZONE"),
		BusinessDate:   get("SINGLETON_BUSINESS_DATE"),
		PeriodKey:      get("SINGLETON_PERIOD_KEY"),
	}
	if r.Job == "" {
		return bad("SINGLETON_JOB", "is not set (the controller sets it on every run)", nil)
	}
	token := get("SINGLETON_FENCING_TOKEN")
	if token == "" {
		return bad("SINGLETON_FENCING_TOKEN", "is not set (the controller sets it on every run)", nil)
	}
	// ParseUint, not ParseInt: no sign is accepted.
	t, err := strconv.ParseUint(token, 10, 64)
	if err != nil || t == 0 || t > math.MaxInt64 {
		return bad("SINGLETON_FENCING_TOKEN", strconv.Quote(token)+" is not a decimal from 1 to 2^63-1", err)
	}
	r.Token = int64(t)
	for _, ts := range []struct {
		name string
		dst  *time.Time
	}{
		{"SINGLETON_PERIOD", &r.Period},
		{"SINGLETON_PREVIOUS_PERIOD", &r.PreviousPeriod},
		{"SINGLETON_NEXT_PERIOD", &r.NextPeriod},
	} {
		if v := get(ts.name); v != "" {
			at, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return bad(ts.name, strconv.Quote(v)+" is not an RFC 3339 timestamp", err)
			}
			*ts.dst = at.UTC()
		}
	}
	if k := r.IdempotencyKey; k != "" {
		if _, err := hex.DecodeString(k); err != nil || len(k) != 64 {
			return bad("SINGLETON_IDEMPOTENCY_KEY", strconv.Quote(k)+" is not 64 hex characters", err)
		}
	}
	if r.TimeZone == "" {
		r.TimeZone = "UTC"
	}
	if d := r.BusinessDate; d != "" {
		if _, err := time.Parse(time.DateOnly, d); err != nil {
			return bad("SINGLETON_BUSINESS_DATE", strconv.Quote(d)+" is not a YYYY-MM-DD date", err)
		}
	}
	return r, nil
}

// check is what Register and Fence need of a run, checked before any SQL: the database would
// refuse these too, but as SQLSTATE 22023 after a round trip.
func (r Run) check() error {
	switch {
	case r.Job == "":
		return &ConfigError{Var: "SINGLETON_JOB", Msg: "is empty"}
	case r.Token <= 0:
		return &ConfigError{Var: "SINGLETON_FENCING_TOKEN", Msg: "must be from 1 to 2^63-1, is " + strconv.FormatInt(r.Token, 10)}
	case r.Attempt == "":
		return &ConfigError{Var: "SINGLETON_ATTEMPT", Msg: "is not set (the pod's uid, which the controller passes on every container)"}
	case len([]rune(r.Attempt)) > 253:
		return &ConfigError{Var: "SINGLETON_ATTEMPT", Msg: "is longer than 253 characters"}
	}
	return nil
}
