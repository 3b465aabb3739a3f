package dev.singleton.fence;

/**
 * Base of every error this library raises. Unchecked on purpose: Spring's {@code @Transactional}
 * rolls back on a {@link RuntimeException} by default, but commits on a checked one.
 */
public abstract class SingletonException extends RuntimeException {
    SingletonException(String message, Throwable cause) {
        super(message, cause);
    }

    /** The process exit code this error asks for; see {@link ExitCode}. */
    public abstract int exitCode();
}
