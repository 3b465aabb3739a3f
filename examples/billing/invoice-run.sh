#!/bin/sh
# The monthly invoice run: one transaction that first proves its fencing token is current, then
# writes this period's invoices. A run whose token is stale (a newer run was started, say after
# this pod paused past its lease) fails in singleton_fence() and commits nothing.
#
# Reads DATABASE_URL and the variables the controller sets on every container of a run:
# SINGLETON_JOB, SINGLETON_PERIOD, SINGLETON_FENCING_TOKEN, SINGLETON_IDEMPOTENCY_KEY and
# SINGLETON_ATTEMPT (the pod's uid: the attempt this process is).
# Needs only psql (image postgres:16-alpine). Runs the same outside Kubernetes:
#   DATABASE_URL=postgres://... SINGLETON_JOB=billing/invoices SINGLETON_PERIOD=2025-03-01T02:00:00Z \
#   SINGLETON_FENCING_TOKEN=3 SINGLETON_IDEMPOTENCY_KEY=demo SINGLETON_ATTEMPT=pod-1 ./invoice-run.sh
# BILLING_TABLE_PREFIX: the SingletonJob's spec.backstop.postgres.tablePrefix (default singleton_).
set -eu

: "${DATABASE_URL:?}" "${SINGLETON_JOB:?}" "${SINGLETON_PERIOD:?}"
: "${SINGLETON_FENCING_TOKEN:?}" "${SINGLETON_IDEMPOTENCY_KEY:?}" "${SINGLETON_ATTEMPT:?}"
case $SINGLETON_FENCING_TOKEN in
  '' | *[!0-9]*) echo "SINGLETON_FENCING_TOKEN is not a number" >&2; exit 2 ;;
esac

prefix=${BILLING_TABLE_PREFIX:-singleton_}
case $prefix in
  '' | [!a-z_]* | *[!a-z0-9_]*) echo "BILLING_TABLE_PREFIX is not a lower-case SQL identifier" >&2; exit 2 ;;
esac

echo "invoice run for $SINGLETON_JOB, period $SINGLETON_PERIOD, fencing token $SINGLETON_FENCING_TOKEN"

# This pod registers as the run's newest attempt, before any work: from now on no older pod of
# this run (one on a node that stopped answering) commits a fenced write. Refused (SF001, SF004):
# this pod is itself stale; stop.
psql "$DATABASE_URL" -X -q -At -v ON_ERROR_STOP=1 -v register="${prefix}attempt" \
  -v job="$SINGLETON_JOB" -v token="$SINGLETON_FENCING_TOKEN" -v attempt="$SINGLETON_ATTEMPT" <<'SQL'
SELECT format('registered as attempt #%s', :"register"(:'job', :'token', :'attempt'));
SQL

# psql's :'var' quotes a value as an SQL literal, so no value is spliced into SQL unquoted.
psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 -v fence="${prefix}fence" \
  -v job="$SINGLETON_JOB" -v period="$SINGLETON_PERIOD" -v attempt="$SINGLETON_ATTEMPT" \
  -v token="$SINGLETON_FENCING_TOKEN" -v key="$SINGLETON_IDEMPOTENCY_KEY" <<'SQL'
BEGIN;
-- 1. The fence, first: raises SQLSTATE SF001 if a newer run holds it, SF004 if a newer attempt
--    of this run registered, and otherwise holds the fence row's lock until COMMIT, so no newer
--    run or attempt can be fenced in half-way through.
SELECT :"fence"(:'job', :'token', :'attempt') AS fenced \gset

-- 2. The writes. The natural key makes a retry of this same run a no-op.
INSERT INTO invoices (period, customer, amount_cents, fencing_token, idempotency_key)
SELECT :'period', customer, monthly_cents, :'token', :'key' || '/' || customer
FROM customers
ON CONFLICT (period, customer) DO NOTHING;

-- 3. The conditional-update pattern: a row-level fence for stores without singleton_fence().
INSERT INTO invoice_runs AS r (period, token, invoices, attempt)
SELECT :'period', :'token', count(*), :'attempt' FROM invoices WHERE period = :'period'
ON CONFLICT (period) DO UPDATE
  SET token = EXCLUDED.token, invoices = EXCLUDED.invoices, finished_at = now(),
      attempt = EXCLUDED.attempt
  WHERE r.token <= EXCLUDED.token;
INSERT INTO run_attempts (period, token, attempt) VALUES (:'period', :'token', :'attempt');
COMMIT;

SELECT format('committed %s invoice(s) under fence %s', count(*), :'fenced')
FROM invoices WHERE period = :'period' \g (format=unaligned tuples_only)
SQL

# An external call (payment provider, e-mail service) gets the idempotency key, stable per job
# and period: a retried or duplicated run sends the same key and the provider does the work once.
for customer in $(psql "$DATABASE_URL" -X -At -c 'SELECT customer FROM customers ORDER BY 1'); do
  echo "would POST https://payments.example/charges with Idempotency-Key: $SINGLETON_IDEMPOTENCY_KEY/$customer"
done
