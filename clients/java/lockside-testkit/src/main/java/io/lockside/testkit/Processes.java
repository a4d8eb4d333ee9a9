package io.lockside.testkit;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;

/** What the harness does to processes: signals, waiting, the tail of a log. */
final class Processes {
    private Processes() {}

    /** Every process the harness started and has not seen exit. */
    private static final java.util.Set<Process> LIVE = java.util.concurrent.ConcurrentHashMap.newKeySet();

    static {
        // A test JVM that exits without closing its servers (a timeout, a crash) leaves
        // no redis-server or sidecar behind.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> LIVE.forEach(Process::destroyForcibly)));
    }

    /** Starts `pb`, remembered until it exits. */
    static Process start(ProcessBuilder pb) throws IOException {
        Process p = pb.start();
        LIVE.add(p);
        p.onExit().thenRun(() -> LIVE.remove(p));
        return p;
    }

    /** Sends `signal` (e.g. "STOP", "CONT", "TERM") to the process. */
    static void signal(Process p, String signal) {
        try {
            Process kill = new ProcessBuilder("kill", "-" + signal, Long.toString(p.pid()))
                    .redirectErrorStream(true)
                    .start();
            if (!kill.waitFor(5, TimeUnit.SECONDS) || kill.exitValue() != 0) {
                throw new IllegalStateException("kill -" + signal + " " + p.pid() + " failed");
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }

    /** SIGKILL, and wait until the process is gone. */
    static void kill(Process p) {
        p.destroyForcibly();
        waitGone(p);
    }

    /** SIGTERM, then SIGKILL if it is still there after 5 s. */
    static void stop(Process p) {
        if (!p.isAlive()) {
            return;
        }
        p.destroy();
        try {
            if (!p.waitFor(5, TimeUnit.SECONDS)) {
                kill(p);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            kill(p);
        }
    }

    static void waitGone(Process p) {
        boolean interrupted = false;
        while (true) {
            try {
                p.waitFor();
                break;
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (interrupted) {
            Thread.currentThread().interrupt();
        }
    }

    /** The last lines of a log file, for failure messages. */
    static String tail(Path log, int lines) {
        try {
            List<String> all = Files.readAllLines(log, StandardCharsets.UTF_8);
            return String.join("\n", all.subList(Math.max(0, all.size() - lines), all.size()));
        } catch (IOException e) {
            return "(no log: " + e + ")";
        }
    }
}
