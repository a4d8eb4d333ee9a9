package io.lockside;

import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import lockside.v1.LockServiceGrpc;
import lockside.v1.Lockside;

/**
 * The states of one key, as they happen ({@link LocksideClient#watch}): first its
 * current state, then one each time its holders change, on any sidecar of the store. A
 * reader that falls far behind skips the oldest states it has not read (at most 1,024
 * are kept); the latest is always kept. {@link #close()} ends the watch.
 *
 * <pre>{@code
 * try (LockWatch w = client.watch("leader/orders")) {
 *     while (true) {
 *         Description d = w.next();
 *         d.leader().ifPresent(l -> route(l.valueString()));
 *     }
 * }
 * }</pre>
 */
public final class LockWatch implements AutoCloseable {
    private static final int KEEP = 1024;

    private final String key;
    private final ArrayDeque<Description> states = new ArrayDeque<>();
    private ClientCallStreamObserver<Lockside.WatchRequest> call;
    private RuntimeException ended;

    LockWatch(LockServiceGrpc.LockServiceStub stub, String key, String address) {
        this.key = key;
        stub.watch(Lockside.WatchRequest.newBuilder().setKey(key).build(),
                new ClientResponseObserver<Lockside.WatchRequest, Lockside.WatchResponse>() {
                    @Override
                    public void beforeStart(ClientCallStreamObserver<Lockside.WatchRequest> requestStream) {
                        call = requestStream;
                    }

                    @Override
                    public void onNext(Lockside.WatchResponse value) {
                        add(Description.of(value.getState()));
                    }

                    @Override
                    public void onError(Throwable t) {
                        finish(Calls.error(key, Status.fromThrowable(t), address));
                    }

                    @Override
                    public void onCompleted() {
                        finish(new LocksideUnavailableException("the sidecar ended the watch of " + Keys.show(key)));
                    }
                });
    }

    private synchronized void add(Description d) {
        if (states.size() == KEEP) {
            states.removeFirst();
        }
        states.addLast(d);
        notifyAll();
    }

    private synchronized void finish(RuntimeException why) {
        if (ended == null) {
            ended = why;
        }
        notifyAll();
    }

    /**
     * The next state, waiting for it.
     *
     * @throws LocksideException the watch ended (closed, a bad key, the sidecar gone)
     */
    public Description next() throws InterruptedException {
        synchronized (this) {
            while (states.isEmpty()) {
                if (ended != null) {
                    throw ended;
                }
                wait();
            }
            return states.removeFirst();
        }
    }

    /** The next state if one comes within `timeout`. */
    public Optional<Description> next(Duration timeout) throws InterruptedException {
        long until = System.nanoTime() + timeout.toNanos();
        synchronized (this) {
            while (states.isEmpty()) {
                if (ended != null) {
                    throw ended;
                }
                long left = until - System.nanoTime();
                if (left <= 0) {
                    return Optional.empty();
                }
                TimeUnit.NANOSECONDS.timedWait(this, left);
            }
            return Optional.of(states.removeFirst());
        }
    }

    public String key() {
        return key;
    }

    @Override
    public void close() {
        finish(new IllegalStateException("the watch of " + Keys.show(key) + " is closed"));
        call.cancel("closed", null);
    }
}
