"""The node side: everything that ships to and runs on a node (agent, slots, workers, watchdog, etcd server, wire protocol)."""
