// A Java fragment of Spring bean methods: tests/client_doc_examples.rs puts it in place
// of the EXAMPLE line (in a package of its own) and compiles it with javac against the
// jars of clients/java and their dependencies (Spring Integration, ShedLock).
import io.lockside.LocksideClient;
import io.lockside.shedlock.LocksideLockProvider;
import io.lockside.spring.LocksideDistributedLock;
import io.lockside.spring.LocksideLockRegistry;
import net.javacrumbs.shedlock.core.LockProvider;
import org.springframework.context.annotation.Bean;
import org.springframework.integration.support.locks.LockRegistry;

class Example {
    // EXAMPLE
}
