package fence_test

// The real databases the tests run against: a fresh database per engine and run, with the
// schema the controller creates (../testdata), dropped at the end. The controller's side (issuing
// and retiring tokens) is done here in SQL as the admin user.

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
)

type engine struct {
	name   string
	env    string // the variable holding the admin URL
	driver string

	once     sync.Once
	setupErr error
	admin    *sql.DB // the server, as the admin user
	db       *sql.DB // the test database, as the admin user
	dbName   string
	cleanups []string // SQL run as the admin at the end, in order
	dsnFor   func(user, password string) string
}

var engines = []*engine{
	{name: "postgres", env: "DATABASE_URL", driver: "pgx"},
	{name: "mariadb", env: "MARIADB_URL", driver: "mysql"},
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, e := range engines {
		e.teardown()
	}
	os.Exit(code)
}

// eachEngine runs test on both engines, as subtests named after them.
func eachEngine(t *testing.T, test func(t *testing.T, e *engine)) {
	t.Helper()
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			e.once.Do(func() { e.setupErr = e.setup() })
			if e.setupErr != nil {
				t.Fatalf("%s: %v", e.name, e.setupErr)
			}
			test(t, e)
		})
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (e *engine) setup() error {
	raw := os.Getenv(e.env)
	if raw == "" {
		return fmt.Errorf("%s is not set: the tests need a real server (hack/%s.sh up; %s=$(hack/%s.sh url)), or run clients/go/test.sh", e.env, e.name, e.env, e.name)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s: %v", e.env, err)
	}
	e.dbName = "go_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch e.name {
	case "postgres":
		e.dsnFor = func(user, password string) string {
			v := *u
			v.Path = "/" + e.dbName
			if user != "" {
				v.User = url.UserPassword(user, password)
			}
			return v.String()
		}
		if e.admin, err = sql.Open("pgx", raw); err != nil {
			return err
		}
	case "mariadb":
		pw, _ := u.User.Password()
		e.dsnFor = func(user, password string) string {
			cfg := mysql.NewConfig()
			cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, e.dbName
			cfg.User, cfg.Passwd = u.User.Username(), pw
			if user != "" {
				cfg.User, cfg.Passwd = user, password
			}
			return cfg.FormatDSN()
		}
		cfg := mysql.NewConfig()
		cfg.Net, cfg.Addr, cfg.User, cfg.Passwd = "tcp", u.Host, u.User.Username(), pw
		// Dropping the database waits for sessions still using it: not for long.
		cfg.Params = map[string]string{"lock_wait_timeout": "10"}
		if e.admin, err = sql.Open("mysql", cfg.FormatDSN()); err != nil {
			return err
		}
	}
	if _, err := e.admin.ExecContext(ctx, "CREATE DATABASE "+e.dbName); err != nil {
		return fmt.Errorf("%s: CREATE DATABASE: %v", e.env, err)
	}
	if e.name == "postgres" {
		e.cleanups = append(e.cleanups, "DROP DATABASE IF EXISTS "+e.dbName+" WITH (FORCE)")
	} else {
		e.cleanups = append(e.cleanups, "DROP DATABASE IF EXISTS "+e.dbName)
	}
	if e.db, err = sql.Open(e.driver, e.dsnFor("", "")); err != nil {
		return err
	}
	schema, err := os.ReadFile("../testdata/" + e.name + ".sql")
	if err != nil {
		return err
	}
	var statements []string
	if e.name == "postgres" {
		statements = []string{string(schema)} // pgx sends an argument-less Exec as one simple query
	} else {
		var kept []string
		for _, line := range strings.Split(string(schema), "\n") {
			if !strings.HasPrefix(line, "--") && !strings.HasPrefix(line, "DELIMITER") {
				kept = append(kept, line)
			}
		}
		statements = strings.Split(strings.Join(kept, "\n"), "\n//\n")
	}
	statements = append(statements, "CREATE TABLE go_writes (job VARCHAR(512) NOT NULL, token BIGINT NOT NULL)")
	for _, s := range statements {
		if strings.TrimSpace(s) == "" {
			continue
		}
		if _, err := e.db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("loading the schema: %v\n%.200s", err, s)
		}
	}
	return nil
}

func (e *engine) teardown() {
	if e.db != nil {
		e.db.Close()
	}
	if e.admin == nil {
		return
	}
	// The database first: a role with privileges in it cannot be dropped before.
	for _, c := range e.cleanups {
		if _, err := e.admin.Exec(c); err != nil {
			fmt.Fprintf(os.Stderr, "%s cleanup: %s: %v\n", e.name, c, err)
		}
	}
	e.admin.Close()
}

func (e *engine) exec(t *testing.T, query string, args ...any) {
	t.Helper()
	if _, err := e.db.Exec(query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// issue makes token the job's current one, as the controller's claim does.
func (e *engine) issue(t *testing.T, job string, token int64) {
	t.Helper()
	if e.name == "postgres" {
		e.exec(t, "INSERT INTO singleton_fences (job, token) VALUES ($1, $2) ON CONFLICT (job) DO UPDATE SET token = EXCLUDED.token", job, token)
	} else {
		e.exec(t, "INSERT INTO singleton_fences (job, token, owner) VALUES (?, ?, SUBSTRING_INDEX(SESSION_USER(), '@', 1)) ON DUPLICATE KEY UPDATE token = VALUES(token)", job, token)
	}
}

// retire marks token's period decided, as the controller does once the run's Job is over.
func (e *engine) retire(t *testing.T, job string, token int64) {
	t.Helper()
	e.exec(t, e.q("UPDATE singleton_fences SET retired = $1 WHERE job = $2"), token, job)
}

// writes counts go_writes rows of job: what fenced transactions committed.
func (e *engine) writes(t *testing.T, job string) int {
	t.Helper()
	var n int
	if err := e.db.QueryRow(e.q("SELECT count(*) FROM go_writes WHERE job = $1"), job).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// rejections is the database's count of refusals: it moves only when a fence call reached it.
func (e *engine) rejections(t *testing.T) int64 {
	t.Helper()
	query := "SELECT n FROM singleton_fence_rejections WHERE id = 1"
	if e.name == "postgres" {
		query = "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM singleton_fence_rejections"
	}
	var n int64
	if err := e.db.QueryRow(query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// q turns $n placeholders into ? for MariaDB.
func (e *engine) q(query string) string {
	if e.name == "postgres" {
		return query
	}
	for i := 9; i >= 1; i-- {
		query = strings.ReplaceAll(query, fmt.Sprintf("$%d", i), "?")
	}
	return query
}

// stranger opens the test database as a new login that may call the functions but owns no job.
func (e *engine) stranger(t *testing.T) *sql.DB {
	t.Helper()
	user := "go_" + randomHex(5)
	if e.name == "postgres" {
		e.exec(t, "CREATE ROLE "+user+" LOGIN PASSWORD 'x'")
		e.cleanups = append(e.cleanups, "DROP ROLE IF EXISTS "+user)
		e.exec(t, "GRANT EXECUTE ON FUNCTION singleton_attempt(text, bigint, text), singleton_fence(text, bigint, text) TO "+user)
		e.exec(t, "GRANT SELECT, INSERT ON go_writes TO "+user)
	} else {
		e.exec(t, "CREATE USER '"+user+"'@'%' IDENTIFIED BY 'x'")
		e.cleanups = append(e.cleanups, "DROP USER IF EXISTS '"+user+"'@'%'")
		e.exec(t, "GRANT EXECUTE, SELECT, INSERT ON "+e.dbName+".* TO '"+user+"'@'%'")
	}
	db, err := sql.Open(e.driver, e.dsnFor(user, "x"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
