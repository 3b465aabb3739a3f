// The two drivers, told apart by the object's shape: the library imports neither (both are
// optional peer dependencies), so the types below are structural.

import { MisuseError, asRefusal } from './errors.js';

/** A node-postgres `Client` or `PoolClient` (pg >= 8.21 gives getTransactionStatus()). */
export interface PgClientLike {
  query(text: string, values?: unknown[]): Promise<{ rows: unknown[]; command: string }>;
  getTransactionStatus?(): string | null;
}

/** A mysql2/promise `Connection` or `PoolConnection`. */
export interface MysqlConnectionLike {
  query(sql: string, values?: unknown): Promise<[unknown, unknown]>;
  beginTransaction(): Promise<void>;
  commit(): Promise<void>;
  rollback(): Promise<void>;
}

/** What the library accepts: one connection of either driver (not a pool). */
export type Connection = PgClientLike | MysqlConnectionLike;

export interface Driver {
  readonly engine: 'postgres' | 'mysql';
  requireNoTransaction(what: string): Promise<void>;
  requireTransaction(): Promise<void>;
  register(prefix: string, job: string, token: bigint, attempt: string): Promise<number>;
  fence(prefix: string, job: string, token: bigint, attempt: string): Promise<bigint>;
  begin(): Promise<void>;
  commit(): Promise<void>;
  rollback(): Promise<void>;
}

// Connections inside a transaction() of ours, marked before its first await: a second
// transaction() or a register() on the same connection meanwhile is refused even before the
// database has seen our BEGIN.
const owned = new WeakSet<object>();

export function driverFor(conn: unknown): Driver {
  if (typeof conn !== 'object' || conn === null) {
    throw new MisuseError('expected a node-postgres Client/PoolClient or a mysql2/promise Connection');
  }
  const c = conn as Record<string, unknown>;
  const pgShaped = typeof c.escapeIdentifier === 'function' || typeof c.getTransactionStatus === 'function';
  if (typeof c.query === 'function' && pgShaped && typeof c.beginTransaction !== 'function') {
    return new PgDriver(conn as PgClientLike);
  }
  if (typeof c.query === 'function' && typeof c.beginTransaction === 'function' && typeof c.execute === 'function') {
    if (typeof c.promise === 'function') {
      // mysql2's callback API (no promises from query()).
      throw new MisuseError('pass a connection of mysql2/promise, or conn.promise()');
    }
    return new MysqlDriver(conn as MysqlConnectionLike);
  }
  if (typeof c.connect === 'function' || typeof c.getConnection === 'function') {
    // A pool would run each statement on whichever connection is free: no transaction spans them.
    throw new MisuseError('pass one connection, not a pool: pool.connect() (pg) or pool.getConnection() (mysql2)');
  }
  throw new MisuseError('expected a node-postgres Client/PoolClient or a mysql2/promise Connection');
}

/** Refuses a connection inside one of our transaction() calls. */
export function notOwned(conn: object, what: string): void {
  if (owned.has(conn)) throw new MisuseError(`${what}: a transaction is open on this connection (inside transaction())`);
}

/** Runs `fn` in a transaction the library opens and closes (see Run.transaction). */
export async function ownTransaction<T>(d: Driver, conn: object, fn: () => Promise<T>): Promise<T> {
  notOwned(conn, 'transaction()');
  owned.add(conn);
  try {
    await d.requireNoTransaction('transaction()');
    await d.begin();
    let result: T;
    try {
      result = await fn();
      await d.commit();
    } catch (err) {
      // A refusal on MariaDB/MySQL leaves the transaction open: end it here, whatever failed.
      await d.rollback().catch(() => undefined);
      throw asRefusal(err);
    }
    return result;
  } finally {
    owned.delete(conn);
  }
}

/** The transaction state of a node-postgres client. */
export type PgTxState = 'idle' | 'open' | 'failed';

class PgDriver implements Driver {
  readonly engine = 'postgres' as const;
  constructor(private readonly c: PgClientLike) {}

  /**
   * node-postgres >= 8.21 keeps the status byte of the server's last ReadyForQuery message
   * (I idle, T in a transaction, E failed transaction): exact, and costs no round trip. It is
   * current only while nothing is in flight (a BEGIN sent but not awaited would not show yet),
   * so then, and for older pg or pg-native (null), ask the server instead.
   */
  async state(): Promise<PgTxState> {
    const status = typeof this.c.getTransactionStatus === 'function' ? this.c.getTransactionStatus() : null;
    const idle = (this.c as unknown as { readyForQuery?: unknown }).readyForQuery === true;
    if (idle && status === 'I') return 'idle';
    if (idle && status === 'T') return 'open';
    if (idle && status === 'E') return 'failed';
    return pgStateBySql(this.c);
  }

  async requireNoTransaction(what: string): Promise<void> {
    const s = await this.state();
    if (s !== 'idle') {
      throw new MisuseError(`${what}: a transaction is open on this connection; call it on a connection without one`);
    }
  }

  async requireTransaction(): Promise<void> {
    const s = await this.state();
    if (s === 'idle') throw new MisuseError('fence(): no transaction is open: BEGIN first, or use transaction()');
    if (s === 'failed') throw new MisuseError('fence(): the transaction is aborted by an earlier error: roll it back');
  }

  async register(prefix: string, job: string, token: bigint, attempt: string): Promise<number> {
    // One statement outside a transaction block commits on its own.
    const r = await call(this.c.query(`SELECT ${prefix}attempt($1::text, $2::bigint, $3::text) AS n`, [job, token.toString(), attempt]));
    return Number((r.rows[0] as { n: unknown }).n);
  }

  async fence(prefix: string, job: string, token: bigint, attempt: string): Promise<bigint> {
    const r = await call(this.c.query(`SELECT ${prefix}fence($1::text, $2::bigint, $3::text)::text AS t`, [job, token.toString(), attempt]));
    return BigInt((r.rows[0] as { t: string }).t);
  }

  async begin(): Promise<void> {
    await this.c.query('BEGIN');
  }

  async commit(): Promise<void> {
    const r = await this.c.query('COMMIT');
    // COMMIT of an aborted transaction succeeds as a ROLLBACK: fn caught an error and went on.
    if (r.command === 'ROLLBACK') {
      throw new Error('the transaction was aborted by an error that the callback caught; it was rolled back, nothing committed');
    }
  }

  async rollback(): Promise<void> {
    await this.c.query('ROLLBACK');
  }
}

/**
 * The fallback: now() is the transaction's start and statement_timestamp() this statement's, so
 * they are equal only when this statement is its own transaction. In a transaction block the
 * BEGIN came in an earlier message, so its timestamp is earlier. In a failed one the query itself
 * fails with 25P02.
 */
export async function pgStateBySql(c: PgClientLike): Promise<PgTxState> {
  try {
    const r = await c.query('SELECT now() = statement_timestamp() AS alone');
    return (r.rows[0] as { alone: boolean }).alone ? 'idle' : 'open';
  } catch (err) {
    if ((err as { code?: unknown }).code === '25P02') return 'failed';
    throw err;
  }
}

/** The transaction state of a mysql2 connection. */
export interface MysqlTxState {
  open: boolean;
  autocommit: boolean;
}

// Connections to servers without @@in_transaction (MySQL has none; MariaDB does).
const noInTransaction = new WeakSet<object>();

/**
 * `SELECT @@in_transaction` (MariaDB); on MySQL, which lacks it (error 1193), the
 * SERVER_STATUS_IN_TRANS and SERVER_STATUS_AUTOCOMMIT flags of the OK packet of a `DO 0`.
 */
export async function mysqlState(c: MysqlConnectionLike, useStatusFlags = noInTransaction.has(c)): Promise<MysqlTxState> {
  if (!useStatusFlags) {
    try {
      const [rows] = await c.query('SELECT @@in_transaction AS t, @@autocommit AS a');
      const row = (rows as { t: unknown; a: unknown }[])[0]!;
      return { open: Number(row.t) === 1, autocommit: Number(row.a) === 1 };
    } catch (err) {
      if ((err as { errno?: unknown }).errno !== 1193) throw err;
      noInTransaction.add(c);
    }
  }
  const [ok] = await c.query('DO 0');
  const status = Number((ok as { serverStatus?: unknown }).serverStatus);
  return { open: (status & 0x0001) !== 0, autocommit: (status & 0x0002) !== 0 };
}

class MysqlDriver implements Driver {
  readonly engine = 'mysql' as const;
  constructor(private readonly c: MysqlConnectionLike) {}

  async requireNoTransaction(what: string): Promise<void> {
    const s = await mysqlState(this.c);
    if (s.open) throw new MisuseError(`${what}: a transaction is open on this connection; call it on a connection without one`);
  }

  async requireTransaction(): Promise<void> {
    const s = await mysqlState(this.c);
    // With autocommit off the fence's own statement opens the transaction, which lasts until COMMIT.
    if (!s.open && s.autocommit) {
      throw new MisuseError('fence(): no transaction is open: START TRANSACTION first, or use transaction()');
    }
  }

  async register(prefix: string, job: string, token: bigint, attempt: string): Promise<number> {
    // Its own transaction whatever the session's autocommit: the registration must commit now.
    await this.c.beginTransaction();
    try {
      const [rows] = await call(this.c.query(`SELECT ${prefix}attempt(?, ?, ?) AS n`, [job, token.toString(), attempt]));
      await this.c.commit();
      return Number((rows as { n: unknown }[])[0]!.n);
    } catch (err) {
      await this.c.rollback().catch(() => undefined);
      throw err;
    }
  }

  async fence(prefix: string, job: string, token: bigint, attempt: string): Promise<bigint> {
    // As text: mysql2 returns BIGINT as a JS number, which loses precision above 2^53.
    const [rows] = await call(this.c.query(`SELECT CAST(${prefix}fence(?, ?, ?) AS CHAR) AS t`, [job, token.toString(), attempt]));
    return BigInt((rows as { t: string }[])[0]!.t);
  }

  begin(): Promise<void> {
    return this.c.beginTransaction();
  }

  commit(): Promise<void> {
    return this.c.commit();
  }

  rollback(): Promise<void> {
    return this.c.rollback();
  }
}

async function call<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    throw asRefusal(err);
  }
}
