package dev.singleton.fence;

/**
 * The library was called the wrong way (fencing outside a transaction, registering inside one);
 * raised before any SQL is sent. Exit code 2: a retry would do the same.
 */
public class MisuseException extends SingletonException {
    public MisuseException(String message) {
        super(message, null);
    }

    @Override
    public int exitCode() {
        return ExitCode.BAD_INPUT;
    }
}
