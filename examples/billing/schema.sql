-- The billing example's own tables (the workload's data). The controller creates its tables
-- (singleton_claims, singleton_fences, ...) and the function singleton_fence() itself.
--   psql "$DATABASE_URL" -v ON_ERROR_STOP=1 -f examples/billing/schema.sql

CREATE TABLE IF NOT EXISTS customers (
    customer       text   PRIMARY KEY,
    monthly_cents  bigint NOT NULL CHECK (monthly_cents >= 0)
);

-- One invoice per customer and period: the natural key makes a repeated insert a no-op, and the
-- token and idempotency key say which run wrote it.
CREATE TABLE IF NOT EXISTS invoices (
    period          timestamptz NOT NULL,
    customer        text        NOT NULL REFERENCES customers,
    amount_cents    bigint      NOT NULL,
    fencing_token   bigint      NOT NULL,
    idempotency_key text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (period, customer)
);

-- One row per period: the run's summary, written with the conditional-update pattern
-- (UPDATE ... WHERE token <= mine), which also works where singleton_fence() is not available.
CREATE TABLE IF NOT EXISTS invoice_runs (
    period      timestamptz PRIMARY KEY,
    token       bigint      NOT NULL,
    invoices    integer     NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
);
-- The attempt (pod uid, SINGLETON_ATTEMPT) that wrote the summary; added after the first release.
ALTER TABLE invoice_runs ADD COLUMN IF NOT EXISTS attempt text;

-- The run's ledger entry: one row per fenced transaction that committed, with the attempt (pod)
-- that made it. Not idempotent on purpose, as a debit of a balance is not: two pods of one run
-- both committing would leave two rows for the period. The chaos suite counts them from here,
-- independently of the controller.
CREATE TABLE IF NOT EXISTS run_attempts (
    period       timestamptz NOT NULL,
    token        bigint      NOT NULL,
    attempt      text,
    seq          integer,
    committed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

INSERT INTO customers (customer, monthly_cents) VALUES
    ('acme', 129900),
    ('globex', 49900),
    ('initech', 9900)
ON CONFLICT (customer) DO NOTHING;

-- Here the workload connects as the controller's role (invoicer), which owns the job's fence.
-- With a separate role for the workload, it needs EXECUTE on the function (SECURITY DEFINER: no
-- write access to the fence table) and membership in the controller's role, which owns the job
-- (schema 3; another role is refused with SQLSTATE SF002):
--   GRANT EXECUTE ON FUNCTION singleton_attempt(text, bigint, text),
--                             singleton_fence(text, bigint, text) TO invoice_app;
--   GRANT invoicer TO invoice_app WITH INHERIT FALSE, SET FALSE;   -- PostgreSQL 16+
--   GRANT invoicer TO invoice_app;                                 -- PostgreSQL 15 and older
