// The run as the controller describes it in the Job's environment, and its three calls.

import { ConfigError } from './errors.js';
import { type Connection, driverFor, notOwned, ownTransaction } from './driver.js';

const MAX_TOKEN = 2n ** 63n - 1n;
const PREFIX = /^[a-z][a-z0-9_]{0,31}$/;
// RFC 3339 in UTC or with an offset; Date.parse alone also accepts many other shapes.
const RFC3339 = /^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;

/** The fields of a {@link Run}; the constructor validates them as {@link Run.fromEnv} does. */
export interface RunInit {
  /** SINGLETON_JOB: the fence's key, e.g. `billing/invoices`. */
  job: string;
  /** SINGLETON_FENCING_TOKEN: 1 .. 2^63-1. */
  token: bigint | number | string;
  /** SINGLETON_ATTEMPT: this pod's uid. */
  attempt: string;
  period?: Date | undefined;
  idempotencyKey?: string | undefined;
  previousPeriod?: Date | null;
  nextPeriod?: Date | null;
  timeZone?: string;
  businessDate?: string | undefined;
  periodKey?: string | undefined;
  /** The backstop's table prefix (`spec.backstop.*.tablePrefix`); default `singleton_`. */
  tablePrefix?: string;
}

/** Where {@link Run.fromEnv} reads from (default `process.env`) and the table prefix. */
export interface FromEnvOptions {
  env?: Record<string, string | undefined>;
  tablePrefix?: string;
}

/** One run (a Job's pod) of a SingletonJob: what it was handed, and the fencing calls. */
export class Run {
  readonly job: string;
  readonly token: bigint;
  readonly attempt: string;
  /** SINGLETON_PERIOD, the scheduled instant; undefined when unset. */
  readonly period: Date | undefined;
  /** SINGLETON_IDEMPOTENCY_KEY: 64 hex characters, stable per job and period. */
  readonly idempotencyKey: string | undefined;
  /** SINGLETON_PREVIOUS_PERIOD; null for the first run. */
  readonly previousPeriod: Date | null;
  /** SINGLETON_NEXT_PERIOD; null after the last run. */
  readonly nextPeriod: Date | null;
  /** SINGLETON_TIME_ZONE, an IANA name; `UTC` when unset. */
  readonly timeZone: string;
  /** SINGLETON_BUSINESS_DATE, `YYYY-MM-DD` in the time zone. */
  readonly businessDate: string | undefined;
  /** SINGLETON_PERIOD_KEY, RFC 9557, e.g. `2027-03-28T03:00:00+02:00[Europe/Berlin]`. */
  readonly periodKey: string | undefined;
  readonly tablePrefix: string;

  constructor(init: RunInit) {
    this.job = requireText(init.job, 'SINGLETON_JOB');
    this.token = parseToken(init.token);
    this.attempt = requireText(init.attempt, 'SINGLETON_ATTEMPT');
    if (this.attempt.length > 253) {
      throw new ConfigError('SINGLETON_ATTEMPT must be at most 253 characters', 'SINGLETON_ATTEMPT');
    }
    this.period = init.period;
    if (init.idempotencyKey !== undefined && !/^[0-9a-f]{64}$/i.test(init.idempotencyKey)) {
      throw new ConfigError('SINGLETON_IDEMPOTENCY_KEY must be 64 hex characters', 'SINGLETON_IDEMPOTENCY_KEY');
    }
    this.idempotencyKey = init.idempotencyKey;
    this.previousPeriod = init.previousPeriod ?? null;
    this.nextPeriod = init.nextPeriod ?? null;
    this.timeZone = init.timeZone ?? 'UTC';
    if (init.businessDate !== undefined && !isDate(init.businessDate)) {
      throw new ConfigError(`SINGLETON_BUSINESS_DATE must be YYYY-MM-DD, got ${JSON.stringify(init.businessDate)}`, 'SINGLETON_BUSINESS_DATE');
    }
    this.businessDate = init.businessDate;
    this.periodKey = init.periodKey;
    this.tablePrefix = init.tablePrefix ?? 'singleton_';
    // The prefix is spliced into SQL as a function name: refuse anything but a plain identifier.
    if (!PREFIX.test(this.tablePrefix)) {
      throw new ConfigError(`table prefix ${JSON.stringify(this.tablePrefix)} must match ${PREFIX.source}`);
    }
  }

  /** The run the controller started this process for, from the SINGLETON_* variables. */
  static fromEnv(options: FromEnvOptions = {}): Run {
    const env = options.env ?? process.env;
    const get = (name: string): string | undefined => {
      const v = env[name];
      return v === undefined || v === '' ? undefined : v;
    };
    const required = (name: string): string => {
      const v = get(name);
      if (v === undefined) throw new ConfigError(`${name} is not set: is this process a run of a SingletonJob?`, name);
      return v;
    };
    return new Run({
      job: required('SINGLETON_JOB'),
      token: required('SINGLETON_FENCING_TOKEN'),
      attempt: required('SINGLETON_ATTEMPT'),
      period: parseInstant(get('SINGLETON_PERIOD'), 'SINGLETON_PERIOD') ?? undefined,
      idempotencyKey: get('SINGLETON_IDEMPOTENCY_KEY'),
      previousPeriod: parseInstant(get('SINGLETON_PREVIOUS_PERIOD'), 'SINGLETON_PREVIOUS_PERIOD'),
      nextPeriod: parseInstant(get('SINGLETON_NEXT_PERIOD'), 'SINGLETON_NEXT_PERIOD'),
      timeZone: get('SINGLETON_TIME_ZONE') ?? 'UTC',
      businessDate: get('SINGLETON_BUSINESS_DATE'),
      periodKey: get('SINGLETON_PERIOD_KEY'),
      ...(options.tablePrefix === undefined ? {} : { tablePrefix: options.tablePrefix }),
    });
  }

  /** The idempotency key for one side effect of this run: `<key>/<suffix>`. */
  key(suffix: string): string {
    if (this.idempotencyKey === undefined) {
      throw new ConfigError('SINGLETON_IDEMPOTENCY_KEY is not set', 'SINGLETON_IDEMPOTENCY_KEY');
    }
    return `${this.idempotencyKey}/${suffix}`;
  }

  /**
   * Registers this pod as the run's newest attempt; returns its number (1, 2, ...). Call once
   * when the process starts, before any work, on a connection with no transaction open: it
   * commits on its own.
   * @throws MisuseError when a transaction is open on the connection.
   * @throws FenceRefused (StaleToken, NotPermitted, NeverIssued, AttemptSuperseded).
   */
  async register(conn: Connection): Promise<number> {
    const d = driverFor(conn);
    notOwned(conn, 'register()');
    await d.requireNoTransaction('register()');
    return d.register(this.tablePrefix, this.job, this.token, this.attempt);
  }

  /**
   * Fences the caller's open transaction; returns the token. Call it first in every transaction
   * that writes. On a refusal stop: roll back and do not go on (on MariaDB/MySQL the transaction
   * stays open after the error, so nothing stops a caller that ignores it but this rule).
   * @throws MisuseError, before the fence is called, when no transaction is open.
   * @throws FenceRefused (StaleToken, NotPermitted, NeverIssued, AttemptSuperseded).
   */
  async fence(tx: Connection): Promise<bigint> {
    const d = driverFor(tx);
    await d.requireTransaction();
    return d.fence(this.tablePrefix, this.job, this.token, this.attempt);
  }

  /**
   * Opens a transaction, fences it, runs `fn`, commits; rolls back on any error (a refusal
   * included) and throws it again. Returns what `fn` returns.
   * @throws MisuseError when a transaction is already open on the connection.
   */
  async transaction<C extends Connection, T>(conn: C, fn: (tx: C, token: bigint) => Promise<T>): Promise<T> {
    const d = driverFor(conn);
    return ownTransaction(d, conn, async () => {
      const token = await d.fence(this.tablePrefix, this.job, this.token, this.attempt);
      return fn(conn, token);
    });
  }
}

function requireText(v: unknown, name: string): string {
  if (typeof v !== 'string' || v === '') throw new ConfigError(`${name} must not be empty`, name);
  return v;
}

function parseToken(v: bigint | number | string): bigint {
  let t: bigint;
  if (typeof v === 'bigint') t = v;
  else if (typeof v === 'number' && Number.isSafeInteger(v)) t = BigInt(v);
  else if (typeof v === 'string' && /^[0-9]{1,19}$/.test(v)) t = BigInt(v);
  else throw new ConfigError(`SINGLETON_FENCING_TOKEN must be a decimal integer, got ${JSON.stringify(String(v))}`, 'SINGLETON_FENCING_TOKEN');
  if (t < 1n || t > MAX_TOKEN) {
    throw new ConfigError(`SINGLETON_FENCING_TOKEN must be between 1 and ${MAX_TOKEN}, got ${t}`, 'SINGLETON_FENCING_TOKEN');
  }
  return t;
}

function parseInstant(v: string | undefined, name: string): Date | null {
  if (v === undefined) return null;
  // Date.parse rolls a day past the month's end over: check the calendar date first.
  const ms = RFC3339.test(v) && isDate(v.slice(0, 10)) ? Date.parse(v) : NaN;
  if (Number.isNaN(ms)) throw new ConfigError(`${name} must be an RFC 3339 timestamp, got ${JSON.stringify(v)}`, name);
  return new Date(ms);
}

function isDate(v: string): boolean {
  if (!/^\d{4}-\d{2}-\d{2}$/.test(v)) return false;
  // Round-trips only for a real calendar day (Date.parse rolls 2027-02-30 over).
  const d = new Date(`${v}T00:00:00Z`);
  return !Number.isNaN(d.getTime()) && d.toISOString().slice(0, 10) === v;
}
