package dev.singleton.fence;

import java.time.DateTimeException;
import java.time.Instant;
import java.time.LocalDate;
import java.time.OffsetDateTime;
import java.time.ZoneId;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.regex.Pattern;

/**
 * What singleton-controller tells a run through its environment (see docs/fencing.md). Build it
 * with {@link #fromEnv()} in a workload and with {@link #of} or the constructor in tests.
 *
 * @param job            {@code SINGLETON_JOB}: the fence's key, e.g. {@code billing/invoices}
 * @param token          {@code SINGLETON_FENCING_TOKEN}: 1 .. 2^63-1
 * @param attempt        {@code SINGLETON_ATTEMPT}: this pod's uid
 * @param period         {@code SINGLETON_PERIOD}: the scheduled instant
 * @param idempotencyKey {@code SINGLETON_IDEMPOTENCY_KEY}: 64 hex characters, the same for every
 *                       attempt of the job's period
 * @param previousPeriod {@code SINGLETON_PREVIOUS_PERIOD}: empty for the first run; the run covers
 *                       {@code [previousPeriod, period)}
 * @param nextPeriod     {@code SINGLETON_NEXT_PERIOD}: empty after the last run
 * @param timeZone       {@code SINGLETON_TIME_ZONE}: UTC when unset
 * @param businessDate   {@code SINGLETON_BUSINESS_DATE}: the period's local date in that zone
 * @param periodKey      {@code SINGLETON_PERIOD_KEY}: RFC 9557, e.g.
 *                       {@code 2027-03-28T03:00:00+02:00[Europe/Berlin]}, kept as the string
 */
public record Run(
        String job,
        long token,
        String attempt,
        Optional<Instant> period,
        Optional<String> idempotencyKey,
        Optional<Instant> previousPeriod,
        Optional<Instant> nextPeriod,
        ZoneId timeZone,
        Optional<LocalDate> businessDate,
        Optional<String> periodKey) {

    private static final Pattern DECIMAL = Pattern.compile("[0-9]{1,19}");
    private static final Pattern HEX64 = Pattern.compile("[0-9a-fA-F]{64}");
    // The database functions take the attempt as VARCHAR(253) (a pod uid is 36).
    private static final int MAX_ATTEMPT = 253;
    private static final ZoneId UTC = ZoneId.of("UTC");

    /** Checks the values, with the messages naming the variable each comes from. */
    public Run {
        if (job == null || job.isEmpty()) {
            throw new ConfigException("SINGLETON_JOB is not set: it is the job's fence key, e.g. billing/invoices");
        }
        if (token <= 0) {
            throw new ConfigException(
                    "SINGLETON_FENCING_TOKEN must be 1 to 9223372036854775807, got " + token);
        }
        if (attempt == null || attempt.isEmpty()) {
            throw new ConfigException("SINGLETON_ATTEMPT is not set: it must be the pod's uid "
                    + "(the controller sets it from the downward API)");
        }
        if (attempt.length() > MAX_ATTEMPT) {
            throw new ConfigException(
                    "SINGLETON_ATTEMPT must be at most " + MAX_ATTEMPT + " characters, got " + attempt.length());
        }
        period = Objects.requireNonNullElse(period, Optional.empty());
        idempotencyKey = Objects.requireNonNullElse(idempotencyKey, Optional.empty());
        idempotencyKey.ifPresent(k -> {
            if (!HEX64.matcher(k).matches()) {
                throw new ConfigException("SINGLETON_IDEMPOTENCY_KEY must be 64 hex characters, got \"" + k + "\"");
            }
        });
        previousPeriod = Objects.requireNonNullElse(previousPeriod, Optional.empty());
        nextPeriod = Objects.requireNonNullElse(nextPeriod, Optional.empty());
        timeZone = Objects.requireNonNullElse(timeZone, UTC);
        businessDate = Objects.requireNonNullElse(businessDate, Optional.empty());
        periodKey = Objects.requireNonNullElse(periodKey, Optional.empty());
    }

    /** A run with only what fencing needs: no window, time zone UTC. For tests and tools. */
    public static Run of(String job, long token, String attempt) {
        return new Run(job, token, attempt, Optional.empty(), Optional.empty(), Optional.empty(),
                Optional.empty(), UTC, Optional.empty(), Optional.empty());
    }

    /**
     * Reads the process environment.
     *
     * @throws ConfigException naming the variable that is missing or invalid
     */
    public static Run fromEnv() {
        return fromEnv(System.getenv());
    }

    /** Reads the given variables, as {@link #fromEnv()} reads the environment. */
    public static Run fromEnv(Map<String, String> env) {
        Objects.requireNonNull(env, "env");
        // Evaluated in this order, so the first missing variable of the table is the one named.
        String job = get(env, "SINGLETON_JOB").orElse(null);
        if (job == null) {
            throw new ConfigException("SINGLETON_JOB is not set: it is the job's fence key, e.g. billing/invoices");
        }
        long token = parseToken(get(env, "SINGLETON_FENCING_TOKEN"));
        return new Run(
                job,
                token,
                get(env, "SINGLETON_ATTEMPT").orElse(null),
                instant(env, "SINGLETON_PERIOD"),
                get(env, "SINGLETON_IDEMPOTENCY_KEY"),
                instant(env, "SINGLETON_PREVIOUS_PERIOD"),
                instant(env, "SINGLETON_NEXT_PERIOD"),
                zone(env, "SINGLETON_TIME_ZONE"),
                date(env, "SINGLETON_BUSINESS_DATE"),
                get(env, "SINGLETON_PERIOD_KEY"));
    }

    /**
     * A key for one external effect of this period: the idempotency key, {@code "/"} and the
     * suffix, e.g. {@code key("mail/" + customerId)}. The same in every attempt of the period.
     *
     * @throws ConfigException when SINGLETON_IDEMPOTENCY_KEY was not set
     */
    public String key(String suffix) {
        Objects.requireNonNull(suffix, "suffix");
        return idempotencyKey
                .orElseThrow(() -> new ConfigException("SINGLETON_IDEMPOTENCY_KEY is not set"))
                + "/" + suffix;
    }

    // An empty value counts as unset: the controller sets SINGLETON_PREVIOUS_PERIOD and
    // SINGLETON_NEXT_PERIOD to "" at the ends of the schedule.
    private static Optional<String> get(Map<String, String> env, String name) {
        String v = env.get(name);
        return v == null || v.isEmpty() ? Optional.empty() : Optional.of(v);
    }

    private static long parseToken(Optional<String> value) {
        String v = value.orElseThrow(() -> new ConfigException(
                "SINGLETON_FENCING_TOKEN is not set: it must be the run's fencing token, a decimal number"));
        if (DECIMAL.matcher(v).matches()) {
            try {
                long t = Long.parseLong(v);
                if (t > 0) {
                    return t;
                }
            } catch (NumberFormatException tooBig) {
                // falls through to the error below
            }
        }
        throw new ConfigException(
                "SINGLETON_FENCING_TOKEN must be a decimal number from 1 to 9223372036854775807, got \"" + v + "\"");
    }

    private static Optional<Instant> instant(Map<String, String> env, String name) {
        return get(env, name).map(v -> {
            try {
                return OffsetDateTime.parse(v).toInstant();
            } catch (DateTimeException e) {
                throw new ConfigException(
                        name + " must be an RFC 3339 timestamp such as 2026-12-06T12:00:00Z, got \"" + v + "\"");
            }
        });
    }

    private static ZoneId zone(Map<String, String> env, String name) {
        return get(env, name).map(v -> {
            try {
                return ZoneId.of(v);
            } catch (DateTimeException e) {
                throw new ConfigException(name + " must be an IANA time zone such as Europe/Berlin, got \"" + v + "\"");
            }
        }).orElse(UTC);
    }

    private static Optional<LocalDate> date(Map<String, String> env, String name) {
        return get(env, name).map(v -> {
            try {
                return LocalDate.parse(v);
            } catch (DateTimeException e) {
                throw new ConfigException(name + " must be a date YYYY-MM-DD, got \"" + v + "\"");
            }
        });
    }
}
