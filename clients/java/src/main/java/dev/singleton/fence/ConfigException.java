package dev.singleton.fence;

/** A missing or invalid environment variable or option; the message names it. Exit code 2. */
public class ConfigException extends SingletonException {
    public ConfigException(String message) {
        super(message, null);
    }

    @Override
    public int exitCode() {
        return ExitCode.BAD_INPUT;
    }
}
