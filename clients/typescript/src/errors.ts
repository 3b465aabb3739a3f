// Typed errors and the exit-code convention of the chart's podFailurePolicy example.

/**
 * The fence (or the registration) refused this run: SQLSTATE SF001..SF004. The run must stop
 * without committing and must not retry with the same token or attempt (exit code 3).
 */
export class FenceRefused extends Error {
  /** The SQLSTATE the database raised, e.g. `SF001`. */
  readonly sqlstate: string;

  constructor(sqlstate: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.sqlstate = sqlstate;
    this.name = new.target.name;
  }
}

/** SF001: a newer run holds the fence, or this run's token is retired (its period was decided). */
export class StaleToken extends FenceRefused {}
/** SF002: the database user/role may not fence this job. */
export class NotPermitted extends FenceRefused {}
/** SF003: the token was never issued (no fence row for the job, or a token above the newest). */
export class NeverIssued extends FenceRefused {}
/** SF004: a newer attempt (pod) of this run registered, or this attempt never registered. */
export class AttemptSuperseded extends FenceRefused {}

/** A missing or invalid environment variable or option (exit code 2). */
export class ConfigError extends Error {
  /** The environment variable at fault, when there is one. */
  readonly variable: string | undefined;

  constructor(message: string, variable?: string) {
    super(message);
    this.variable = variable;
    this.name = 'ConfigError';
  }
}

/** The library was called the wrong way, e.g. fence() outside a transaction (exit code 2). */
export class MisuseError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'MisuseError';
  }
}

const BY_SQLSTATE: Record<string, typeof FenceRefused> = {
  SF001: StaleToken,
  SF002: NotPermitted,
  SF003: NeverIssued,
  SF004: AttemptSuperseded,
};

// MariaDB/MySQL also raise MYSQL_ERRNO 31001..31004, for drivers that drop the SQLSTATE.
const SQLSTATE_BY_ERRNO: Record<number, string> = {
  31001: 'SF001',
  31002: 'SF002',
  31003: 'SF003',
  31004: 'SF004',
};

/** The SQLSTATE of a node-postgres (`code`) or mysql2 (`sqlState`) error, if it has one. */
export function sqlstateOf(err: unknown): string | undefined {
  if (typeof err !== 'object' || err === null) return undefined;
  const e = err as { sqlState?: unknown; code?: unknown; errno?: unknown };
  if (typeof e.sqlState === 'string' && e.sqlState !== '') return e.sqlState;
  // mysql2 puts its symbolic name (ER_...) in `code`; node-postgres puts the SQLSTATE there.
  if (typeof e.code === 'string' && /^[0-9A-Z]{5}$/.test(e.code)) return e.code;
  if (typeof e.errno === 'number') return SQLSTATE_BY_ERRNO[e.errno];
  return undefined;
}

/** A driver error that is a fence refusal, as its typed error; any other error unchanged. */
export function asRefusal(err: unknown): unknown {
  if (err instanceof FenceRefused) return err;
  let sqlstate = sqlstateOf(err);
  const errno = (err as { errno?: unknown } | null)?.errno;
  if ((sqlstate === undefined || !sqlstate.startsWith('SF')) && typeof errno === 'number') {
    sqlstate = SQLSTATE_BY_ERRNO[errno] ?? sqlstate;
  }
  if (sqlstate === undefined || !sqlstate.startsWith('SF')) return err;
  const Kind = BY_SQLSTATE[sqlstate] ?? FenceRefused;
  const message = err instanceof Error ? err.message : String(err);
  return new Kind(sqlstate, message, { cause: err });
}

/**
 * The process exit code for how a run ended: 0 success (no error), 2 bad input, configuration or
 * misuse, 3 refused by the fence (do not retry: the chart's podFailurePolicy fails the Job),
 * 1 anything else (a retry may help).
 */
export function exitCode(err?: unknown): 0 | 1 | 2 | 3 {
  if (err === undefined || err === null) return 0;
  const e = asRefusal(err);
  if (e instanceof FenceRefused) return 3;
  if (e instanceof ConfigError || e instanceof MisuseError) return 2;
  // 22023: the database rejected the arguments (empty attempt, negative token).
  if (sqlstateOf(e) === '22023') return 2;
  return 1;
}
