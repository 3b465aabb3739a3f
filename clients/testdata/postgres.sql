-- Generated from controller/src/backstop/postgres/schema.rs (table prefix singleton_): the
-- schema the controller creates, for the client libraries' tests. Do not edit.
CREATE TABLE IF NOT EXISTS "public".singleton_schema_version (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());

CREATE TABLE "public".singleton_claims (
    job        text        NOT NULL,
    period     timestamptz NOT NULL,
    token      bigint      NOT NULL CHECK (token > 0),
    job_name   text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT singleton_claims_job_period_key UNIQUE (job, period)
);
COMMENT ON TABLE "public".singleton_claims IS 'singleton-controller: one row per (SingletonJob namespace/name, period) ever claimed; the source of truth for "has this period run"';

CREATE TABLE "public".singleton_fences (
    job   text   NOT NULL CONSTRAINT singleton_fences_pkey PRIMARY KEY,
    token bigint NOT NULL CHECK (token >= 0)
);
COMMENT ON TABLE "public".singleton_fences IS 'singleton-controller: the highest fencing token issued per SingletonJob (namespace/name)';

-- A sequence, not a counter row: the rejecting transaction aborts (that is the point of the
-- RAISE), and an UPDATE of a counter table would be rolled back with it. nextval() is never
-- rolled back. It may jump ahead after a server crash (sequences pre-log values): it is a
-- metric, read with rate()/increase(), not an audit log.
CREATE SEQUENCE "public".singleton_fence_rejections;
COMMENT ON SEQUENCE "public".singleton_fence_rejections IS 'singleton-controller: count of stale fencing tokens refused by singleton_fence()';

-- Called by a workload inside its own transaction, before its writes (or before COMMIT). It
-- takes the fence row's lock, so:
--  * a stale token (below the stored fence) raises SF001 and the whole transaction aborts;
--  * a current or newer token advances the fence and holds the row lock until the transaction
--    ends, so a newer run's fence advance waits for it and an older run's call waits behind a
--    newer open transaction, then, when that commits, sees the new token (READ COMMITTED
--    re-checks the WHERE on the updated row) and fails. It never slips through.
-- SECURITY DEFINER with a pinned search_path: the workload's role needs EXECUTE on this function
-- only, never write access to the fence table.
CREATE FUNCTION "public".singleton_fence(job text, token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    stored bigint;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION 'singleton_fence: job must not be null and token must be a non-negative number'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO "public".singleton_fences AS f (job, token) VALUES ($1, $2)
    ON CONFLICT ON CONSTRAINT singleton_fences_pkey
    DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
    RETURNING f.token INTO stored;
    IF FOUND THEN
        RETURN stored;
    END IF;
    SELECT f.token INTO stored FROM "public".singleton_fences AS f WHERE f.job = $1;
    PERFORM nextval('"public".singleton_fence_rejections');
    RAISE EXCEPTION 'stale fencing token % for job %: current is %', $2, $1, stored
        USING ERRCODE = 'SF001',
              HINT = 'a newer run of this job holds the fence; this run must stop without committing';
END
$fn$;
REVOKE ALL ON FUNCTION "public".singleton_fence(text, bigint) FROM PUBLIC;
COMMENT ON FUNCTION "public".singleton_fence(text, bigint) IS 'singleton-controller: call inside your transaction with SINGLETON_JOB and SINGLETON_FENCING_TOKEN; raises SQLSTATE SF001 when a newer run holds the fence';

INSERT INTO "public".singleton_schema_version (version) VALUES (1);

ALTER TABLE "public".singleton_fences ADD COLUMN retired bigint NOT NULL DEFAULT 0 CHECK (retired >= 0);
COMMENT ON COLUMN "public".singleton_fences.retired IS 'singleton-controller: the highest token whose period is decided; singleton_fence() refuses it and every lower one';

CREATE OR REPLACE FUNCTION "public".singleton_fence(job text, token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    stored bigint;
    retired_at bigint;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION 'singleton_fence: job must not be null and token must be a non-negative number'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO "public".singleton_fences AS f (job, token) VALUES ($1, $2)
    ON CONFLICT ON CONSTRAINT singleton_fences_pkey
    DO UPDATE SET token = EXCLUDED.token
        WHERE f.token <= EXCLUDED.token AND f.retired < EXCLUDED.token
    RETURNING f.token INTO stored;
    IF FOUND THEN
        RETURN stored;
    END IF;
    SELECT f.token, f.retired INTO stored, retired_at FROM "public".singleton_fences AS f WHERE f.job = $1;
    PERFORM nextval('"public".singleton_fence_rejections');
    IF $2 <= retired_at AND $2 >= stored THEN
        RAISE EXCEPTION 'fencing token % for job % is retired: its period was decided', $2, $1
            USING ERRCODE = 'SF001',
                  HINT = 'this run is over (or a copy of it was started again); it must stop without committing';
    END IF;
    RAISE EXCEPTION 'stale fencing token % for job %: current is %', $2, $1, stored
        USING ERRCODE = 'SF001',
              HINT = 'a newer run of this job holds the fence; this run must stop without committing';
END
$fn$;
REVOKE ALL ON FUNCTION "public".singleton_fence(text, bigint) FROM PUBLIC;

INSERT INTO "public".singleton_schema_version (version) VALUES (2);

ALTER TABLE "public".singleton_fences ADD COLUMN owner name NOT NULL DEFAULT session_user;
COMMENT ON COLUMN "public".singleton_fences.owner IS 'singleton-controller: the database role that owns this job; singleton_fence() accepts only callers whose login role is a member of it';

CREATE OR REPLACE FUNCTION "public".singleton_fence(job text, token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    stored bigint;
    retired_at bigint;
    owned_by name;
BEGIN
    IF $1 IS NULL OR $2 IS NULL OR $2 < 0 THEN
        RAISE EXCEPTION 'singleton_fence: job must not be null and token must be a non-negative number'
            USING ERRCODE = '22023';
    END IF;
    -- Who may fence it, before any lock: a caller with no right never holds the row. The
    -- owner never changes once the row exists.
    SELECT f.owner INTO owned_by FROM "public".singleton_fences AS f WHERE f.job = $1;
    IF NOT FOUND THEN
        PERFORM nextval('"public".singleton_fence_rejections');
        RAISE EXCEPTION 'fencing token % for job % was never issued', $2, $1
            USING ERRCODE = 'SF003',
                  HINT = 'no run of this job was claimed in this database and table prefix';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r WHERE r.rolname = owned_by)
       OR NOT pg_catalog.pg_has_role(session_user, owned_by, 'MEMBER') THEN
        RAISE EXCEPTION 'role % may not fence job %', session_user, $1
            USING ERRCODE = 'SF002',
                  HINT = format('the job belongs to role %s: grant that role to the workload''s role', owned_by);
    END IF;
    SELECT f.token, f.retired INTO stored, retired_at
        FROM "public".singleton_fences AS f WHERE f.job = $1 FOR UPDATE;
    IF $2 > stored THEN
        PERFORM nextval('"public".singleton_fence_rejections');
        RAISE EXCEPTION 'fencing token % for job % was never issued: the newest is %', $2, $1, stored
            USING ERRCODE = 'SF003',
                  HINT = 'use SINGLETON_FENCING_TOKEN as the controller set it';
    END IF;
    IF $2 = stored AND $2 > retired_at THEN
        RETURN stored;
    END IF;
    PERFORM nextval('"public".singleton_fence_rejections');
    IF $2 <= retired_at AND $2 >= stored THEN
        RAISE EXCEPTION 'fencing token % for job % is retired: its period was decided', $2, $1
            USING ERRCODE = 'SF001',
                  HINT = 'this run is over (or a copy of it was started again); it must stop without committing';
    END IF;
    RAISE EXCEPTION 'stale fencing token % for job %: current is %', $2, $1, stored
        USING ERRCODE = 'SF001',
              HINT = 'a newer run of this job holds the fence; this run must stop without committing';
END
$fn$;
REVOKE ALL ON FUNCTION "public".singleton_fence(text, bigint) FROM PUBLIC;

INSERT INTO "public".singleton_schema_version (version) VALUES (3);

ALTER TABLE "public".singleton_claims ADD COLUMN cluster text NOT NULL DEFAULT '';
ALTER TABLE "public".singleton_claims ADD COLUMN confirmed_at timestamptz;
COMMENT ON COLUMN "public".singleton_claims.cluster IS 'singleton-controller: the identity (--cluster-id) of the cluster that claimed the period; empty: none, never taken over';
COMMENT ON COLUMN "public".singleton_claims.confirmed_at IS 'singleton-controller: the database time its claimer confirmed it was starting the Job; a confirmed claim is never taken over';

INSERT INTO "public".singleton_schema_version (version) VALUES (4);

ALTER TABLE "public".singleton_fences ADD COLUMN attempt text;
ALTER TABLE "public".singleton_fences ADD COLUMN attempt_token bigint NOT NULL DEFAULT 0;
ALTER TABLE "public".singleton_fences ADD COLUMN attempt_seq integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN "public".singleton_fences.attempt IS 'singleton-controller: the newest registered attempt (pod uid) of the run with token attempt_token; only it may fence';

CREATE TABLE "public".singleton_attempts (
    job           text        NOT NULL,
    token         bigint      NOT NULL,
    seq           integer     NOT NULL CHECK (seq > 0),
    attempt       text        NOT NULL,
    registered_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT singleton_attempts_pkey PRIMARY KEY (job, token, seq),
    CONSTRAINT singleton_attempts_attempt_key UNIQUE (job, token, attempt)
);
COMMENT ON TABLE "public".singleton_attempts IS 'singleton-controller: every attempt (pod) of a run that registered with singleton_attempt(), in order';

CREATE FUNCTION "public".singleton_fence_check(job text, token bigint,
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
        RAISE EXCEPTION 'singleton_fence: job must not be null and token must be a non-negative number'
            USING ERRCODE = '22023';
    END IF;
    SELECT f.owner INTO owned_by FROM "public".singleton_fences AS f WHERE f.job = $1;
    IF NOT FOUND THEN
        PERFORM nextval('"public".singleton_fence_rejections');
        RAISE EXCEPTION 'fencing token % for job % was never issued', $2, $1
            USING ERRCODE = 'SF003',
                  HINT = 'no run of this job was claimed in this database and table prefix';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r WHERE r.rolname = owned_by)
       OR NOT pg_catalog.pg_has_role(session_user, owned_by, 'MEMBER') THEN
        RAISE EXCEPTION 'role % may not fence job %', session_user, $1
            USING ERRCODE = 'SF002',
                  HINT = format('the job belongs to role %s: grant that role to the workload''s role', owned_by);
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(pg_catalog.hashtextextended('singleton_' || $1, 0));
    SELECT f.token, f.retired, f.attempt, f.attempt_token, f.attempt_seq
        INTO stored, retired_at, newest, newest_token, newest_seq
        FROM "public".singleton_fences AS f WHERE f.job = $1 FOR UPDATE;
    IF $2 > stored THEN
        PERFORM nextval('"public".singleton_fence_rejections');
        RAISE EXCEPTION 'fencing token % for job % was never issued: the newest is %', $2, $1, stored
            USING ERRCODE = 'SF003',
                  HINT = 'use SINGLETON_FENCING_TOKEN as the controller set it';
    END IF;
    IF $2 < stored OR $2 <= retired_at THEN
        PERFORM nextval('"public".singleton_fence_rejections');
        IF $2 <= retired_at AND $2 >= stored THEN
            RAISE EXCEPTION 'fencing token % for job % is retired: its period was decided', $2, $1
                USING ERRCODE = 'SF001',
                      HINT = 'this run is over (or a copy of it was started again); it must stop without committing';
        END IF;
        RAISE EXCEPTION 'stale fencing token % for job %: current is %', $2, $1, stored
            USING ERRCODE = 'SF001',
                  HINT = 'a newer run of this job holds the fence; this run must stop without committing';
    END IF;
    IF newest_token <> stored THEN
        newest := NULL;
        newest_seq := 0;
    END IF;
END
$fn$;
REVOKE ALL ON FUNCTION "public".singleton_fence_check(text, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION "public".singleton_fence(job text, token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM "public".singleton_fence_check($1, $2);
    IF r.newest IS NOT NULL THEN
        PERFORM nextval('"public".singleton_fence_rejections');
        RAISE EXCEPTION 'the run of job % with fencing token % has registered attempts: fence with singleton_fence(job, token, attempt)', $1, $2
            USING ERRCODE = 'SF004',
                  HINT = 'pass SINGLETON_ATTEMPT: without it this call cannot tell the run''s newest attempt from an older one';
    END IF;
    RETURN r.stored;
END
$fn$;
REVOKE ALL ON FUNCTION "public".singleton_fence(text, bigint) FROM PUBLIC;

CREATE FUNCTION "public".singleton_fence(job text, token bigint, attempt text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    IF $3 IS NULL OR $3 = '' THEN
        RAISE EXCEPTION 'singleton_fence: attempt must not be empty (pass SINGLETON_ATTEMPT)'
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO r FROM "public".singleton_fence_check($1, $2);
    IF r.newest IS DISTINCT FROM $3 THEN
        PERFORM nextval('"public".singleton_fence_rejections');
        IF EXISTS (SELECT 1 FROM "public".singleton_attempts AS a WHERE a.job = $1 AND a.token = $2 AND a.attempt = $3) THEN
            RAISE EXCEPTION 'attempt % of job % (fencing token %) was superseded by attempt #% (%)', $3, $1, $2, r.newest_seq, r.newest
                USING ERRCODE = 'SF004',
                      HINT = 'a newer pod of this run registered: this one must stop without committing';
        END IF;
        RAISE EXCEPTION 'attempt % of job % (fencing token %) is not registered', $3, $1, $2
            USING ERRCODE = 'SF004',
                  HINT = 'call singleton_attempt(job, token, attempt) once when the attempt starts, before its work';
    END IF;
    RETURN r.stored;
END
$fn$;
REVOKE ALL ON FUNCTION "public".singleton_fence(text, bigint, text) FROM PUBLIC;
COMMENT ON FUNCTION "public".singleton_fence(text, bigint, text) IS 'singleton-controller: call first inside your transaction with SINGLETON_JOB, SINGLETON_FENCING_TOKEN and SINGLETON_ATTEMPT; raises SQLSTATE SF001 when a newer run holds the fence, SF004 when a newer attempt of this run registered';

CREATE FUNCTION "public".singleton_attempt(job text, token bigint, attempt text) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
    next_seq integer;
BEGIN
    IF $3 IS NULL OR $3 = '' OR length($3) > 253 THEN
        RAISE EXCEPTION 'singleton_attempt: attempt must be 1 to 253 characters (pass SINGLETON_ATTEMPT)'
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO r FROM "public".singleton_fence_check($1, $2);
    IF r.newest = $3 THEN
        RETURN r.newest_seq;
    END IF;
    IF EXISTS (SELECT 1 FROM "public".singleton_attempts AS a WHERE a.job = $1 AND a.token = $2 AND a.attempt = $3) THEN
        PERFORM nextval('"public".singleton_fence_rejections');
        RAISE EXCEPTION 'attempt % of job % (fencing token %) was superseded by attempt #% (%)', $3, $1, $2, r.newest_seq, r.newest
            USING ERRCODE = 'SF004',
                  HINT = 'a newer pod of this run registered: this one must stop without committing';
    END IF;
    next_seq := r.newest_seq + 1;
    INSERT INTO "public".singleton_attempts (job, token, seq, attempt) VALUES ($1, $2, next_seq, $3);
    UPDATE "public".singleton_fences AS f SET attempt = $3, attempt_token = $2, attempt_seq = next_seq WHERE f.job = $1;
    RETURN next_seq;
END
$fn$;
REVOKE ALL ON FUNCTION "public".singleton_attempt(text, bigint, text) FROM PUBLIC;
COMMENT ON FUNCTION "public".singleton_attempt(text, bigint, text) IS 'singleton-controller: call once when an attempt (pod) of a run starts, with SINGLETON_JOB, SINGLETON_FENCING_TOKEN and SINGLETON_ATTEMPT; from then on only this attempt''s fenced transactions commit';

INSERT INTO "public".singleton_schema_version (version) VALUES (5);

ALTER TABLE "public".singleton_fences ADD COLUMN namespace text;
COMMENT ON COLUMN "public".singleton_fences.namespace IS 'singleton-controller: the Kubernetes namespace that owns the job key (its first claim''s); claims from any other namespace are refused. ''*'': shared with every namespace (set by an administrator); NULL: recorded by the next claim';

INSERT INTO "public".singleton_schema_version (version) VALUES (6);

ALTER TABLE "public".singleton_schema_version ADD COLUMN needs integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN "public".singleton_schema_version.needs IS 'singleton-controller: the oldest schema version a controller must know to claim once this migration is applied; an older controller refuses to claim';

INSERT INTO "public".singleton_schema_version (version, needs) VALUES (7, 0);

ALTER TABLE "public".singleton_claims ADD COLUMN outcome text;
COMMENT ON COLUMN "public".singleton_claims.outcome IS 'singleton-controller: how the run with this row''s token ended (Succeeded, Failed, Replaced, ...); NULL: running, not recorded yet, or recorded by a controller before schema 8';

INSERT INTO "public".singleton_schema_version (version, needs) VALUES (8, 0);

CREATE TABLE "public".singleton_withdrawn_claims (
    job          text        NOT NULL,
    period       timestamptz NOT NULL,
    token        bigint      NOT NULL CHECK (token > 0),
    job_name     text        NOT NULL,
    cluster      text        NOT NULL DEFAULT '',
    claimed_at   timestamptz NOT NULL,
    withdrawn_at timestamptz NOT NULL DEFAULT now(),
    reason       text        NOT NULL,
    CONSTRAINT singleton_withdrawn_claims_pkey PRIMARY KEY (job, token)
);
COMMENT ON TABLE "public".singleton_withdrawn_claims IS 'singleton-controller: the claims withdrawn before their run started (their token retired), moved out of singleton_claims so the period can be claimed again; one row per (job, token)';
COMMENT ON COLUMN "public".singleton_withdrawn_claims.reason IS 'singleton-controller: why the claim was withdrawn (BackstopOutage, Suspended, ScheduleChanged, ...)';

INSERT INTO "public".singleton_schema_version (version, needs) VALUES (9, 0);
