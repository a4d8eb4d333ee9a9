package io.lockside;

import io.grpc.ManagedChannel;
import io.grpc.netty.shaded.io.grpc.netty.NettyChannelBuilder;
import io.grpc.netty.shaded.io.netty.channel.EventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.MultiThreadIoEventLoopGroup;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollDomainSocketChannel;
import io.grpc.netty.shaded.io.netty.channel.epoll.EpollIoHandler;
import io.grpc.netty.shaded.io.netty.channel.unix.DomainSocketAddress;
import java.lang.reflect.Field;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import lockside.v1.LockServiceGrpc;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The gRPC channel to the sidecar at one address ({@code host:port}, {@code
 * http://host:port} or {@code unix:/path}), with HTTP/2 keepalive every second, and the
 * stub every call of the client goes through.
 */
final class Transport {
    private static final Logger LOG = LoggerFactory.getLogger("io.lockside");

    /**
     * HTTP/2 keepalive well below the shortest TTL (1 s): a frozen sidecar or a dead
     * connection is noticed in about 2 s, and every lock is suspended before the store
     * can let it go (DESIGN.md, "Client guidance").
     */
    private static final long KEEPALIVE_NANOS = TimeUnit.SECONDS.toNanos(1);

    final ManagedChannel channel;
    final LockServiceGrpc.LockServiceStub stub;
    /** The event loop of a Unix socket's channel; null for TCP (grpc-java's own). */
    private final EventLoopGroup group;

    Transport(String address) {
        NettyChannelBuilder builder;
        if (address.startsWith("unix:")) {
            String path = address.substring("unix:".length());
            while (path.startsWith("//")) {
                path = path.substring(1);
            }
            group = new MultiThreadIoEventLoopGroup(1, daemon("lockside-uds"), EpollIoHandler.newFactory());
            builder = NettyChannelBuilder.forAddress(new DomainSocketAddress(path))
                    .eventLoopGroup(group)
                    .channelType(EpollDomainSocketChannel.class)
                    // The default authority would be the socket's path, which the
                    // sidecar's HTTP/2 server refuses as a malformed :authority.
                    .overrideAuthority("localhost");
        } else {
            group = null;
            String target = address.startsWith("http://") ? address.substring("http://".length()) : address;
            while (target.endsWith("/")) {
                target = target.substring(0, target.length() - 1);
            }
            builder = NettyChannelBuilder.forTarget(target);
        }
        builder.usePlaintext()
                .keepAliveTime(KEEPALIVE_NANOS, TimeUnit.NANOSECONDS)
                .keepAliveTimeout(KEEPALIVE_NANOS, TimeUnit.NANOSECONDS)
                .keepAliveWithoutCalls(true);
        forceKeepAlive(builder);
        channel = builder.build();
        stub = LockServiceGrpc.newStub(channel);
    }

    /**
     * grpc-java raises any keepalive time below 10 s to 10 s (a guard for servers it
     * does not know). Ten seconds would leave a lock of the default 10 s TTL in use after
     * a frozen sidecar's store let it go, so the builder's field is set to 1 s directly;
     * the sidecar (hyper) accepts pings at any rate.
     */
    private static void forceKeepAlive(NettyChannelBuilder builder) {
        try {
            Field f = NettyChannelBuilder.class.getDeclaredField("keepAliveTimeNanos");
            f.setAccessible(true);
            f.setLong(builder, KEEPALIVE_NANOS);
        } catch (ReflectiveOperationException | RuntimeException e) {
            LOG.warn("lockside: cannot set HTTP/2 keepalive below 10 s on this grpc-java ({}): "
                    + "a frozen sidecar is noticed later", e.toString());
        }
    }

    /** Threads of the client's own that never keep the JVM from exiting. */
    static ThreadFactory daemon(String name) {
        return r -> {
            Thread t = new Thread(r, name);
            t.setDaemon(true);
            return t;
        };
    }

    /**
     * A call about to go out on a channel whose last connection failed: try to connect
     * now rather than fail with the old error until the channel's backoff (up to two
     * minutes) has passed. The sidecar is local: when it is back, it is back at once.
     */
    void reconnectNow() {
        channel.resetConnectBackoff();
    }

    /** Closes the channel, waiting up to 2 s for its calls to end, then its event loop. */
    void close() {
        channel.shutdown();
        try {
            if (!channel.awaitTermination(2, TimeUnit.SECONDS)) {
                channel.shutdownNow();
            }
        } catch (InterruptedException e) {
            channel.shutdownNow();
            Thread.currentThread().interrupt();
        }
        if (group != null) {
            group.shutdownGracefully(0, 1, TimeUnit.SECONDS);
        }
    }
}
