// A Java fragment in a main method, with the stand-ins `store`, `order` and the
// listener's callbacks in scope: tests/client_doc_examples.rs puts it in place of the
// EXAMPLE line (in a package of its own), compiles it with javac against the jars of
// clients/java and runs it ($LOCKSIDE_ADDR).
import io.lockside.*;

class Example {
    /** A resource that takes the fencing token with every write. */
    static final class Store {
        void write(String what, long fencingToken) {
            System.out.println("wrote " + what + " with fencing token " + fencingToken);
        }
    }

    static final Store store = new Store();
    static final String order = "order 42";

    static void pauseWritesTo(String key) {}

    static void resumeWritesTo(String key) {}

    static void abandonWorkOn(String key) {}

    public static void main(String[] args) throws Exception {
        // EXAMPLE
    }
}
