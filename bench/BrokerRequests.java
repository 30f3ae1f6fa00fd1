// The broker's request counts per API, sampled from its own JMX meters (issue 15: what one job
// costs Kafka). Attaches to a local broker JVM by pid (same user), starts its local management
// agent and prints, every <interval_ms>, one line: "<unix ms> <api>=<count> ...", the counts
// of kafka.network:type=RequestMetrics,name=RequestsPerSec summed over versions (cumulative
// since the broker started: subtract two lines for a window).
//
//   java bench/BrokerRequests.java <broker pid> <interval_ms> > requests.txt
//
// Java 11+ runs a single source file as it is; nothing to build.
import com.sun.tools.attach.VirtualMachine;
import java.util.Map;
import java.util.TreeMap;
import javax.management.MBeanServerConnection;
import javax.management.ObjectName;
import javax.management.remote.JMXConnector;
import javax.management.remote.JMXConnectorFactory;
import javax.management.remote.JMXServiceURL;

public class BrokerRequests {
    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: java bench/BrokerRequests.java <broker pid> <interval_ms>");
            System.exit(2);
        }
        long everyMs = Long.parseLong(args[1]);
        VirtualMachine vm = VirtualMachine.attach(args[0]);
        JMXConnector connector = JMXConnectorFactory.connect(new JMXServiceURL(vm.startLocalManagementAgent()));
        MBeanServerConnection server = connector.getMBeanServerConnection();
        ObjectName pattern = new ObjectName("kafka.network:type=RequestMetrics,name=RequestsPerSec,*");
        while (true) {
            TreeMap<String, Long> counts = new TreeMap<>();
            for (ObjectName name : server.queryNames(pattern, null)) {
                long count = ((Number) server.getAttribute(name, "Count")).longValue();
                counts.merge(name.getKeyProperty("request"), count, Long::sum);
            }
            StringBuilder line = new StringBuilder(Long.toString(System.currentTimeMillis()));
            for (Map.Entry<String, Long> e : counts.entrySet()) {
                line.append(' ').append(e.getKey()).append('=').append(e.getValue());
            }
            System.out.println(line);
            System.out.flush();
            Thread.sleep(everyMs);
        }
    }
}
