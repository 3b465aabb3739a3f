// Against real servers: each engine gets a fresh database with the backstop schema, dropped at
// the end. DATABASE_URL (PostgreSQL) and MARIADB_URL (MariaDB) must be set.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import pg from 'pg';
import mysql from 'mysql2/promise';
import {
  AttemptSuperseded,
  type Connection,
  FenceRefused,
  MisuseError,
  NeverIssued,
  NotPermitted,
  Run,
  StaleToken,
  exitCode,
} from '@singleton-dev/fence';
import { mysqlState, pgStateBySql } from '../dist/driver.js';

const TESTDATA = new URL('../../testdata/', import.meta.url);
const suffix = () => randomBytes(4).toString('hex');

type Conn = pg.Client | pg.PoolClient | mysql.Connection | mysql.PoolConnection;

/** What a test needs of an engine; the admin owns every job (it issues the tokens). */
interface Engine {
  readonly name: 'postgres' | 'mariadb';
  setUp(): Promise<void>;
  tearDown(): Promise<void>;
  connect(): Promise<Conn>;
  /** A user that may run the functions but owns no job. */
  connectStranger(): Promise<Conn>;
  /** A pooled connection, and how to give it back. */
  pooled(): Promise<[Conn, () => Promise<void>]>;
  exec(c: Conn, sql: string, params?: unknown[]): Promise<unknown[]>;
  inTransaction(c: Conn): Promise<boolean>;
  issue(job: string, token: number): Promise<void>;
  retire(job: string, token: number): Promise<void>;
  items(): Promise<string[]>;
  readonly insert: string;
  close(c: Conn): Promise<void>;
}

function required(name: string, how: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: point it at a test server (${how}), or run clients/typescript/test.sh`);
  return v;
}

function postgres(): Engine {
  let base: URL;
  let db: string;
  let role: string;
  let admin: pg.Client;
  let pool: pg.Pool | undefined;
  const url = (user?: string) => {
    const u = new URL(base.href);
    u.pathname = `/${db}`;
    if (user !== undefined) {
      u.username = user;
      u.password = 'x';
    }
    return u.href;
  };
  const connect = async (user?: string) => {
    const c = new pg.Client({ connectionString: url(user) });
    await c.connect();
    return c;
  };
  return {
    name: 'postgres',
    insert: 'INSERT INTO items (id) VALUES ($1)',
    async setUp() {
      base = new URL(required('DATABASE_URL', 'hack/postgres.sh url'));
      db = `typescript_${suffix()}`;
      role = `${db}_stranger`;
      const root = new pg.Client({ connectionString: base.href });
      await root.connect();
      await root.query(`CREATE DATABASE ${db}`);
      await root.query(`CREATE ROLE ${role} LOGIN PASSWORD 'x'`);
      await root.end();
      admin = await connect();
      // One multi-statement script: without parameters node-postgres sends it as a simple query.
      await admin.query(readFileSync(new URL('postgres.sql', TESTDATA), 'utf8'));
      await admin.query('CREATE TABLE items (id text PRIMARY KEY)');
      await admin.query(`GRANT EXECUTE ON FUNCTION singleton_fence(text, bigint, text), singleton_attempt(text, bigint, text) TO ${role}`);
    },
    async tearDown() {
      await pool?.end();
      await admin?.end();
      if (db === undefined) return;
      const root = new pg.Client({ connectionString: base.href });
      await root.connect();
      await root.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
      await root.query(`DROP ROLE IF EXISTS ${role}`);
      await root.end();
    },
    connect: () => connect(),
    connectStranger: () => connect(role),
    async pooled() {
      pool ??= new pg.Pool({ connectionString: url(), max: 2 });
      const c = await pool.connect();
      return [c, async () => c.release()];
    },
    async exec(c, sql, params = []) {
      return (await (c as pg.Client).query(sql, params)).rows;
    },
    async inTransaction(c) {
      return (c as pg.Client).getTransactionStatus() !== 'I';
    },
    async issue(job, token) {
      await admin.query(
        'INSERT INTO singleton_fences (job, token) VALUES ($1, $2) ON CONFLICT (job) DO UPDATE SET token = EXCLUDED.token',
        [job, token],
      );
    },
    async retire(job, token) {
      await admin.query('UPDATE singleton_fences SET retired = $2 WHERE job = $1', [job, token]);
    },
    async items() {
      return (await admin.query('SELECT id FROM items ORDER BY id')).rows.map((r) => r.id as string);
    },
    async close(c) {
      await (c as pg.Client).end();
    },
  };
}

function mariadb(): Engine {
  let opts: mysql.ConnectionOptions;
  let db: string;
  let user: string;
  let admin: mysql.Connection;
  let pool: mysql.Pool | undefined;
  const connect = (as?: string) =>
    mysql.createConnection({ ...opts, database: db, ...(as === undefined ? {} : { user: as, password: 'x' }) });
  return {
    name: 'mariadb',
    insert: 'INSERT INTO items (id) VALUES (?)',
    async setUp() {
      const u = new URL(required('MARIADB_URL', 'hack/mariadb.sh url'));
      opts = {
        host: u.hostname,
        port: Number(u.port || 3306),
        user: decodeURIComponent(u.username),
        password: decodeURIComponent(u.password),
      };
      db = `typescript_${suffix()}`;
      user = `${db}_stranger`;
      const root = await mysql.createConnection(opts);
      await root.query(`CREATE DATABASE ${db}`);
      await root.query(`CREATE USER '${user}'@'%' IDENTIFIED BY 'x'`);
      await root.query(`GRANT EXECUTE, SELECT, INSERT ON ${db}.* TO '${user}'@'%'`);
      await root.end();
      admin = await connect();
      const script = readFileSync(new URL('mariadb.sql', TESTDATA), 'utf8')
        .split('\n')
        .filter((l) => !l.startsWith('--') && !l.startsWith('DELIMITER'))
        .join('\n');
      for (const stmt of `\n${script}\n`.split('\n//\n')) {
        if (stmt.trim() !== '') await admin.query(stmt);
      }
      await admin.query('CREATE TABLE items (id VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB');
    },
    async tearDown() {
      await pool?.end();
      await admin?.end();
      if (db === undefined) return;
      const root = await mysql.createConnection(opts);
      await root.query(`DROP DATABASE IF EXISTS ${db}`);
      await root.query(`DROP USER IF EXISTS '${user}'@'%'`);
      await root.end();
    },
    connect: () => connect(),
    connectStranger: () => connect(user),
    async pooled() {
      pool ??= mysql.createPool({ ...opts, database: db, connectionLimit: 2 });
      const c = await pool.getConnection();
      return [c, async () => c.release()];
    },
    async exec(c, sql, params = []) {
      const [rows] = await (c as mysql.Connection).query(sql, params);
      return rows as unknown[];
    },
    async inTransaction(c) {
      const [rows] = await (c as mysql.Connection).query('SELECT @@in_transaction AS t');
      return (rows as { t: number }[])[0]!.t === 1;
    },
    async issue(job, token) {
      await admin.query(
        "INSERT INTO singleton_fences (job, token, owner) VALUES (?, ?, SUBSTRING_INDEX(SESSION_USER(), '@', 1)) ON DUPLICATE KEY UPDATE token = VALUES(token)",
        [job, token],
      );
    },
    async retire(job, token) {
      await admin.query('UPDATE singleton_fences SET retired = ? WHERE job = ?', [token, job]);
    },
    async items() {
      const [rows] = await admin.query('SELECT id FROM items ORDER BY id');
      return (rows as { id: string }[]).map((r) => r.id);
    },
    async close(c) {
      await (c as mysql.Connection).end();
    },
  };
}

/** Records the SQL the library sends through `c` (the real connection still runs it). */
function recordSql(c: Conn): { sent: string[]; stop(): void } {
  const target = c as unknown as { query: (...args: unknown[]) => unknown };
  const sent: string[] = [];
  const query = target.query;
  target.query = function (this: unknown, sql: unknown, ...rest: unknown[]) {
    sent.push(typeof sql === 'string' ? sql : String((sql as { text?: string; sql?: string }).text ?? (sql as { sql?: string }).sql));
    return query.call(this, sql, ...rest);
  };
  return { sent, stop: () => void delete (target as { query?: unknown }).query };
}

function refusal(Kind: typeof FenceRefused, sqlstate: string, message: RegExp) {
  return (err: unknown) => {
    assert.ok(err instanceof Kind, `expected ${Kind.name}, got ${String(err)}`);
    assert.ok(err instanceof FenceRefused);
    assert.equal(err.sqlstate, sqlstate);
    assert.match(err.message, message);
    assert.equal(exitCode(err), 3);
    return true;
  };
}

function misuse(message: RegExp) {
  return (err: unknown) => {
    assert.ok(err instanceof MisuseError, `expected MisuseError, got ${String(err)}`);
    assert.match(err.message, message);
    assert.equal(exitCode(err), 2);
    return true;
  };
}

for (const engine of [postgres(), mariadb()]) {
  describe(engine.name, () => {
    let conn: Conn;
    let n = 0;
    // A job of its own per test, and runs of it with attempts A, B, ...
    const job = () => `test/job-${++n}-${suffix()}`;
    const run = (j: string, token: number, attempt = 'pod-a') => new Run({ job: j, token, attempt });
    const id = () => `item-${suffix()}`;
    const writes = (item: string) => async (tx: Conn) => {
      await engine.exec(tx, engine.insert, [item]);
    };

    before(async () => {
      await engine.setUp();
      conn = await engine.connect();
    });
    after(async () => {
      if (conn) await engine.close(conn);
      await engine.tearDown();
    });

    test('register returns the attempt number; the same attempt gets it again', async () => {
      const j = job();
      await engine.issue(j, 5);
      assert.equal(await run(j, 5, 'pod-a').register(conn), 1);
      assert.equal(await run(j, 5, 'pod-a').register(conn), 1);
      assert.equal(await run(j, 5, 'pod-b').register(conn), 2);
      assert.equal(await engine.inTransaction(conn), false);
    });

    test('a registered attempt fences and commits', async () => {
      const j = job();
      const item = id();
      await engine.issue(j, 5);
      const r = run(j, 5);
      await r.register(conn);
      const out = await r.transaction(conn, async (tx, token) => {
        await writes(item)(tx);
        // Fencing again inside the same transaction is allowed.
        assert.equal(await r.fence(tx), 5n);
        return token;
      });
      assert.equal(out, 5n);
      assert.ok((await engine.items()).includes(item));
      assert.equal(await engine.inTransaction(conn), false);
    });

    test("fence() first in the caller's own transaction", async () => {
      const j = job();
      const item = id();
      await engine.issue(j, 9);
      const r = run(j, 9);
      await r.register(conn);
      await engine.exec(conn, 'BEGIN');
      assert.equal(await r.fence(conn), 9n);
      await writes(item)(conn);
      await engine.exec(conn, 'COMMIT');
      assert.ok((await engine.items()).includes(item));
    });

    test('a pooled connection works the same', async () => {
      const j = job();
      const item = id();
      await engine.issue(j, 3);
      const [c, release] = await engine.pooled();
      try {
        const r = run(j, 3);
        assert.equal(await r.register(c), 1);
        assert.equal(await r.transaction(c, async (tx, token) => (await writes(item)(tx), token)), 3n);
      } finally {
        await release();
      }
      assert.ok((await engine.items()).includes(item));
    });

    test('stale token: StaleToken, the write is not committed, the transaction is rolled back', async () => {
      const j = job();
      const item = id();
      await engine.issue(j, 5);
      const r = run(j, 5);
      await r.register(conn);
      await engine.issue(j, 6);
      let called = false;
      await assert.rejects(
        r.transaction(conn, async (tx) => ((called = true), writes(item)(tx))),
        refusal(StaleToken, 'SF001', new RegExp(`stale fencing token 5 for job ${j}: current is 6`)),
      );
      assert.equal(called, false);
      assert.equal(await engine.inTransaction(conn), false);
      assert.ok(!(await engine.items()).includes(item));
      await assert.rejects(r.register(conn), refusal(StaleToken, 'SF001', /stale fencing token 5/));
    });

    test('a refusal after a write in the caller transaction: nothing commits', async () => {
      const j = job();
      const item = id();
      await engine.issue(j, 5);
      await engine.issue(j, 6);
      await engine.exec(conn, 'BEGIN');
      await writes(item)(conn);
      await assert.rejects(run(j, 5).fence(conn), refusal(StaleToken, 'SF001', /stale/));
      // PostgreSQL aborted the transaction; MariaDB keeps it open: either way the caller must
      // roll back (the README says so), which is what this caller does.
      assert.equal(await engine.inTransaction(conn), true);
      await engine.exec(conn, 'ROLLBACK');
      assert.ok(!(await engine.items()).includes(item));
    });

    test('retired token: StaleToken', async () => {
      const j = job();
      await engine.issue(j, 7);
      const r = run(j, 7);
      await r.register(conn);
      await engine.retire(j, 7);
      await assert.rejects(
        r.transaction(conn, writes(id())),
        refusal(StaleToken, 'SF001', new RegExp(`fencing token 7 for job ${j} is retired`)),
      );
      await assert.rejects(r.register(conn), refusal(StaleToken, 'SF001', /retired/));
    });

    test('token never issued: no fence row, or a token above the newest: NeverIssued', async () => {
      const none = job();
      await assert.rejects(run(none, 1).register(conn), refusal(NeverIssued, 'SF003', /was never issued/));
      await assert.rejects(run(none, 1).transaction(conn, writes(id())), refusal(NeverIssued, 'SF003', /was never issued/));
      const j = job();
      await engine.issue(j, 3);
      await assert.rejects(run(j, 4).register(conn), refusal(NeverIssued, 'SF003', /the newest is 3/));
      await assert.rejects(run(j, 4).transaction(conn, writes(id())), refusal(NeverIssued, 'SF003', /the newest is 3/));
    });

    test('an older attempt (A registers, B registers, A fences): AttemptSuperseded, nothing committed', async () => {
      const j = job();
      const item = id();
      await engine.issue(j, 8);
      const a = run(j, 8, 'pod-a');
      const b = run(j, 8, 'pod-b');
      assert.equal(await a.register(conn), 1);
      assert.equal(await b.register(conn), 2);
      await assert.rejects(a.transaction(conn, writes(item)), refusal(AttemptSuperseded, 'SF004', /superseded by attempt #2 \(pod-b\)/));
      assert.ok(!(await engine.items()).includes(item));
      await assert.rejects(a.register(conn), refusal(AttemptSuperseded, 'SF004', /superseded/));
      await assert.rejects(run(j, 8, 'pod-c').transaction(conn, writes(item)), refusal(AttemptSuperseded, 'SF004', /not registered/));
      await b.transaction(conn, writes(item));
      assert.ok((await engine.items()).includes(item));
    });

    test('a user that does not own the job: NotPermitted', async () => {
      const j = job();
      await engine.issue(j, 2);
      const stranger = await engine.connectStranger();
      try {
        await assert.rejects(run(j, 2).register(stranger), refusal(NotPermitted, 'SF002', /may not fence job/));
        await assert.rejects(run(j, 2).transaction(stranger, writes(id())), refusal(NotPermitted, 'SF002', /may not fence job/));
        assert.equal(await engine.inTransaction(stranger), false);
      } finally {
        await engine.close(stranger);
      }
    });

    test('fence() with no transaction open: MisuseError, and the fence is never called', async () => {
      const j = job();
      await engine.issue(j, 4);
      const r = run(j, 4);
      await r.register(conn);
      const rec = recordSql(conn);
      try {
        await assert.rejects(r.fence(conn), misuse(/no transaction is open/));
      } finally {
        rec.stop();
      }
      // node-postgres reports the transaction status itself: nothing is sent. mysql2 asks first.
      if (engine.name === 'postgres') assert.deepEqual(rec.sent, []);
      else assert.deepEqual(rec.sent, ['SELECT @@in_transaction AS t, @@autocommit AS a']);
    });

    test('register() and transaction() inside an open transaction: MisuseError before any call', async () => {
      const j = job();
      await engine.issue(j, 4);
      const r = run(j, 4);
      await engine.exec(conn, 'BEGIN');
      const rec = recordSql(conn);
      try {
        await assert.rejects(r.register(conn), misuse(/register\(\): a transaction is open/));
        await assert.rejects(r.transaction(conn, writes(id())), misuse(/transaction\(\): a transaction is open/));
      } finally {
        rec.stop();
        await engine.exec(conn, 'ROLLBACK');
      }
      assert.ok(rec.sent.every((sql) => !/singleton_|BEGIN|START/i.test(sql)), rec.sent.join('; '));
      // Nor inside the library's own transaction, even before its BEGIN reached the server.
      await r.register(conn);
      const first = r.transaction(conn, async () => {
        await assert.rejects(r.register(conn), misuse(/inside transaction\(\)/));
      });
      await assert.rejects(r.transaction(conn, writes(id())), misuse(/inside transaction\(\)/));
      await first;
    });

    test('a pool or another object instead of a connection: MisuseError', async () => {
      const r = run(job(), 1);
      const pool = engine.name === 'postgres' ? new pg.Pool() : mysql.createPool({});
      try {
        await assert.rejects(r.register(pool as unknown as Connection), misuse(/not a pool/));
        await assert.rejects(r.fence({} as Connection), misuse(/expected a node-postgres/));
      } finally {
        await pool.end();
      }
    });

    test('an error in the callback: rolled back and thrown again', async () => {
      const j = job();
      const item = id();
      await engine.issue(j, 6);
      const r = run(j, 6);
      await r.register(conn);
      const boom = new Error('boom');
      await assert.rejects(
        r.transaction(conn, async (tx) => {
          await writes(item)(tx);
          throw boom;
        }),
        (err) => err === boom && exitCode(err) === 1,
      );
      assert.equal(await engine.inTransaction(conn), false);
      assert.ok(!(await engine.items()).includes(item));
    });

    test('bad arguments rejected by the database (22023): exit code 2', async () => {
      await engine.exec(conn, 'BEGIN');
      try {
        await assert.rejects(engine.exec(conn, "SELECT singleton_fence('j', -1, 'a')"), (err) => exitCode(err) === 2);
      } finally {
        await engine.exec(conn, 'ROLLBACK');
      }
    });

    if (engine.name === 'postgres') {
      test('without getTransactionStatus (pg < 8.21, pg-native): the statement_timestamp check', async () => {
        const c = conn as pg.Client;
        assert.equal(await pgStateBySql(c), 'idle');
        await c.query('BEGIN');
        assert.equal(await pgStateBySql(c), 'open');
        await assert.rejects(c.query('SELECT 1/0'));
        assert.equal(await pgStateBySql(c), 'failed');
        await c.query('ROLLBACK');

        const j = job();
        const item = id();
        await engine.issue(j, 2);
        const r = run(j, 2);
        const old = Object.assign(c, { getTransactionStatus: () => null });
        try {
          await r.register(old);
          await assert.rejects(r.fence(old), misuse(/no transaction is open/));
          await r.transaction(old, writes(item));
          await old.query('BEGIN');
          await assert.rejects(r.register(old), misuse(/a transaction is open/));
          await old.query('SELECT 1/0').catch(() => undefined);
          await assert.rejects(r.fence(old), misuse(/aborted/));
          await old.query('ROLLBACK');
        } finally {
          delete (c as { getTransactionStatus?: unknown }).getTransactionStatus;
        }
        assert.ok((await engine.items()).includes(item));
      });

      test('a BEGIN sent but not awaited counts as open', async () => {
        const c = conn as pg.Client;
        const begun = c.query('BEGIN');
        await assert.rejects(run(job(), 1).register(c), misuse(/a transaction is open/));
        await begun;
        await c.query('ROLLBACK');
      });

      test('a callback that swallows an error: the COMMIT rolls back, transaction() throws', async () => {
        const j = job();
        const item = id();
        await engine.issue(j, 2);
        const r = run(j, 2);
        await r.register(conn);
        await assert.rejects(
          r.transaction(conn, async (tx) => {
            await writes(item)(tx);
            await engine.exec(tx, 'SELECT 1/0').catch(() => undefined);
          }),
          (err: Error) => /rolled back, nothing committed/.test(err.message) && exitCode(err) === 1,
        );
        assert.ok(!(await engine.items()).includes(item));
      });
    } else {
      test('MySQL without @@in_transaction: the status flags of an OK packet', async () => {
        const c = conn as mysql.Connection;
        assert.deepEqual(await mysqlState(c, true), { open: false, autocommit: true });
        await c.beginTransaction();
        assert.deepEqual(await mysqlState(c, true), { open: true, autocommit: true });
        await c.rollback();
        await c.query('SET autocommit = 0');
        try {
          assert.deepEqual(await mysqlState(c, true), { open: false, autocommit: false });
        } finally {
          await c.query('SET autocommit = 1');
        }
      });

      test('autocommit off: fence() opens the transaction, which commits with COMMIT', async () => {
        const j = job();
        const item = id();
        await engine.issue(j, 2);
        const r = run(j, 2);
        await r.register(conn);
        await engine.exec(conn, 'SET autocommit = 0');
        try {
          assert.equal(await r.fence(conn), 2n);
          await writes(item)(conn);
          await engine.exec(conn, 'COMMIT');
          // register() commits on its own, whatever the session's autocommit.
          assert.equal(await run(j, 2, 'pod-b').register(conn), 2);
          assert.equal(await engine.inTransaction(conn), false);
        } finally {
          await engine.exec(conn, 'SET autocommit = 1');
        }
        assert.ok((await engine.items()).includes(item));
      });
    }
  });
}
