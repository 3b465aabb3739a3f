#!/bin/sh
# The monthly invoice run: one transaction that first proves its fencing token is current, then
# writes this period's invoices. A run whose token is stale (a newer run was started, say after
# this pod paused past its lease) fails in singleton_fence() and commits nothing.
#
# Reads DATABASE_URL and the variables the controller sets on every container of a run:
# SINGLETON_JOB, SINGLETON_PERIOD, SINGLETON_FENCING_TOKEN, SINGLETON_IDEMPOTENCY_KEY.
# Needs only psql (image postgres:16-alpine). Runs the same outside Kubernetes:
#   DATABASE_URL=postgres://... SINGLETON_JOB=billing/invoices SINGLETON_PERIOD=2025-03-01T02:00:00Z \
#   SINGLETON_FENCING_TOKEN=3 SINGLETON_IDEMPOTENCY_KEY=demo ./invoice-run.sh
set -eu

: "${DATABASE_URL:?}" "${SINGLETON_JOB:?}" "${SINGLETON_PERIOD:?}"
: "${SINGLETON_FENCING_TOKEN:?}" "${SINGLETON_IDEMPOTENCY_KEY:?}"
case $SINGLETON_FENCING_TOKEN in
  '' | *[!0-9]*) echo "SINGLETON_FENCING_TOKEN is not a number" >&2; exit 2 ;;
esac

echo "invoice run for $SINGLETON_JOB, period $SINGLETON_PERIOD, fencing token $SINGLETON_FENCING_TOKEN"

# psql's :'var' quotes a value as an SQL literal, so no value is spliced into SQL unquoted.
psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 \
  -v job="$SINGLETON_JOB" -v period="$SINGLETON_PERIOD" \
  -v token="$SINGLETON_FENCING_TOKEN" -v key="$SINGLETON_IDEMPOTENCY_KEY" <<'SQL'
BEGIN;
-- 1. The fence, first: raises SQLSTATE SF001 if a newer run holds it, and otherwise holds the
--    fence row's lock until COMMIT, so no newer run can be fenced in half-way through.
SELECT singleton_fence(:'job', :'token') AS fence \gset

-- 2. The writes. The natural key makes a retry of this same run a no-op.
INSERT INTO invoices (period, customer, amount_cents, fencing_token, idempotency_key)
SELECT :'period', customer, monthly_cents, :'token', :'key' || '/' || customer
FROM customers
ON CONFLICT (period, customer) DO NOTHING;

-- 3. The conditional-update pattern: a row-level fence for stores without singleton_fence().
INSERT INTO invoice_runs AS r (period, token, invoices)
SELECT :'period', :'token', count(*) FROM invoices WHERE period = :'period'
ON CONFLICT (period) DO UPDATE
  SET token = EXCLUDED.token, invoices = EXCLUDED.invoices, finished_at = now()
  WHERE r.token <= EXCLUDED.token;
COMMIT;

SELECT format('committed %s invoice(s) under fence %s', count(*), :'fence')
FROM invoices WHERE period = :'period' \g (format=unaligned tuples_only)
SQL

# An external call (payment provider, e-mail service) gets the idempotency key, stable per job
# and period: a retried or duplicated run sends the same key and the provider does the work once.
for customer in $(psql "$DATABASE_URL" -X -At -c 'SELECT customer FROM customers ORDER BY 1'); do
  echo "would POST https://payments.example/charges with Idempotency-Key: $SINGLETON_IDEMPOTENCY_KEY/$customer"
done
