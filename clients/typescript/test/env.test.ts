// The run's environment and the exit codes: no database needed.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  AttemptSuperseded,
  ConfigError,
  FenceRefused,
  MisuseError,
  NeverIssued,
  NotPermitted,
  Run,
  StaleToken,
  exitCode,
} from '@singleton-dev/fence';

const KEY = 'ab'.repeat(32);
const ENV = {
  SINGLETON_JOB: 'billing/invoices',
  SINGLETON_FENCING_TOKEN: '42',
  SINGLETON_ATTEMPT: '6f1c0e2a-0000-4000-8000-000000000001',
  SINGLETON_PERIOD: '2026-12-06T12:00:00Z',
  SINGLETON_IDEMPOTENCY_KEY: KEY,
  SINGLETON_PREVIOUS_PERIOD: '2026-12-05T12:00:00Z',
  SINGLETON_NEXT_PERIOD: '2026-12-07T12:00:00Z',
  SINGLETON_TIME_ZONE: 'Europe/Berlin',
  SINGLETON_BUSINESS_DATE: '2026-12-06',
  SINGLETON_PERIOD_KEY: '2026-12-06T13:00:00+01:00[Europe/Berlin]',
};

function configError(variable: string | undefined, pattern: RegExp) {
  return (err: unknown) => {
    assert.ok(err instanceof ConfigError, `expected ConfigError, got ${String(err)}`);
    assert.equal(err.variable, variable);
    assert.match(err.message, pattern);
    assert.equal(exitCode(err), 2);
    return true;
  };
}

test('fromEnv reads every variable', () => {
  const run = Run.fromEnv({ env: ENV });
  assert.equal(run.job, 'billing/invoices');
  assert.equal(run.token, 42n);
  assert.equal(run.attempt, ENV.SINGLETON_ATTEMPT);
  assert.equal(run.period?.toISOString(), '2026-12-06T12:00:00.000Z');
  assert.equal(run.previousPeriod?.toISOString(), '2026-12-05T12:00:00.000Z');
  assert.equal(run.nextPeriod?.toISOString(), '2026-12-07T12:00:00.000Z');
  assert.equal(run.idempotencyKey, KEY);
  assert.equal(run.key('mail'), `${KEY}/mail`);
  assert.equal(run.timeZone, 'Europe/Berlin');
  assert.equal(run.businessDate, '2026-12-06');
  assert.equal(run.periodKey, '2026-12-06T13:00:00+01:00[Europe/Berlin]');
  assert.equal(run.tablePrefix, 'singleton_');
});

test('the first and the last run: empty window ends are null; time zone defaults to UTC', () => {
  const env: Record<string, string | undefined> = { ...ENV, SINGLETON_PREVIOUS_PERIOD: '', SINGLETON_NEXT_PERIOD: '' };
  delete env.SINGLETON_TIME_ZONE;
  const run = Run.fromEnv({ env });
  assert.equal(run.previousPeriod, null);
  assert.equal(run.nextPeriod, null);
  assert.equal(run.timeZone, 'UTC');
});

test('the largest token (2^63-1) keeps its precision', () => {
  const run = Run.fromEnv({ env: { ...ENV, SINGLETON_FENCING_TOKEN: '9223372036854775807' } });
  assert.equal(run.token, 9223372036854775807n);
});

test('missing required variables are a ConfigError naming the variable', () => {
  for (const name of ['SINGLETON_JOB', 'SINGLETON_FENCING_TOKEN', 'SINGLETON_ATTEMPT']) {
    const env: Record<string, string | undefined> = { ...ENV };
    delete env[name];
    assert.throws(() => Run.fromEnv({ env }), configError(name, new RegExp(`${name} is not set`)));
    assert.throws(() => Run.fromEnv({ env: { ...ENV, [name]: '' } }), configError(name, new RegExp(name)));
  }
});

test('invalid values are a ConfigError naming the variable', () => {
  const bad: [string, string][] = [
    ['SINGLETON_FENCING_TOKEN', '0'],
    ['SINGLETON_FENCING_TOKEN', '-1'],
    ['SINGLETON_FENCING_TOKEN', '4x'],
    ['SINGLETON_FENCING_TOKEN', '9223372036854775808'],
    ['SINGLETON_ATTEMPT', 'a'.repeat(254)],
    ['SINGLETON_PERIOD', 'yesterday'],
    ['SINGLETON_PERIOD', '2027-02-30T00:00:00Z'],
    ['SINGLETON_PREVIOUS_PERIOD', '2026-12-05'],
    ['SINGLETON_NEXT_PERIOD', '2026-12-07T12:00:00'],
    ['SINGLETON_IDEMPOTENCY_KEY', 'xyz'],
    ['SINGLETON_BUSINESS_DATE', '06.12.2026'],
  ];
  for (const [name, value] of bad) {
    assert.throws(() => Run.fromEnv({ env: { ...ENV, [name]: value } }), configError(name, new RegExp(name)), `${name}=${value}`);
  }
});

test('key() without an idempotency key is a ConfigError', () => {
  const run = new Run({ job: 'j', token: 1n, attempt: 'a' });
  assert.throws(() => run.key('x'), configError('SINGLETON_IDEMPOTENCY_KEY', /not set/));
});

test('the table prefix must be a plain identifier of at most 32 characters', () => {
  for (const prefix of ['Singleton_', '1x', 'a-b', 'x;drop table y', 'a'.repeat(33), '']) {
    assert.throws(() => Run.fromEnv({ env: ENV, tablePrefix: prefix }), configError(undefined, /table prefix/), prefix);
  }
  assert.equal(Run.fromEnv({ env: ENV, tablePrefix: 'a'.repeat(32) }).tablePrefix, 'a'.repeat(32));
  assert.equal(new Run({ job: 'j', token: '7', attempt: 'a', tablePrefix: 'fence_' }).tablePrefix, 'fence_');
});

test('exit codes: 0 success, 2 config or misuse or bad arguments, 3 refused, 1 anything else', () => {
  assert.equal(exitCode(), 0);
  assert.equal(exitCode(null), 0);
  assert.equal(exitCode(new Error('connection reset')), 1);
  assert.equal(exitCode('a string'), 1);
  assert.equal(exitCode(new ConfigError('x')), 2);
  assert.equal(exitCode(new MisuseError('x')), 2);
  for (const Kind of [FenceRefused, StaleToken, NotPermitted, NeverIssued, AttemptSuperseded]) {
    assert.equal(exitCode(new Kind('SF001', 'x')), 3, Kind.name);
  }
  // Raw driver errors: node-postgres (code), mysql2 (sqlState, errno).
  assert.equal(exitCode(Object.assign(new Error('x'), { code: 'SF001' })), 3);
  assert.equal(exitCode(Object.assign(new Error('x'), { code: 'ER_SIGNAL_EXCEPTION', sqlState: 'SF004', errno: 31004 })), 3);
  assert.equal(exitCode(Object.assign(new Error('x'), { sqlState: 'HY000', errno: 31002 })), 3);
  assert.equal(exitCode(Object.assign(new Error('x'), { code: '22023' })), 2);
  assert.equal(exitCode(Object.assign(new Error('x'), { code: '40001' })), 1);
  assert.equal(exitCode(Object.assign(new Error('x'), { code: 'ECONNRESET', errno: -104 })), 1);
});
