//! The MariaDB/MySQL schema: the same tables, columns and functions as PostgreSQL's (see
//! docs/fencing.md), every statement safe to run again (DDL commits on its own in MySQL, so a
//! migration cut off half-way is finished by the next one). Version 1 is PostgreSQL's schema 8;
//! version 2 adds `<p>withdrawn_claims`, as PostgreSQL's schema 9 does. Every migration so far
//! only adds (`needs` 0): an older controller claims against a newer schema unchanged. Several
//! replicas racing are serialised by a named lock (`GET_LOCK`), which here only orders
//! migrations: it is no fence (it is a session's, and is released when the connection drops).
//!
//! Differences from PostgreSQL, and why:
//! - `<p>fence_check` is a procedure with OUT parameters (a function cannot return a row).
//! - The refusal counter and the holders table are MyISAM: a refusal aborts the statement, and a
//!   transactional counter would be rolled back with it (PostgreSQL uses a sequence for that).
//!   MyISAM keys are at most 1000 bytes, so holders are keyed by the job's SHA-256.
//! - The owner is a database user (without its host); other users that may fence an owner's jobs
//!   are rows of `<p>fence_members`, which a DBA fills (MariaDB's roles cannot be checked from a
//!   `SQL SECURITY DEFINER` routine).
//! - Every refusal also carries `MYSQL_ERRNO` 31001 to 31004 (SF001 to SF004), for drivers that
//!   drop the SQLSTATE (PyMySQL).
//! - There is no two-argument `<p>fence(job, token)`: MySQL has no overloading, and this engine
//!   never had runs without attempts.

use mysql_async::Conn;
use mysql_async::prelude::Queryable;

use crate::backstop::config::TablePrefix;
use crate::backstop::refusals::*;
use crate::{Error, Result};

/// The newest schema version this build knows.
pub const SCHEMA_VERSION: i32 = 2;

/// The names of one backstop's objects (plain identifiers: the prefix is validated).
#[derive(Clone, Debug)]
pub(crate) struct Tables {
    pub prefix: TablePrefix,
    pub version: String,
    pub claims: String,
    /// Version 2: the claims withdrawn before their run started (`migration_2`).
    pub withdrawn_claims: String,
    pub fences: String,
    pub attempts: String,
    pub rejections: String,
    pub holders: String,
    /// The longest refusal message the server signals (a longer `MESSAGE_TEXT` is an error of
    /// its own, 1648, which would hide the refusal): 512 characters on MariaDB (10.3 and
    /// later), 128 on MySQL. Messages are cut to it.
    pub message_max: usize,
}

impl Tables {
    pub fn new(prefix: &TablePrefix) -> Self {
        let q = |suffix: &str| format!("{prefix}{suffix}");
        Tables {
            version: q("schema_version"),
            claims: q("claims"),
            withdrawn_claims: q("withdrawn_claims"),
            fences: q("fences"),
            attempts: q("attempts"),
            rejections: q("fence_rejections"),
            holders: q("fence_holders"),
            prefix: prefix.clone(),
            message_max: MARIADB_MESSAGE_MAX,
        }
    }

    /// The names for a MySQL server (not MariaDB): shorter refusal messages.
    pub fn for_mysql(mut self) -> Self {
        self.message_max = MYSQL_MESSAGE_MAX;
        self
    }
}

/// See [`Tables::message_max`].
const MARIADB_MESSAGE_MAX: usize = 512;
const MYSQL_MESSAGE_MAX: usize = 128;

/// The routines a workload calls, and the one they share: the controller checks who defined them.
pub(crate) fn routine_names(prefix: &TablePrefix) -> [String; 3] {
    [
        format!("{prefix}fence_check"),
        format!("{prefix}fence"),
        format!("{prefix}attempt"),
    ]
}

/// The version table, created before the lock's holder reads it.
pub(crate) fn version_table(t: &Tables) -> String {
    let p = &t.prefix;
    format!(
        r#"CREATE TABLE IF NOT EXISTS {p}schema_version (
    version    INT         NOT NULL PRIMARY KEY,
    needs      INT         NOT NULL DEFAULT 0,
    applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB COMMENT='singleton-controller: one row per applied migration'"#
    )
}

/// Migration `version`'s statements, in order, each run on its own (no `DELIMITER` needed) and
/// each safe to run again; `None` past the newest.
pub(crate) fn migration(version: i32, t: &Tables) -> Option<Vec<String>> {
    match version {
        1 => Some(migration_1(t)),
        2 => Some(migration_2(t)),
        _ => None,
    }
}

/// Migration 1's statements: the tables and routines PostgreSQL has at its schema 8.
fn migration_1(t: &Tables) -> Vec<String> {
    // Routines are dropped first: MySQL has no CREATE OR REPLACE for them, and a migration cut
    // off between the two statements is finished by the next run of it.
    [
        tables(t),
        fence_check_routine(t),
        fence_routine(t),
        attempt_routine(t),
    ]
    .concat()
}

/// Migration 2 (PostgreSQL's schema 9; docs/design/prepared-runs.md 3.4): the archive that
/// withdrawn claims move into (postgres/schema.rs `migration_9`), so the period can be claimed
/// again while `<p>claims`' primary key (job, period) keeps meaning "at most one live claim".
/// The columns are `<p>claims`' own; `withdrawn_at` is written by the withdrawal (UTC).
fn migration_2(t: &Tables) -> Vec<String> {
    let p = &t.prefix;
    vec![format!(
        r#"CREATE TABLE IF NOT EXISTS {p}withdrawn_claims (
    job          VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    period       DATETIME(6)  NOT NULL COMMENT 'the scheduled instant, UTC',
    token        BIGINT       NOT NULL,
    job_name     VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    cluster      VARCHAR(253) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    claimed_at   DATETIME(6)  NOT NULL COMMENT 'UTC, by the database clock',
    withdrawn_at DATETIME(6)  NOT NULL COMMENT 'UTC, by the database clock',
    reason       VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'why: BackstopOutage, Suspended, ScheduleChanged, ...',
    CONSTRAINT {p}withdrawn_claims_pkey PRIMARY KEY (job, token),
    CONSTRAINT {p}withdrawn_claims_token CHECK (token > 0)
) ENGINE=InnoDB COMMENT='singleton-controller: the claims withdrawn before their run started, moved out of {p}claims; one row per (job, token)'"#
    )]
}

/// The tables, and the refusal counter's one row.
fn tables(t: &Tables) -> Vec<String> {
    let p = &t.prefix;
    vec![
        format!(
            r#"CREATE TABLE IF NOT EXISTS {p}claims (
    job          VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    period       DATETIME(6)  NOT NULL COMMENT 'the scheduled instant, UTC',
    token        BIGINT       NOT NULL,
    job_name     VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    claimed_at   DATETIME(6)  NOT NULL COMMENT 'UTC, by the database clock',
    cluster      VARCHAR(253) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    confirmed_at DATETIME(6)  NULL,
    outcome      VARCHAR(32)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    CONSTRAINT {p}claims_job_period_key PRIMARY KEY (job, period),
    CONSTRAINT {p}claims_token CHECK (token > 0)
) ENGINE=InnoDB COMMENT='singleton-controller: one row per (job, period) ever claimed'"#
        ),
        format!(
            r#"CREATE TABLE IF NOT EXISTS {p}fences (
    job           VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    token         BIGINT       NOT NULL,
    retired       BIGINT       NOT NULL DEFAULT 0,
    owner         VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    attempt       VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NULL,
    attempt_token BIGINT       NOT NULL DEFAULT 0,
    attempt_seq   INT          NOT NULL DEFAULT 0,
    namespace     VARCHAR(253) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    CONSTRAINT {p}fences_token CHECK (token >= 0 AND retired >= 0)
) ENGINE=InnoDB COMMENT='singleton-controller: per job the highest token issued, the highest retired, the owner, the newest attempt'"#
        ),
        format!(
            r#"CREATE TABLE IF NOT EXISTS {p}attempts (
    job           VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    token         BIGINT       NOT NULL,
    seq           INT          NOT NULL,
    attempt       VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    registered_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (job, token, seq),
    UNIQUE KEY {p}attempts_attempt (job, token, attempt)
) ENGINE=InnoDB COMMENT='singleton-controller: every attempt (pod) of a run that registered'"#
        ),
        format!(
            r#"CREATE TABLE IF NOT EXISTS {p}fence_members (
    owner  VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    member VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (owner, member)
) ENGINE=InnoDB COMMENT='singleton-controller: database users (member) that may fence the jobs of another (owner); filled by a DBA'"#
        ),
        format!(
            r#"CREATE TABLE IF NOT EXISTS {p}fence_rejections (
    id TINYINT NOT NULL PRIMARY KEY,
    n  BIGINT UNSIGNED NOT NULL
) ENGINE=MyISAM COMMENT='singleton-controller: refusals by the fence; MyISAM so that the refused transaction''s rollback keeps the count'"#
        ),
        format!(
            r#"INSERT INTO {p}fence_rejections (id, n) VALUES (1, 0) ON DUPLICATE KEY UPDATE id = id"#
        ),
        format!(
            r#"CREATE TABLE IF NOT EXISTS {p}fence_holders (
    job_hash   BINARY(32)   NOT NULL COMMENT 'SHA-256 of job: MyISAM keys are at most 1000 bytes',
    connection BIGINT UNSIGNED NOT NULL,
    job        VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    since      DATETIME(6)  NOT NULL,
    PRIMARY KEY (job_hash, connection)
) ENGINE=MyISAM COMMENT='singleton-controller: the connections that fenced a job (break-lock finds the open ones); MyISAM so a rollback keeps the row'"#
        ),
    ]
}

/// `<p>fence_check`: the checks and the row lock both functions share.
fn fence_check_routine(t: &Tables) -> Vec<String> {
    let p = &t.prefix;
    let max = t.message_max;
    vec![
        format!("DROP PROCEDURE IF EXISTS {p}fence_check"),
        format!(
            r#"CREATE PROCEDURE {p}fence_check(IN p_job VARCHAR(512), IN p_token BIGINT, OUT o_newest VARCHAR(253), OUT o_newest_seq INT)
    MODIFIES SQL DATA SQL SECURITY DEFINER
    COMMENT 'singleton-controller: internal, the checks both the fence and the registration make'
BEGIN
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_owner VARCHAR(128);
    DECLARE v_caller VARCHAR(128) DEFAULT SUBSTRING_INDEX(SESSION_USER(), '@', 1);
    DECLARE v_stored BIGINT;
    DECLARE v_retired BIGINT;
    DECLARE v_newest_token BIGINT;
    DECLARE v_msg VARCHAR(2048);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    IF p_job IS NULL OR p_token IS NULL OR p_token < 0 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = '{p}fence: job must not be null and token must be a non-negative number';
    END IF;
    SELECT f.owner INTO v_owner FROM {p}fences AS f WHERE f.job = p_job;
    IF v_found = 0 THEN
        UPDATE {p}fence_rejections SET n = n + 1 WHERE id = 1;
        SET v_msg = CONCAT('fencing token ', p_token, ' for job ', p_job, ' was never issued');
        SET v_msg = LEFT(v_msg, {max});
        SIGNAL SQLSTATE '{NEVER_ISSUED_SQLSTATE}' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31003;
    END IF;
    IF v_caller <> v_owner AND NOT EXISTS (SELECT 1 FROM {p}fence_members AS m WHERE m.owner = v_owner AND m.member = v_caller) THEN
        SET v_msg = CONCAT('user ', v_caller, ' may not fence job ', p_job);
        SET v_msg = LEFT(v_msg, {max});
        SIGNAL SQLSTATE '{NOT_PERMITTED_SQLSTATE}' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31002;
    END IF;
    SELECT f.token, f.retired, f.attempt, f.attempt_token, f.attempt_seq
        INTO v_stored, v_retired, o_newest, v_newest_token, o_newest_seq
        FROM {p}fences AS f WHERE f.job = p_job FOR UPDATE;
    INSERT INTO {p}fence_holders (job_hash, connection, job, since) VALUES (UNHEX(SHA2(p_job, 256)), CONNECTION_ID(), p_job, UTC_TIMESTAMP(6))
        ON DUPLICATE KEY UPDATE since = VALUES(since);
    IF p_token > v_stored THEN
        UPDATE {p}fence_rejections SET n = n + 1 WHERE id = 1;
        SET v_msg = CONCAT('fencing token ', p_token, ' for job ', p_job, ' was never issued: the newest is ', v_stored);
        SET v_msg = LEFT(v_msg, {max});
        SIGNAL SQLSTATE '{NEVER_ISSUED_SQLSTATE}' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31003;
    END IF;
    IF p_token < v_stored OR p_token <= v_retired THEN
        UPDATE {p}fence_rejections SET n = n + 1 WHERE id = 1;
        IF p_token <= v_retired AND p_token >= v_stored THEN
            SET v_msg = CONCAT('fencing token ', p_token, ' for job ', p_job, ' is retired: its period was decided');
        ELSE
            SET v_msg = CONCAT('stale fencing token ', p_token, ' for job ', p_job, ': current is ', v_stored);
        END IF;
        SET v_msg = LEFT(v_msg, {max});
        SIGNAL SQLSTATE '{STALE_TOKEN_SQLSTATE}' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31001;
    END IF;
    IF v_newest_token <> v_stored THEN
        SET o_newest = NULL;
        SET o_newest_seq = 0;
    END IF;
END"#
        ),
    ]
}

/// `<p>fence(job, token, attempt)`: what a workload calls first in its transaction.
fn fence_routine(t: &Tables) -> Vec<String> {
    let p = &t.prefix;
    let max = t.message_max;
    vec![
        format!("DROP FUNCTION IF EXISTS {p}fence"),
        format!(
            r#"CREATE FUNCTION {p}fence(p_job VARCHAR(512), p_token BIGINT, p_attempt VARCHAR(253)) RETURNS BIGINT
    NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER
    COMMENT 'singleton-controller: call first inside your transaction with SINGLETON_JOB, SINGLETON_FENCING_TOKEN and SINGLETON_ATTEMPT; raises SQLSTATE SF001 to SF004 when this run may not commit'
BEGIN
    DECLARE v_newest VARCHAR(253);
    DECLARE v_seq INT;
    DECLARE v_msg VARCHAR(2048);
    IF p_attempt IS NULL OR p_attempt = '' THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = '{p}fence: attempt must not be empty (pass SINGLETON_ATTEMPT)';
    END IF;
    CALL {p}fence_check(p_job, p_token, v_newest, v_seq);
    IF v_newest IS NULL OR v_newest <> p_attempt THEN
        UPDATE {p}fence_rejections SET n = n + 1 WHERE id = 1;
        IF EXISTS (SELECT 1 FROM {p}attempts AS a WHERE a.job = p_job AND a.token = p_token AND a.attempt = p_attempt) THEN
            SET v_msg = CONCAT('attempt ', p_attempt, ' of job ', p_job, ' (fencing token ', p_token, ') was superseded by attempt #', v_seq, ' (', COALESCE(v_newest, ''), ')');
        ELSE
            SET v_msg = CONCAT('attempt ', p_attempt, ' of job ', p_job, ' (fencing token ', p_token, ') is not registered');
        END IF;
        SET v_msg = LEFT(v_msg, {max});
        SIGNAL SQLSTATE '{ATTEMPT_SQLSTATE}' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31004;
    END IF;
    RETURN p_token;
END"#
        ),
    ]
}

/// `<p>attempt(job, token, attempt)`: a pod registers as its run's newest attempt.
fn attempt_routine(t: &Tables) -> Vec<String> {
    let p = &t.prefix;
    let max = t.message_max;
    vec![
        format!("DROP FUNCTION IF EXISTS {p}attempt"),
        format!(
            r#"CREATE FUNCTION {p}attempt(p_job VARCHAR(512), p_token BIGINT, p_attempt VARCHAR(253)) RETURNS INT
    NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER
    COMMENT 'singleton-controller: call once when an attempt (pod) of a run starts, with SINGLETON_JOB, SINGLETON_FENCING_TOKEN and SINGLETON_ATTEMPT'
BEGIN
    DECLARE v_newest VARCHAR(253);
    DECLARE v_seq INT;
    DECLARE v_msg VARCHAR(2048);
    IF p_attempt IS NULL OR p_attempt = '' OR CHAR_LENGTH(p_attempt) > 253 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = '{p}attempt: attempt must be 1 to 253 characters (pass SINGLETON_ATTEMPT)';
    END IF;
    CALL {p}fence_check(p_job, p_token, v_newest, v_seq);
    IF v_newest = p_attempt THEN
        RETURN v_seq;
    END IF;
    IF EXISTS (SELECT 1 FROM {p}attempts AS a WHERE a.job = p_job AND a.token = p_token AND a.attempt = p_attempt) THEN
        UPDATE {p}fence_rejections SET n = n + 1 WHERE id = 1;
        SET v_msg = CONCAT('attempt ', p_attempt, ' of job ', p_job, ' (fencing token ', p_token, ') was superseded by attempt #', v_seq, ' (', COALESCE(v_newest, ''), ')');
        SET v_msg = LEFT(v_msg, {max});
        SIGNAL SQLSTATE '{ATTEMPT_SQLSTATE}' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31004;
    END IF;
    SET v_seq = v_seq + 1;
    INSERT INTO {p}attempts (job, token, seq, attempt, registered_at) VALUES (p_job, p_token, v_seq, p_attempt, UTC_TIMESTAMP(6));
    UPDATE {p}fences SET attempt = p_attempt, attempt_token = p_token, attempt_seq = v_seq WHERE job = p_job;
    RETURN v_seq;
END"#
        ),
    ]
}

/// The whole schema as a script for the `mariadb` client (statements end with a line `//`): for
/// the client libraries' tests, which load it from `clients/testdata/` (checked against this).
#[cfg(test)]
pub(crate) fn script(prefix: &TablePrefix) -> String {
    let t = Tables::new(prefix);
    let mut out = String::from("DELIMITER //\n");
    out.push_str(&version_table(&t));
    out.push_str("\n//\n");
    let mut version = 0;
    while let Some(statements) = migration(version + 1, &t) {
        version += 1;
        for statement in statements {
            out.push_str(&statement);
            out.push_str("\n//\n");
        }
        out.push_str(&format!(
            "INSERT INTO {} (version, needs) VALUES ({version}, 0)\n//\n",
            t.version
        ));
    }
    out.push_str("DELIMITER ;\n");
    out
}

/// Creates or finishes the schema; returns the version in place and the table names. Replicas
/// racing take turns on a named lock (bounded by the lock wait of the session), and each
/// statement can run again, so a migration cut off half-way is completed by the next.
pub(crate) async fn migrate(
    conn: &mut Conn,
    prefix: &TablePrefix,
    mariadb: bool,
) -> Result<(i32, Tables)> {
    let t = if mariadb {
        Tables::new(prefix)
    } else {
        Tables::new(prefix).for_mysql()
    };
    let database: Option<String> = conn
        .query_first("SELECT DATABASE()")
        .await
        .map_err(Error::from_mysql)?
        .flatten();
    let database = database.ok_or_else(|| {
        Error::BackstopConfig(
            "the connection names no database: set the URL's path or key `dbname`".into(),
        )
    })?;
    // GET_LOCK names are server-wide and at most 64 characters.
    let lock = format!(
        "singleton-controller/{}",
        crate::naming::short_hash(&format!("{database}.{prefix}"), 16)
    );
    let got: Option<Option<i64>> = conn
        .exec_first("SELECT GET_LOCK(?, 5)", (lock.as_str(),))
        .await
        .map_err(Error::from_mysql)?;
    if got.flatten() != Some(1) {
        return Err(Error::BackstopUnavailable(
            "another session holds the backstop schema's migration lock (a replica connecting or migrating); retrying".into(),
        ));
    }
    let r = migrate_locked(conn, &t).await;
    let released = conn
        .exec_drop("DO RELEASE_LOCK(?)", (lock.as_str(),))
        .await
        .map_err(Error::from_mysql);
    let version = r?;
    released?;
    Ok((version, t))
}

async fn migrate_locked(conn: &mut Conn, t: &Tables) -> Result<i32> {
    conn.query_drop(version_table(t))
        .await
        .map_err(Error::from_mysql)?;
    let current: Option<i32> = conn
        .query_first(format!(
            "SELECT COALESCE(MAX(version), 0) FROM {}",
            t.version
        ))
        .await
        .map_err(Error::from_mysql)?;
    let mut version = current.unwrap_or(0);
    while let Some(statements) = migration(version + 1, t) {
        version += 1;
        for statement in statements {
            conn.query_drop(statement)
                .await
                .map_err(Error::from_mysql)?;
        }
        conn.exec_drop(
            format!("INSERT INTO {} (version, needs) VALUES (?, 0)", t.version),
            (version,),
        )
        .await
        .map_err(Error::from_mysql)?;
    }
    verify_definers(conn, &t.prefix).await?;
    let needed: Option<i32> = conn
        .query_first(format!("SELECT COALESCE(MAX(needs), 0) FROM {}", t.version))
        .await
        .map_err(Error::from_mysql)?;
    let needed = needed.unwrap_or(0);
    if needed > SCHEMA_VERSION {
        return Err(Error::BackstopConfig(format!(
            "the backstop schema is at version {version} and needs a controller that knows schema {needed} or newer to claim; this controller knows schema {SCHEMA_VERSION}: upgrade the controller"
        )));
    }
    Ok(version)
}

/// N7, as for PostgreSQL: routines another user defined are not trusted (a planted
/// `<p>fence()` could accept every token). Tables have no owner in MySQL; the routines are what
/// a workload calls, with their definer's rights.
async fn verify_definers(conn: &mut Conn, prefix: &TablePrefix) -> Result<()> {
    let [a, b, c] = routine_names(prefix);
    let foreign: Vec<(String, String)> = conn
        .exec(
            "SELECT ROUTINE_NAME, DEFINER FROM information_schema.ROUTINES \
             WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME IN (?, ?, ?) \
               AND DEFINER <> CURRENT_USER() ORDER BY 1",
            (a, b, c),
        )
        .await
        .map_err(Error::from_mysql)?;
    if foreign.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = foreign
        .iter()
        .map(|(name, definer)| format!("{name} (definer {definer})"))
        .collect();
    Err(Error::BackstopConfig(format!(
        "the backstop's routines were defined by another user than the controller's: {}; they cannot be trusted (a planted fence could accept every token). Drop them and let the controller create its own, or give it a database of its own (docs/security.md)",
        named.join(", ")
    )))
}
