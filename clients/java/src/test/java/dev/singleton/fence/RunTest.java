package dev.singleton.fence;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Instant;
import java.time.LocalDate;
import java.time.ZoneId;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.junit.jupiter.params.provider.ValueSource;

class RunTest {
    private static final String KEY = "0123456789abcdef".repeat(4);

    private static Map<String, String> env() {
        Map<String, String> env = new HashMap<>();
        env.put("SINGLETON_JOB", "billing/invoices");
        env.put("SINGLETON_FENCING_TOKEN", "42");
        env.put("SINGLETON_ATTEMPT", "6f1c0d9e-0000-4000-8000-000000000001");
        env.put("SINGLETON_PERIOD", "2026-12-07T12:00:00Z");
        env.put("SINGLETON_IDEMPOTENCY_KEY", KEY);
        env.put("SINGLETON_PREVIOUS_PERIOD", "");
        env.put("SINGLETON_NEXT_PERIOD", "2026-12-08T12:00:00Z");
        env.put("SINGLETON_TIME_ZONE", "Europe/Berlin");
        env.put("SINGLETON_BUSINESS_DATE", "2026-12-07");
        env.put("SINGLETON_PERIOD_KEY", "2026-12-07T13:00:00+01:00[Europe/Berlin]");
        return env;
    }

    @Test
    void readsTheWholeEnvironment() {
        Run run = Run.fromEnv(env());
        assertEquals("billing/invoices", run.job());
        assertEquals(42, run.token());
        assertEquals("6f1c0d9e-0000-4000-8000-000000000001", run.attempt());
        assertEquals(Optional.of(Instant.parse("2026-12-07T12:00:00Z")), run.period());
        assertEquals(Optional.empty(), run.previousPeriod(), "empty: the first run");
        assertEquals(Optional.of(Instant.parse("2026-12-08T12:00:00Z")), run.nextPeriod());
        assertEquals(ZoneId.of("Europe/Berlin"), run.timeZone());
        assertEquals(Optional.of(LocalDate.of(2026, 12, 7)), run.businessDate());
        assertEquals(Optional.of("2026-12-07T13:00:00+01:00[Europe/Berlin]"), run.periodKey());
        assertEquals(Optional.of(KEY), run.idempotencyKey());
        assertEquals(KEY + "/mail/customer-7", run.key("mail/customer-7"));
    }

    @Test
    void windowAndDefaults() {
        Map<String, String> env = env();
        env.put("SINGLETON_PREVIOUS_PERIOD", "2026-12-06T12:00:00.5Z");
        env.put("SINGLETON_NEXT_PERIOD", "");
        env.remove("SINGLETON_TIME_ZONE");
        env.put("SINGLETON_FENCING_TOKEN", "9223372036854775807");
        Run run = Run.fromEnv(env);
        assertEquals(Optional.of(Instant.parse("2026-12-06T12:00:00.500Z")), run.previousPeriod());
        assertEquals(Optional.empty(), run.nextPeriod(), "empty: the last run");
        assertEquals(ZoneId.of("UTC"), run.timeZone());
        assertEquals(Long.MAX_VALUE, run.token());
    }

    @Test
    void onlyTheFencingVariablesAreRequired() {
        Map<String, String> env = new HashMap<>();
        env.put("SINGLETON_JOB", "j");
        env.put("SINGLETON_FENCING_TOKEN", "1");
        env.put("SINGLETON_ATTEMPT", "a");
        Run run = Run.fromEnv(env);
        assertEquals(Run.of("j", 1, "a"), run);
        ConfigException e = assertThrows(ConfigException.class, () -> run.key("x"));
        assertTrue(e.getMessage().contains("SINGLETON_IDEMPOTENCY_KEY"), e.getMessage());
    }

    @ParameterizedTest
    @ValueSource(strings = {"SINGLETON_JOB", "SINGLETON_FENCING_TOKEN", "SINGLETON_ATTEMPT"})
    void missingRequiredVariableIsAConfigError(String name) {
        for (String value : new String[] {null, ""}) {
            Map<String, String> env = env();
            env.put(name, value);
            ConfigException e = assertThrows(ConfigException.class, () -> Run.fromEnv(env));
            assertTrue(e.getMessage().startsWith(name + " is not set"), e.getMessage());
            assertEquals(2, e.exitCode());
            assertEquals(ExitCode.BAD_INPUT, ExitCode.of(e));
        }
    }

    @ParameterizedTest
    @CsvSource(delimiter = '|', value = {
        "SINGLETON_FENCING_TOKEN|0",
        "SINGLETON_FENCING_TOKEN|-1",
        "SINGLETON_FENCING_TOKEN|+5",
        "SINGLETON_FENCING_TOKEN|' 5'",
        "SINGLETON_FENCING_TOKEN|4x",
        "SINGLETON_FENCING_TOKEN|9223372036854775808",
        "SINGLETON_FENCING_TOKEN|18446744073709551615",
        "SINGLETON_PERIOD|2026-12-07",
        "SINGLETON_PERIOD|tomorrow",
        "SINGLETON_PREVIOUS_PERIOD|2026-13-01T00:00:00Z",
        "SINGLETON_NEXT_PERIOD|2026-12-08 12:00",
        "SINGLETON_IDEMPOTENCY_KEY|abc",
        "SINGLETON_IDEMPOTENCY_KEY|" + "0123456789abcdeg0123456789abcdef0123456789abcdef0123456789abcdef",
        "SINGLETON_TIME_ZONE|Mars/Olympus",
        "SINGLETON_BUSINESS_DATE|07.12.2026",
    })
    void invalidVariableIsAConfigErrorNamingIt(String name, String value) {
        Map<String, String> env = env();
        env.put(name, value);
        ConfigException e = assertThrows(ConfigException.class, () -> Run.fromEnv(env));
        assertTrue(e.getMessage().startsWith(name + " must be"), e.getMessage());
        assertEquals(ExitCode.BAD_INPUT, ExitCode.of(e));
    }

    @Test
    void attemptLongerThanTheDatabaseTakesIsRefused() {
        ConfigException e = assertThrows(ConfigException.class, () -> Run.of("j", 1, "a".repeat(254)));
        assertTrue(e.getMessage().startsWith("SINGLETON_ATTEMPT"), e.getMessage());
    }

    @ParameterizedTest
    @ValueSource(strings = {"", "Singleton_", "1x_", "x-y_", "x.y_", "a_very_long_prefix_of_33_chars_xx", "x; DROP"})
    void badTablePrefixIsRefusedBeforeAnySql(String prefix) {
        ConfigException e = assertThrows(ConfigException.class, () -> new Fence(Run.of("j", 1, "a"), prefix));
        assertTrue(e.getMessage().startsWith("table prefix"), e.getMessage());
        assertThrows(ConfigException.class, () -> new Fence(Run.of("j", 1, "a"), null));
    }

    @ParameterizedTest
    @ValueSource(strings = {"singleton_", "a", "billing_fence_", "a_prefix_of_exactly_32_chars_xx_"})
    void goodTablePrefixIsKept(String prefix) {
        assertEquals(prefix, new Fence(Run.of("j", 1, "a"), prefix).tablePrefix());
    }
}
