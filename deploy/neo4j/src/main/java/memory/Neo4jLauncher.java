package memory;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.connectors.HttpConnector;
import org.neo4j.configuration.connectors.HttpsConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.graphdb.QueryExecutionException;
import org.neo4j.io.ByteUnit;

/**
 * Starts embedded Neo4j Community with only the Bolt connector, on loopback, until SIGTERM.
 *
 * Arguments come from the environment so that services.sh stays the one place that chooses them:
 * NEO4J_HOME_DIR (data folder), NEO4J_BOLT_PORT, NEO4J_PAGECACHE (e.g. 256m),
 * NEO4J_PASSWORD (auth on with this password for user neo4j; empty = auth off),
 * NEO4J_TX_LOG_RETENTION (how much transaction log to keep, e.g. "256M size"; default keeps disk use bounded).
 */
public final class Neo4jLauncher {
    private Neo4jLauncher() {}

    public static void main(String[] args) throws Exception {
        Path home = Path.of(env("NEO4J_HOME_DIR", ".var/neo4j")).toAbsolutePath();
        int port = Integer.parseInt(env("NEO4J_BOLT_PORT", "17687"));
        String pagecache = env("NEO4J_PAGECACHE", "256m");
        String password = env("NEO4J_PASSWORD", "");
        String txLogRetention = env("NEO4J_TX_LOG_RETENTION", "256M size");
        Files.createDirectories(home);

        DatabaseManagementService dbms = new DatabaseManagementServiceBuilder(home)
                .setConfig(BoltConnector.enabled, true)
                .setConfig(BoltConnector.listen_address, new SocketAddress("127.0.0.1", port))
                .setConfig(BoltConnector.encryption_level, BoltConnector.EncryptionLevel.DISABLED)
                .setConfig(HttpConnector.enabled, false)
                .setConfig(HttpsConnector.enabled, false)
                .setConfig(GraphDatabaseSettings.pagecache_memory, ByteUnit.parse(pagecache))
                .setConfig(GraphDatabaseSettings.keep_logical_logs, txLogRetention)
                .setConfig(GraphDatabaseSettings.logical_log_rotation_threshold, ByteUnit.mebiBytes(64))
                .setConfig(GraphDatabaseSettings.auth_enabled, !password.isEmpty())
                .build();

        try {
            if (!password.isEmpty()) {
                setPassword(dbms, password);
            }
            dbms.database(GraphDatabaseSettings.DEFAULT_DATABASE_NAME).executeTransactionally("RETURN 1");
        } catch (RuntimeException e) {
            e.printStackTrace();
            dbms.shutdown();
            System.exit(1);
        }

        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            dbms.shutdown();
            stopped.countDown();
        }, "neo4j-shutdown"));
        System.out.println("neo4j-launcher: ready, bolt on 127.0.0.1:" + port + " data=" + home);
        System.out.flush();
        stopped.await();
    }

    /** Applies the password kept by services.sh at every start, so that file stays the truth. */
    private static void setPassword(DatabaseManagementService dbms, String password) {
        try {
            dbms.database("system").executeTransactionally(
                    "ALTER USER neo4j SET PASSWORD $pw CHANGE NOT REQUIRED", Map.of("pw", password));
        } catch (QueryExecutionException e) {
            if (e.getMessage() == null || !e.getMessage().contains("cannot be the same")) {
                throw e;
            }
        }
    }

    private static String env(String name, String fallback) {
        String value = System.getenv(name);
        return value == null || value.isEmpty() ? fallback : value;
    }
}
