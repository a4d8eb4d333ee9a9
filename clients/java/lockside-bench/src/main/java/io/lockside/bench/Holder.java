package io.lockside.bench;

import io.lockside.LocksideClient;
import java.util.concurrent.locks.Lock;
import org.redisson.api.RedissonClient;

/**
 * A process that takes a lock, says "HELD" and waits to be killed:
 * {@code Holder lockside ADDRESS KEY}, {@code Holder redisson REDIS_URL KEY} or
 * {@code Holder curator ZK_CONNECT KEY}.
 */
public final class Holder {
    public static void main(String[] args) throws Exception {
        Lock lock;
        if (args[0].equals("lockside")) {
            lock = LocksideClient.connect(args[1]).lock(args[2]);
        } else if (args[0].equals("curator")) {
            lock = new CuratorLock(ZooKeeper.curator(args[1]), args[2]);
        } else {
            RedissonClient redisson = Bench.redisson(args[1]);
            lock = redisson.getLock(args[2]);
        }
        lock.lock();
        System.out.println("HELD");
        System.out.flush();
        Thread.sleep(Long.MAX_VALUE);
    }
}
