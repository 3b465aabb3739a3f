//! The backstop's schema: versioned migrations, safe with several replicas racing.
//!
//! All names derive from the [`TablePrefix`] (default `singleton_`) and live in the connection's
//! `current_schema()` (normally `public`):
//!
//! | name                         | what                                                       |
//! |------------------------------|------------------------------------------------------------|
//! | `<p>schema_version`          | one row per applied migration, with the oldest schema a    |
//! |                              | controller must know to claim once it is applied (7)      |
//! | `<p>claims`                  | one row per live claim of a (job, period): UNIQUE(job,     |
//! |                              | period), with the claiming cluster and its confirmation (4) |
//! |                              | and the outcome of the run holding its token (schema 8)     |
//! | `<p>withdrawn_claims`        | the claims withdrawn before their run started, moved out of |
//! |                              | `<p>claims` with the reason, per (job, token) (schema 9)    |
//! | `<p>fences`                  | one row per job: the highest fencing token, the highest     |
//! |                              | retired one (its period decided: refused from then on), and |
//! |                              | the role that owns the job (schema 3)                       |
//! |                              | and the newest registered attempt of the token (schema 5)   |
//! |                              | and the namespace that owns the job key (schema 6)          |
//! | `<p>attempts`                | every attempt (pod) that registered, per (job, token) (5)   |
//! | `<p>fence_rejections`        | sequence: stale tokens refused by `<p>fence()`             |
//! | `<p>attempt(job, token, id)` | an attempt registers as its run's newest (schema 5)        |
//! | `<p>fence(job, token, id)`   | the function a workload calls inside its own transaction  |
//! | `<p>fence(job, token)`       | the same, token only: for runs whose attempts never register |
//! | `<p>fence_check(job, token)` | internal: the checks and the row lock both fences share (5) |
//!
//! Migrations so far only add: an older controller keeps working against a newer schema. One that
//! does not is listed in [`NOT_ONLY_ADDING`], and older controllers then refuse to claim.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use tokio_postgres::Client;

use crate::backstop::config::TablePrefix;
use crate::backstop::refusals::*;

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = 9;

/// The first schema whose version table says which controllers may claim against it (`needs`).
const NEEDS_SINCE: i32 = 7;

/// The migrations that change what an existing row, column or function means rather than only
/// adding: once one is applied, a controller must know it to claim, and an older one refuses (a
/// `BackstopReady` condition says why) instead of misreading it. Such a migration must also make
/// the statements an older controller already connected runs fail (rename what they use), since
/// a controller checks on connecting only. None so far: every migration up to
/// [`SCHEMA_VERSION`] only adds, and a controller of schema 6 to 8 claims against schema 9 as
/// before (schema 9's archive of withdrawn claims is a table of its own: an older controller's
/// withdrawal deletes the claim row without archiving it, which loses only the audit row).
const NOT_ONLY_ADDING: &[i32] = &[];

/// The oldest schema a controller must know to claim once migration `version` is applied.
fn needs(version: i32) -> i32 {
    if NOT_ONLY_ADDING.contains(&version) {
        version
    } else {
        0
    }
}

/// Fully qualified, ready-to-splice names of one backstop's objects.
#[derive(Clone, Debug)]
pub(crate) struct Tables {
    pub prefix: TablePrefix,
    pub version: String,
    pub claims: String,
    /// Schema 9: the claims withdrawn before their run started (`migration_9`).
    pub withdrawn_claims: String,
    pub fences: String,
    pub rejections: String,
    pub function: String,
    /// Schema 5: the attempts table, the registration function and the shared check.
    pub attempts: String,
    pub attempt_function: String,
    pub check_function: String,
}

impl Tables {
    pub fn new(schema: &str, prefix: &TablePrefix) -> Self {
        let schema = quote_ident(schema);
        let q = |suffix: &str| format!("{schema}.{prefix}{suffix}");
        Tables {
            version: q("schema_version"),
            claims: q("claims"),
            withdrawn_claims: q("withdrawn_claims"),
            fences: q("fences"),
            rejections: q("fence_rejections"),
            function: q("fence"),
            attempts: q("attempts"),
            attempt_function: q("attempt"),
            check_function: q("fence_check"),
            prefix: prefix.clone(),
        }
    }
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Migration `version`'s statements (for tests that set up an older schema).
#[cfg(test)]
pub(crate) fn migration_sql(version: i32, t: &Tables) -> Option<String> {
    migration(version, t)
}

/// The whole schema as one script, as [`migrate`] leaves it in an empty schema `public` (the
/// version table, every migration, their rows): for the client libraries' tests, which load it
/// from `clients/testdata/` (checked against this by a test) instead of running a controller.
#[cfg(test)]
pub(crate) fn script(prefix: &TablePrefix) -> String {
    let t = Tables::new("public", prefix);
    let mut out = format!(
        "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());\n",
        t.version
    );
    let mut version = 0;
    while let Some(sql) = migration(version + 1, &t) {
        version += 1;
        out.push_str(&sql);
        out.push_str(&if version >= NEEDS_SINCE {
            format!(
                "\nINSERT INTO {} (version, needs) VALUES ({version}, {});\n",
                t.version,
                needs(version)
            )
        } else {
            format!(
                "\nINSERT INTO {} (version) VALUES ({version});\n",
                t.version
            )
        });
    }
    out
}

/// Migration `version`'s statements.
fn migration(version: i32, t: &Tables) -> Option<String> {
    let Tables { claims, fences, .. } = t;
    match version {
        1 => Some(migration_1(t)),
        2 => Some(migration_2(t)),
        3 => Some(migration_3(t)),
        // Multi-cluster (docs/multi-cluster.md): which cluster claimed the period, and when it
        // confirmed it was starting the Job. An unconfirmed claim of another cluster may be taken
        // over after a bound judged by the database's clock (`claimed_at`, `now()`). Rows already
        // there, and rows an older controller inserts, get the empty identity: never taken over.
        4 => Some(format!(
            r#"
ALTER TABLE {claims} ADD COLUMN cluster text NOT NULL DEFAULT '';
ALTER TABLE {claims} ADD COLUMN confirmed_at timestamptz;
COMMENT ON COLUMN {claims}.cluster IS 'singleton-controller: the identity (--cluster-id) of the cluster that claimed the period; empty: none, never taken over';
COMMENT ON COLUMN {claims}.confirmed_at IS 'singleton-controller: the database time its claimer confirmed it was starting the Job; a confirmed claim is never taken over';
"#
        )),
        5 => Some(migration_5(t)),
        // Job keys belong to a namespace (super::owner): the first claim's namespace, recorded
        // by the claim transaction and checked there. Rows already there have none until their
        // next claim records it; an older controller's claims neither record nor check it.
        6 => Some(format!(
            r#"
ALTER TABLE {fences} ADD COLUMN namespace text;
COMMENT ON COLUMN {fences}.namespace IS 'singleton-controller: the Kubernetes namespace that owns the job key (its first claim''s); claims from any other namespace are refused. ''*'': shared with every namespace (set by an administrator); NULL: recorded by the next claim';
"#
        )),
        // Version skew (docs/design.md): each applied migration says which controllers may
        // still claim. Rows already there need nothing (every migration before only added).
        7 => Some(format!(
            r#"
ALTER TABLE {version} ADD COLUMN needs integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN {version}.needs IS 'singleton-controller: the oldest schema version a controller must know to claim once this migration is applied; an older controller refuses to claim';
"#,
            version = t.version
        )),
        // Bulk repair (`kubectl singleton rerun --from --to --only failed`): each period's outcome
        // beside its claim, since the status keeps only the newest history. Written by the run
        // with the row's token only (super::outcomes), cleared when a rerun takes the row over.
        8 => Some(format!(
            r#"
ALTER TABLE {claims} ADD COLUMN outcome text;
COMMENT ON COLUMN {claims}.outcome IS 'singleton-controller: how the run with this row''s token ended (Succeeded, Failed, Replaced, ...); NULL: running, not recorded yet, or recorded by a controller before schema 8';
"#,
            claims = t.claims
        )),
        9 => Some(migration_9(t)),
        _ => None,
    }
}

/// Schema 9 (issue 33, docs/design/prepared-runs.md 3.4): withdrawn claims leave `<p>claims`
/// for this archive, in the withdrawal's transaction under the fence row's lock
/// (`super::attempts`), so the period can be claimed again with a new token while
/// `<p>claims_job_period_key` keeps meaning "at most one live claim per (job, period)". Keyed
/// by (job, token): a period may be withdrawn more than once, each time with its own token.
/// Nothing that asks "has this period run" reads it (a withdrawn claim never ran). Only adds:
/// an older controller claims against it unchanged.
fn migration_9(t: &Tables) -> String {
    let p = &t.prefix;
    let withdrawn_claims = &t.withdrawn_claims;
    format!(
        r#"
CREATE TABLE {withdrawn_claims} (
    job          text        NOT NULL,
    period       timestamptz NOT NULL,
    token        bigint      NOT NULL CHECK (token > 0),
    job_name     text        NOT NULL,
    cluster      text        NOT NULL DEFAULT '',
    claimed_at   timestamptz NOT NULL,
    withdrawn_at timestamptz NOT NULL DEFAULT now(),
    reason       text        NOT NULL,
    CONSTRAINT {p}withdrawn_claims_pkey PRIMARY KEY (job, token)
);
COMMENT ON TABLE {withdrawn_claims} IS 'singleton-controller: the claims withdrawn before their run started (their token retired), moved out of {p}claims so the period can be claimed again; one row per (job, token)';
COMMENT ON COLUMN {withdrawn_claims}.reason IS 'singleton-controller: why the claim was withdrawn (BackstopOutage, Suspended, ScheduleChanged, ...)';
"#
    )
}

/// Schema 1: the claims and fences tables, the rejection counter and `<p>fence()`.
fn migration_1(t: &Tables) -> String {
    let p = &t.prefix;
    let Tables {
        claims,
        fences,
        rejections,
        function,
        ..
    } = t;
    format!(
        r#"
CREATE TABLE {claims} (
    job        text        NOT NULL,
    period     timestamptz NOT NULL,
    token      bigint      NOT NULL CHECK (token > 0),
    job_name   text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT {p}claims_job_period_key UNIQUE (job, period)
);
COMMENT ON TABLE {claims} IS 'singleton-controller: one row per (SingletonJob namespace/name, period) ever claimed; the source of truth for "has this period run"';

CREATE TABLE {fences} (
    job   text   NOT NULL CONSTRAINT {p}fences_pkey PRIMARY KEY,
    token bigint NOT NULL CHECK (token >= 0)
);
COMMENT ON TABLE {fences} IS 'singleton-controller: the highest fencing token issued per SingletonJob (namespace/name)';

-- A sequence, not a counter row: the rejecting transaction aborts (that is the point of the
-- RAISE), and an UPDATE of a counter table would be rolled back with it. nextval() is never
-- rolled back. It may jump ahead after a server crash (sequences pre-log values): it is a
-- metric, read with rate()/increase(), not an audit log.
CREATE SEQUENCE {rejections};
COMMENT ON SEQUENCE {rejections} IS 'singleton-controller: count of stale fencing tokens refused by {p}fence()';

-- Called by a workload inside its own transaction, before its writes (or before COMMIT). It
-- takes the fence row's lock, so:
--  * a stale token (below the stored fence) raises SF001 and the whole transaction aborts;
--  * a current or newer token advances the fence and holds the row lock until the transaction
--    ends, so a newer run's fence advance waits for it and an older run's call waits behind a
--    newer open transaction, then, when that commits, sees the new token (READ COMMITTED
--    re-checks the WHERE on the updated row) and fails. It never slips through.
-- SECURITY DEFINER with a pinned search_path: the workload's role needs EXECUTE on this function
-- only, never write access to the fence table.
CREATE FUNCTION {function}(job text, token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    stored bigint;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION '{p}fence: job must not be null and token must be a non-negative number'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO {fences} AS f (job, token) VALUES ($1, $2)
    ON CONFLICT ON CONSTRAINT {p}fences_pkey
    DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
    RETURNING f.token INTO stored;
    IF FOUND THEN
        RETURN stored;
    END IF;
    SELECT f.token INTO stored FROM {fences} AS f WHERE f.job = $1;
    PERFORM nextval('{rejections}');
    RAISE EXCEPTION 'stale fencing token % for job %: current is %', $2, $1, stored
        USING ERRCODE = '{STALE_TOKEN_SQLSTATE}',
              HINT = 'a newer run of this job holds the fence; this run must stop without committing';
END
$fn$;
REVOKE ALL ON FUNCTION {function}(text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION {function}(text, bigint) IS 'singleton-controller: call inside your transaction with SINGLETON_JOB and SINGLETON_FENCING_TOKEN; raises SQLSTATE {STALE_TOKEN_SQLSTATE} when a newer run holds the fence';
"#
    )
}

/// A token is retired once its period is decided (the run finished, or was decided
/// without a Job): from then on no write with it passes the fence, even though it still
/// equals the stored token. Without this, a run re-created with its own token (a paused
/// claimer resuming after its period was completed and its Job pruned) would pass.
fn migration_2(t: &Tables) -> String {
    let p = &t.prefix;
    let Tables {
        fences,
        rejections,
        function,
        ..
    } = t;
    format!(
        r#"
ALTER TABLE {fences} ADD COLUMN retired bigint NOT NULL DEFAULT 0 CHECK (retired >= 0);
COMMENT ON COLUMN {fences}.retired IS 'singleton-controller: the highest token whose period is decided; {p}fence() refuses it and every lower one';

CREATE OR REPLACE FUNCTION {function}(job text, token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    stored bigint;
    retired_at bigint;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION '{p}fence: job must not be null and token must be a non-negative number'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO {fences} AS f (job, token) VALUES ($1, $2)
    ON CONFLICT ON CONSTRAINT {p}fences_pkey
    DO UPDATE SET token = EXCLUDED.token
        WHERE f.token <= EXCLUDED.token AND f.retired < EXCLUDED.token
    RETURNING f.token INTO stored;
    IF FOUND THEN
        RETURN stored;
    END IF;
    SELECT f.token, f.retired INTO stored, retired_at FROM {fences} AS f WHERE f.job = $1;
    PERFORM nextval('{rejections}');
    IF $2 <= retired_at AND $2 >= stored THEN
        RAISE EXCEPTION 'fencing token % for job % is retired: its period was decided', $2, $1
            USING ERRCODE = '{STALE_TOKEN_SQLSTATE}',
                  HINT = 'this run is over (or a copy of it was started again); it must stop without committing';
    END IF;
    RAISE EXCEPTION 'stale fencing token % for job %: current is %', $2, $1, stored
        USING ERRCODE = '{STALE_TOKEN_SQLSTATE}',
              HINT = 'a newer run of this job holds the fence; this run must stop without committing';
END
$fn$;
REVOKE ALL ON FUNCTION {function}(text, bigint) FROM PUBLIC;
"#
    )
}

/// Migration 3: fence per tenant. Each fence row names the role that owns the job (`owner`,
/// the login role of the controller connection that created the row: a column default, so an
/// older controller's unchanged INSERTs record it too; rows already there get the role running
/// this migration). `fence()` now
///  * refuses (SF002, not counted) a caller whose login role (`session_user`: inside a SECURITY
///    DEFINER function `current_user` is the function's owner) is not a member of `owner`, so
///    EXECUTE on the function no longer lets one tenant fence another's job;
///  * never creates a row: a job no claim created cannot be pre-squatted;
///  * refuses (SF003, counted) a token above the stored one, the highest the controller issued:
///    a token that was never issued cannot be followed by any run, and the maximum bigint would
///    leave the job no next token. So it no longer raises the fence; it takes the row lock
///    (`FOR UPDATE`, re-read under READ COMMITTED after a wait) and checks. The owner is checked
///    before the lock, so a caller with no right never holds or waits for the row.
fn migration_3(t: &Tables) -> String {
    let p = &t.prefix;
    let Tables {
        fences,
        rejections,
        function,
        ..
    } = t;
    format!(
        r#"
ALTER TABLE {fences} ADD COLUMN owner name NOT NULL DEFAULT session_user;
COMMENT ON COLUMN {fences}.owner IS 'singleton-controller: the database role that owns this job; {p}fence() accepts only callers whose login role is a member of it';

CREATE OR REPLACE FUNCTION {function}(job text, token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    stored bigint;
    retired_at bigint;
    owned_by name;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION '{p}fence: job must not be null and token must be a non-negative number'
            USING ERRCODE = '22023';
    END IF;
    -- Who may fence it, before any lock: a caller with no right never holds the row. The
    -- owner never changes once the row exists.
    SELECT f.owner INTO owned_by FROM {fences} AS f WHERE f.job = $1;
    IF NOT FOUND THEN
        PERFORM nextval('{rejections}');
        RAISE EXCEPTION 'fencing token % for job % was never issued', $2, $1
            USING ERRCODE = '{NEVER_ISSUED_SQLSTATE}',
                  HINT = 'no run of this job was claimed in this database and table prefix';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r WHERE r.rolname = owned_by)
       OR NOT pg_catalog.pg_has_role(session_user, owned_by, 'MEMBER') THEN
        RAISE EXCEPTION 'role % may not fence job %', session_user, $1
            USING ERRCODE = '{NOT_PERMITTED_SQLSTATE}',
                  HINT = format('the job belongs to role %s: grant that role to the workload''s role', owned_by);
    END IF;
    SELECT f.token, f.retired INTO stored, retired_at
        FROM {fences} AS f WHERE f.job = $1 FOR UPDATE;
    IF $2 > stored THEN
        PERFORM nextval('{rejections}');
        RAISE EXCEPTION 'fencing token % for job % was never issued: the newest is %', $2, $1, stored
            USING ERRCODE = '{NEVER_ISSUED_SQLSTATE}',
                  HINT = 'use SINGLETON_FENCING_TOKEN as the controller set it';
    END IF;
    IF $2 = stored AND $2 > retired_at THEN
        RETURN stored;
    END IF;
    PERFORM nextval('{rejections}');
    IF $2 <= retired_at AND $2 >= stored THEN
        RAISE EXCEPTION 'fencing token % for job % is retired: its period was decided', $2, $1
            USING ERRCODE = '{STALE_TOKEN_SQLSTATE}',
                  HINT = 'this run is over (or a copy of it was started again); it must stop without committing';
    END IF;
    RAISE EXCEPTION 'stale fencing token % for job %: current is %', $2, $1, stored
        USING ERRCODE = '{STALE_TOKEN_SQLSTATE}',
              HINT = 'a newer run of this job holds the fence; this run must stop without committing';
END
$fn$;
REVOKE ALL ON FUNCTION {function}(text, bigint) FROM PUBLIC;
"#
    )
}

/// The expression of the advisory lock key that marks a job's fence holders (schema 5), for the
/// job in `$1`: every fence call and registration holds it, shared, until its transaction ends,
/// so the sessions holding a job's fence are listed in `pg_locks` (break-lock ends them).
pub(crate) fn holder_key_sql(t: &Tables) -> String {
    format!("pg_catalog.hashtextextended('{}' || $1, 0)", t.prefix)
}

/// Migration 5: attempts (issue 31). A run (one token) may have several pods over its life (a pod
/// deleted, evicted or on a node that stopped answering is replaced). Each registers as an
/// attempt with its pod uid; registrations take the fence row's lock, so they are ordered with
/// the fenced transactions, and the newest registered attempt is the only one whose fenced
/// transactions commit:
///  * `<p>attempt(job, token, attempt)` registers (idempotent for the newest); it waits for an
///    older attempt's open fenced transaction, which so commits before the newer attempt begins;
///  * `<p>fence(job, token, attempt)` accepts only the newest registered attempt of the token;
///  * `<p>fence(job, token)` keeps its meaning for runs whose attempts never register (token-level
///    fencing: it cannot tell two pods of one run apart), and refuses once one did;
///  * both fences and the registration share `<p>fence_check`: the owner, the row lock, the
///    token's checks of schema 3, and a shared advisory lock that names the holders (break-lock).
///
/// The newest attempt counts only while `attempt_token` is the stored token, so the claim's fence
/// advance (also an older controller's) needs no change.
fn migration_5(t: &Tables) -> String {
    [
        attempt_columns(t),
        fence_check(t),
        attempt_fences(t),
        attempt_register(t),
    ]
    .concat()
}

/// Schema 5, part 1: the fence row's newest attempt, and the attempts table.
fn attempt_columns(t: &Tables) -> String {
    let p = &t.prefix;
    let Tables {
        fences, attempts, ..
    } = t;
    format!(
        r#"
ALTER TABLE {fences} ADD COLUMN attempt text;
ALTER TABLE {fences} ADD COLUMN attempt_token bigint NOT NULL DEFAULT 0;
ALTER TABLE {fences} ADD COLUMN attempt_seq integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN {fences}.attempt IS 'singleton-controller: the newest registered attempt (pod uid) of the run with token attempt_token; only it may fence';

CREATE TABLE {attempts} (
    job           text        NOT NULL,
    token         bigint      NOT NULL,
    seq           integer     NOT NULL CHECK (seq > 0),
    attempt       text        NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT {p}attempts_pkey PRIMARY KEY (job, token, seq),
    CONSTRAINT {p}attempts_attempt_key UNIQUE (job, token, attempt)
);
COMMENT ON TABLE {attempts} IS 'singleton-controller: every attempt (pod) of a run that registered with {p}attempt(), in order';

"#
    )
}

/// Schema 5, part 2: `<p>fence_check`, shared by both fences and the registration: the owner,
/// the row lock, the token's checks, and the shared advisory lock `holder` that names the
/// holders (break-lock).
fn fence_check(t: &Tables) -> String {
    let p = &t.prefix;
    let Tables {
        fences,
        rejections,
        check_function,
        ..
    } = t;
    let holder = holder_key_sql(t);
    format!(
        r#"CREATE FUNCTION {check_function}(job text, token bigint,
    OUT stored bigint, OUT newest text, OUT newest_seq integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    retired_at bigint;
    owned_by name;
    newest_token bigint;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION '{p}fence: job must not be null and token must be a non-negative number'
            USING ERRCODE = '22023';
    END IF;
    SELECT f.owner INTO owned_by FROM {fences} AS f WHERE f.job = $1;
    IF NOT FOUND THEN
        PERFORM nextval('{rejections}');
        RAISE EXCEPTION 'fencing token % for job % was never issued', $2, $1
            USING ERRCODE = '{NEVER_ISSUED_SQLSTATE}',
                  HINT = 'no run of this job was claimed in this database and table prefix';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r WHERE r.rolname = owned_by)
       OR NOT pg_catalog.pg_has_role(session_user, owned_by, 'MEMBER') THEN
        RAISE EXCEPTION 'role % may not fence job %', session_user, $1
            USING ERRCODE = '{NOT_PERMITTED_SQLSTATE}',
                  HINT = format('the job belongs to role %s: grant that role to the workload''s role', owned_by);
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock_shared({holder});
    SELECT f.token, f.retired, f.attempt, f.attempt_token, f.attempt_seq
        INTO stored, retired_at, newest, newest_token, newest_seq
        FROM {fences} AS f WHERE f.job = $1 FOR UPDATE;
    IF $2 > stored THEN
        PERFORM nextval('{rejections}');
        RAISE EXCEPTION 'fencing token % for job % was never issued: the newest is %', $2, $1, stored
            USING ERRCODE = '{NEVER_ISSUED_SQLSTATE}',
                  HINT = 'use SINGLETON_FENCING_TOKEN as the controller set it';
    END IF;
    IF $2 < stored OR $2 <= retired_at THEN
        PERFORM nextval('{rejections}');
        IF $2 <= retired_at AND $2 >= stored THEN
            RAISE EXCEPTION 'fencing token % for job % is retired: its period was decided', $2, $1
                USING ERRCODE = '{STALE_TOKEN_SQLSTATE}',
                      HINT = 'this run is over (or a copy of it was started again); it must stop without committing';
        END IF;
        RAISE EXCEPTION 'stale fencing token % for job %: current is %', $2, $1, stored
            USING ERRCODE = '{STALE_TOKEN_SQLSTATE}',
                  HINT = 'a newer run of this job holds the fence; this run must stop without committing';
    END IF;
    IF newest_token <> stored THEN
        newest := NULL;
        newest_seq := 0;
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION {check_function}(text, bigint) FROM PUBLIC;

"#
    )
}

/// Schema 5, part 3: the two fences, `<p>fence(job, token)` and `<p>fence(job, token, attempt)`.
fn attempt_fences(t: &Tables) -> String {
    let p = &t.prefix;
    let Tables {
        rejections,
        function,
        attempts,
        check_function,
        ..
    } = t;
    format!(
        r#"CREATE OR REPLACE FUNCTION {function}(job text, token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM {check_function}($1, $2);
    IF r.newest IS NOT NULL THEN
        PERFORM nextval('{rejections}');
        RAISE EXCEPTION 'the run of job % with fencing token % has registered attempts: fence with {p}fence(job, token, attempt)', $1, $2
            USING ERRCODE = '{ATTEMPT_SQLSTATE}',
                  HINT = 'pass SINGLETON_ATTEMPT: without it this call cannot tell the run''s newest attempt from an older one';
    END IF;
    RETURN r.stored;
END
$fn$;
REVOKE ALL ON FUNCTION {function}(text, bigint) FROM PUBLIC;

CREATE FUNCTION {function}(job text, token bigint, attempt text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    IF $3 IS NULL OR $3 = '' THEN
        RAISE EXCEPTION '{p}fence: attempt must not be empty (pass SINGLETON_ATTEMPT)'
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO r FROM {check_function}($1, $2);
    IF r.newest IS DISTINCT FROM $3 THEN
        PERFORM nextval('{rejections}');
        IF EXISTS (SELECT 1 FROM {attempts} AS a WHERE a.job = $1 AND a.token = $2 AND a.attempt = $3) THEN
            RAISE EXCEPTION 'attempt % of job % (fencing token %) was superseded by attempt #% (%)', $3, $1, $2, r.newest_seq, r.newest
                USING ERRCODE = '{ATTEMPT_SQLSTATE}',
                      HINT = 'a newer pod of this run registered: this one must stop without committing';
        END IF;
        RAISE EXCEPTION 'attempt % of job % (fencing token %) is not registered', $3, $1, $2
            USING ERRCODE = '{ATTEMPT_SQLSTATE}',
                  HINT = 'call {p}attempt(job, token, attempt) once when the attempt starts, before its work';
    END IF;
    RETURN r.stored;
END
$fn$;
REVOKE ALL ON FUNCTION {function}(text, bigint, text) FROM PUBLIC;
COMMENT ON FUNCTION {function}(text, bigint, text) IS 'singleton-controller: call first inside your transaction with SINGLETON_JOB, SINGLETON_FENCING_TOKEN and SINGLETON_ATTEMPT; raises SQLSTATE {STALE_TOKEN_SQLSTATE} when a newer run holds the fence, {ATTEMPT_SQLSTATE} when a newer attempt of this run registered';

"#
    )
}

/// Schema 5, part 4: `<p>attempt()`, the registration of an attempt (pod).
fn attempt_register(t: &Tables) -> String {
    let p = &t.prefix;
    let Tables {
        fences,
        rejections,
        attempts,
        attempt_function,
        check_function,
        ..
    } = t;
    format!(
        r#"CREATE FUNCTION {attempt_function}(job text, token bigint, attempt text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
    next_seq integer;
BEGIN
    IF $3 IS NULL OR $3 = '' OR length($3) > 253 THEN
        RAISE EXCEPTION '{p}attempt: attempt must be 1 to 253 characters (pass SINGLETON_ATTEMPT)'
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO r FROM {check_function}($1, $2);
    IF r.newest = $3 THEN
        RETURN r.newest_seq;
    END IF;
    IF EXISTS (SELECT 1 FROM {attempts} AS a WHERE a.job = $1 AND a.token = $2 AND a.attempt = $3) THEN
        PERFORM nextval('{rejections}');
        RAISE EXCEPTION 'attempt % of job % (fencing token %) was superseded by attempt #% (%)', $3, $1, $2, r.newest_seq, r.newest
            USING ERRCODE = '{ATTEMPT_SQLSTATE}',
                  HINT = 'a newer pod of this run registered: this one must stop without committing';
    END IF;
    next_seq := r.newest_seq + 1;
    INSERT INTO {attempts} (job, token, seq, attempt) VALUES ($1, $2, next_seq, $3);
    UPDATE {fences} AS f SET attempt = $3, attempt_token = $2, attempt_seq = next_seq WHERE f.job = $1;
    RETURN next_seq;
END
$fn$;
REVOKE ALL ON FUNCTION {attempt_function}(text, bigint, text) FROM PUBLIC;
COMMENT ON FUNCTION {attempt_function}(text, bigint, text) IS 'singleton-controller: call once when an attempt (pod) of a run starts, with SINGLETON_JOB, SINGLETON_FENCING_TOKEN and SINGLETON_ATTEMPT; from then on only this attempt''s fenced transactions commit';
"#
    )
}

/// Creates or upgrades the schema; returns the version now in place and the table names. Safe
/// to call concurrently from many connections and replicas: a transaction-scoped advisory lock
/// (keyed by schema and prefix) serialises the callers, so `CREATE TABLE` never races on the
/// catalog and each migration is applied exactly once.
pub(crate) async fn migrate(client: &mut Client, prefix: &TablePrefix) -> Result<(i32, Tables)> {
    let pg = |e| Error::from_pg(e, false);
    let schema: Option<String> = client
        .query_one("SELECT current_schema()", &[])
        .await
        .map_err(pg)?
        .get(0);
    let schema = schema.ok_or_else(|| {
        Error::BackstopConfig(
            "the connection has no current schema (empty search_path): cannot create the backstop tables"
                .into(),
        )
    })?;
    let tables = Tables::new(&schema, prefix);
    let tx = client.transaction().await.map_err(pg)?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&lock_key(&schema, prefix)],
    )
    .await
    .map_err(locked)?;
    crate::failpoint::hit(crate::failpoint::SCHEMA_LOCKED);
    tx.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
        tables.version
    ))
    .await
    .map_err(pg)?;
    let current: i32 = tx
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {}", tables.version),
            &[],
        )
        .await
        .map_err(pg)?
        .get(0);
    let version = apply_migrations(&tx, &tables, current).await?;
    tx.commit().await.map_err(pg)?;
    verify_owners(client, &schema, prefix).await?;
    let needed: i32 = client
        .query_one(
            &format!("SELECT coalesce(max(needs), 0) FROM {}", tables.version),
            &[],
        )
        .await
        .map_err(pg)?
        .get(0);
    // A newer release changed what the tables mean: claiming now could misread them.
    if needed > SCHEMA_VERSION {
        return Err(Error::BackstopConfig(format!(
            "the backstop schema is at version {version} and needs a controller that knows schema {needed} or newer to claim; this controller knows schema {SCHEMA_VERSION}: upgrade the controller (docs/operations.md, \"Upgrades and rollbacks\")"
        )));
    }
    if version > SCHEMA_VERSION {
        tracing::info!(
            version,
            known = SCHEMA_VERSION,
            "backstop schema is newer than this controller; migrations only add, continuing"
        );
    }
    Ok((version, tables))
}

/// Applies the migrations after `current` in the schema lock's transaction, recording each
/// (with the oldest controller that may still claim, from [`NEEDS_SINCE`] on); returns the
/// version now in place.
async fn apply_migrations(
    tx: &tokio_postgres::Transaction<'_>,
    tables: &Tables,
    current: i32,
) -> Result<i32> {
    let pg = |e| Error::from_pg(e, false);
    let mut version = current;
    while let Some(sql) = migration(version + 1, tables) {
        version += 1;
        tx.batch_execute(&sql).await.map_err(pg)?;
        if version >= NEEDS_SINCE {
            tx.execute(
                &format!(
                    "INSERT INTO {} (version, needs) VALUES ($1, $2)",
                    tables.version
                ),
                &[&version, &needs(version)],
            )
            .await
        } else {
            tx.execute(
                &format!("INSERT INTO {} (version) VALUES ($1)", tables.version),
                &[&version],
            )
            .await
        }
        .map_err(pg)?;
    }
    Ok(version)
}

/// The schema lock's wait ended by `lock_timeout`: another session (a replica connecting, or one
/// paused inside its migration until the server ends its idle transaction) holds it. No
/// workload takes this lock, so it is not [`Error::FenceHeld`]; it passes like any outage.
fn locked(e: tokio_postgres::Error) -> Error {
    match Error::from_pg(e, false) {
        Error::FenceHeld(_) => Error::BackstopUnavailable(
            "another session holds the backstop schema's migration lock (a replica connecting or migrating); retrying".into(),
        ),
        other => other,
    }
}

/// The backstop's tables, sequence and functions (by name, without the schema).
fn object_names(prefix: &TablePrefix) -> (Vec<String>, Vec<String>) {
    let named = |suffixes: &[&str]| suffixes.iter().map(|s| format!("{prefix}{s}")).collect();
    (
        named(&[
            "schema_version",
            "claims",
            "withdrawn_claims",
            "fences",
            "attempts",
            "fence_rejections",
        ]),
        named(&["fence", "attempt", "fence_check"]),
    )
}

/// N7: refuses a backstop whose objects belong to a role the controller's is not a member of.
/// `CREATE TABLE IF NOT EXISTS` and the version table trust what is there, so another role that
/// may create objects in the schema (PUBLIC on `public` before PostgreSQL 15, or any shared
/// schema) could plant them first: say a `fence()` that accepts every token, and tables it can
/// read and edit. A role the controller's is a member of (a DBA's that ran the migrations) is
/// trusted; so is any owner for a superuser, who is a member of every role.
async fn verify_owners(client: &Client, schema: &str, prefix: &TablePrefix) -> Result<()> {
    let (relations, functions) = object_names(prefix);
    let rows = client
        .query(
            "SELECT c.relname::text, pg_catalog.pg_get_userbyid(c.relowner)::text \
             FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = ANY($2) \
               AND NOT pg_catalog.pg_has_role(current_user, c.relowner, 'MEMBER') \
             UNION ALL \
             SELECT p.proname::text, pg_catalog.pg_get_userbyid(p.proowner)::text \
             FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = $1 AND p.proname = ANY($3) \
               AND NOT pg_catalog.pg_has_role(current_user, p.proowner, 'MEMBER') \
             ORDER BY 1",
            &[&schema, &relations, &functions],
        )
        .await
        .map_err(|e| Error::from_pg(e, false))?;
    if rows.is_empty() {
        return Ok(());
    }
    let foreign: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} (owner {})",
                r.get::<_, String>(0),
                r.get::<_, String>(1)
            )
        })
        .collect();
    Err(Error::BackstopConfig(format!(
        "the backstop's objects in schema {schema} belong to roles the controller's role is not a member of: {}; another role created them first, so they cannot be trusted (a planted fence function could accept every token). Drop them and let the controller create its own, or give it a schema of its own (docs/security.md)",
        foreign.join(", ")
    )))
}

/// The advisory lock key for one (schema, prefix): a stable hash, so every replica and version of
/// the controller agrees on it.
pub(crate) fn lock_key(schema: &str, prefix: &TablePrefix) -> i64 {
    let digest = Sha256::digest(format!("singleton-controller/schema/{schema}.{prefix}"));
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(bytes)
}
