// @singleton-dev/fence: fencing for the runs of singleton-controller (see docs/fencing.md).

export { Run, type RunInit, type FromEnvOptions } from './run.js';
export type { Connection, PgClientLike, MysqlConnectionLike } from './driver.js';
export {
  FenceRefused,
  StaleToken,
  NotPermitted,
  NeverIssued,
  AttemptSuperseded,
  ConfigError,
  MisuseError,
  exitCode,
} from './errors.js';
