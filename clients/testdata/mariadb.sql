-- Generated from controller/src/backstop/mysql/schema.rs (table prefix singleton_): the
-- schema the controller creates, for the client libraries' tests. Do not edit.
-- Statements end with a line '//': load with `mariadb` as is, or split on that line.
DELIMITER //
CREATE TABLE IF NOT EXISTS singleton_schema_version (
    version    INT         NOT NULL PRIMARY KEY,
    needs      INT         NOT NULL DEFAULT 0,
    applied_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB COMMENT='singleton-controller: one row per applied migration'
//
CREATE TABLE IF NOT EXISTS singleton_claims (
    job          VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    period       DATETIME(6)  NOT NULL COMMENT 'the scheduled instant, UTC',
    token        BIGINT       NOT NULL,
    job_name     VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    claimed_at   DATETIME(6)  NOT NULL COMMENT 'UTC, by the database clock',
    cluster      VARCHAR(253) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    confirmed_at DATETIME(6)  NULL,
    outcome      VARCHAR(32)  CHARACTER SET ascii COLLATE ascii_bin NULL,
    CONSTRAINT singleton_claims_job_period_key PRIMARY KEY (job, period),
    CONSTRAINT singleton_claims_token CHECK (token > 0)
) ENGINE=InnoDB COMMENT='singleton-controller: one row per (job, period) ever claimed'
//
CREATE TABLE IF NOT EXISTS singleton_fences (
    job           VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
    token         BIGINT       NOT NULL,
    retired       BIGINT       NOT NULL DEFAULT 0,
    owner         VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    attempt       VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NULL,
    attempt_token BIGINT       NOT NULL DEFAULT 0,
    attempt_seq   INT          NOT NULL DEFAULT 0,
    namespace     VARCHAR(253) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    CONSTRAINT singleton_fences_token CHECK (token >= 0 AND retired >= 0)
) ENGINE=InnoDB COMMENT='singleton-controller: per job the highest token issued, the highest retired, the owner, the newest attempt'
//
CREATE TABLE IF NOT EXISTS singleton_attempts (
    job           VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    token         BIGINT       NOT NULL,
    seq           INT          NOT NULL,
    attempt       VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    registered_at DATETIME(6)  NOT NULL,
    PRIMARY KEY (job, token, seq),
    UNIQUE KEY singleton_attempts_attempt (job, token, attempt)
) ENGINE=InnoDB COMMENT='singleton-controller: every attempt (pod) of a run that registered'
//
CREATE TABLE IF NOT EXISTS singleton_fence_members (
    owner  VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    member VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    PRIMARY KEY (owner, member)
) ENGINE=InnoDB COMMENT='singleton-controller: database users (member) that may fence the jobs of another (owner); filled by a DBA'
//
CREATE TABLE IF NOT EXISTS singleton_fence_rejections (
    id TINYINT NOT NULL PRIMARY KEY,
    n  BIGINT UNSIGNED NOT NULL
) ENGINE=MyISAM COMMENT='singleton-controller: refusals by the fence; MyISAM so that the refused transaction''s rollback keeps the count'
//
INSERT INTO singleton_fence_rejections (id, n) VALUES (1, 0) ON DUPLICATE KEY UPDATE id = id
//
CREATE TABLE IF NOT EXISTS singleton_fence_holders (
    job_hash   BINARY(32)   NOT NULL COMMENT 'SHA-256 of job: MyISAM keys are at most 1000 bytes',
    connection BIGINT UNSIGNED NOT NULL,
    job        VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    since      DATETIME(6)  NOT NULL,
    PRIMARY KEY (job_hash, connection)
) ENGINE=MyISAM COMMENT='singleton-controller: the connections that fenced a job (break-lock finds the open ones); MyISAM so a rollback keeps the row'
//
DROP PROCEDURE IF EXISTS singleton_fence_check
//
CREATE PROCEDURE singleton_fence_check(IN p_job VARCHAR(512), IN p_token BIGINT, OUT o_newest VARCHAR(253), OUT o_newest_seq INT)
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
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'singleton_fence: job must not be null and token must be a non-negative number';
    END IF;
    SELECT f.owner INTO v_owner FROM singleton_fences AS f WHERE f.job = p_job;
    IF v_found = 0 THEN
        UPDATE singleton_fence_rejections SET n = n + 1 WHERE id = 1;
        SET v_msg = CONCAT('fencing token ', p_token, ' for job ', p_job, ' was never issued');
        SET v_msg = LEFT(v_msg, 512);
        SIGNAL SQLSTATE 'SF003' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31003;
    END IF;
    IF v_caller <> v_owner AND NOT EXISTS (SELECT 1 FROM singleton_fence_members AS m WHERE m.owner = v_owner AND m.member = v_caller) THEN
        SET v_msg = CONCAT('user ', v_caller, ' may not fence job ', p_job);
        SET v_msg = LEFT(v_msg, 512);
        SIGNAL SQLSTATE 'SF002' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31002;
    END IF;
    SELECT f.token, f.retired, f.attempt, f.attempt_token, f.attempt_seq
        INTO v_stored, v_retired, o_newest, v_newest_token, o_newest_seq
        FROM singleton_fences AS f WHERE f.job = p_job FOR UPDATE;
    INSERT INTO singleton_fence_holders (job_hash, connection, job, since) VALUES (UNHEX(SHA2(p_job, 256)), CONNECTION_ID(), p_job, UTC_TIMESTAMP(6))
        ON DUPLICATE KEY UPDATE since = VALUES(since);
    IF p_token > v_stored THEN
        UPDATE singleton_fence_rejections SET n = n + 1 WHERE id = 1;
        SET v_msg = CONCAT('fencing token ', p_token, ' for job ', p_job, ' was never issued: the newest is ', v_stored);
        SET v_msg = LEFT(v_msg, 512);
        SIGNAL SQLSTATE 'SF003' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31003;
    END IF;
    IF p_token < v_stored OR p_token <= v_retired THEN
        UPDATE singleton_fence_rejections SET n = n + 1 WHERE id = 1;
        IF p_token <= v_retired AND p_token >= v_stored THEN
            SET v_msg = CONCAT('fencing token ', p_token, ' for job ', p_job, ' is retired: its period was decided');
        ELSE
            SET v_msg = CONCAT('stale fencing token ', p_token, ' for job ', p_job, ': current is ', v_stored);
        END IF;
        SET v_msg = LEFT(v_msg, 512);
        SIGNAL SQLSTATE 'SF001' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31001;
    END IF;
    IF v_newest_token <> v_stored THEN
        SET o_newest = NULL;
        SET o_newest_seq = 0;
    END IF;
END
//
DROP FUNCTION IF EXISTS singleton_fence
//
CREATE FUNCTION singleton_fence(p_job VARCHAR(512), p_token BIGINT, p_attempt VARCHAR(253)) RETURNS BIGINT
    NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER
    COMMENT 'singleton-controller: call first inside your transaction with SINGLETON_JOB, SINGLETON_FENCING_TOKEN and SINGLETON_ATTEMPT; raises SQLSTATE SF001 to SF004 when this run may not commit'
BEGIN
    DECLARE v_newest VARCHAR(253);
    DECLARE v_seq INT;
    DECLARE v_msg VARCHAR(2048);
    IF p_attempt IS NULL OR p_attempt = '' THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'singleton_fence: attempt must not be empty (pass SINGLETON_ATTEMPT)';
    END IF;
    CALL singleton_fence_check(p_job, p_token, v_newest, v_seq);
    IF v_newest IS NULL OR v_newest <> p_attempt THEN
        UPDATE singleton_fence_rejections SET n = n + 1 WHERE id = 1;
        IF EXISTS (SELECT 1 FROM singleton_attempts AS a WHERE a.job = p_job AND a.token = p_token AND a.attempt = p_attempt) THEN
            SET v_msg = CONCAT('attempt ', p_attempt, ' of job ', p_job, ' (fencing token ', p_token, ') was superseded by attempt #', v_seq, ' (', COALESCE(v_newest, ''), ')');
        ELSE
            SET v_msg = CONCAT('attempt ', p_attempt, ' of job ', p_job, ' (fencing token ', p_token, ') is not registered');
        END IF;
        SET v_msg = LEFT(v_msg, 512);
        SIGNAL SQLSTATE 'SF004' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31004;
    END IF;
    RETURN p_token;
END
//
DROP FUNCTION IF EXISTS singleton_attempt
//
CREATE FUNCTION singleton_attempt(p_job VARCHAR(512), p_token BIGINT, p_attempt VARCHAR(253)) RETURNS INT
    NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER
    COMMENT 'singleton-controller: call once when an attempt (pod) of a run starts, with SINGLETON_JOB, SINGLETON_FENCING_TOKEN and SINGLETON_ATTEMPT'
BEGIN
    DECLARE v_newest VARCHAR(253);
    DECLARE v_seq INT;
    DECLARE v_msg VARCHAR(2048);
    IF p_attempt IS NULL OR p_attempt = '' OR CHAR_LENGTH(p_attempt) > 253 THEN
        SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'singleton_attempt: attempt must be 1 to 253 characters (pass SINGLETON_ATTEMPT)';
    END IF;
    CALL singleton_fence_check(p_job, p_token, v_newest, v_seq);
    IF v_newest = p_attempt THEN
        RETURN v_seq;
    END IF;
    IF EXISTS (SELECT 1 FROM singleton_attempts AS a WHERE a.job = p_job AND a.token = p_token AND a.attempt = p_attempt) THEN
        UPDATE singleton_fence_rejections SET n = n + 1 WHERE id = 1;
        SET v_msg = CONCAT('attempt ', p_attempt, ' of job ', p_job, ' (fencing token ', p_token, ') was superseded by attempt #', v_seq, ' (', COALESCE(v_newest, ''), ')');
        SET v_msg = LEFT(v_msg, 512);
        SIGNAL SQLSTATE 'SF004' SET MESSAGE_TEXT = v_msg, MYSQL_ERRNO = 31004;
    END IF;
    SET v_seq = v_seq + 1;
    INSERT INTO singleton_attempts (job, token, seq, attempt, registered_at) VALUES (p_job, p_token, v_seq, p_attempt, UTC_TIMESTAMP(6));
    UPDATE singleton_fences SET attempt = p_attempt, attempt_token = p_token, attempt_seq = v_seq WHERE job = p_job;
    RETURN v_seq;
END
//
INSERT INTO singleton_schema_version (version, needs) VALUES (1, 0)
//
CREATE TABLE IF NOT EXISTS singleton_withdrawn_claims (
    job          VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    period       DATETIME(6)  NOT NULL COMMENT 'the scheduled instant, UTC',
    token        BIGINT       NOT NULL,
    job_name     VARCHAR(253) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    cluster      VARCHAR(253) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',
    claimed_at   DATETIME(6)  NOT NULL COMMENT 'UTC, by the database clock',
    withdrawn_at DATETIME(6)  NOT NULL COMMENT 'UTC, by the database clock',
    reason       VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT 'why: BackstopOutage, Suspended, ScheduleChanged, ...',
    CONSTRAINT singleton_withdrawn_claims_pkey PRIMARY KEY (job, token),
    CONSTRAINT singleton_withdrawn_claims_token CHECK (token > 0)
) ENGINE=InnoDB COMMENT='singleton-controller: the claims withdrawn before their run started, moved out of singleton_claims; one row per (job, token)'
//
INSERT INTO singleton_schema_version (version, needs) VALUES (2, 0)
//
DELIMITER ;
