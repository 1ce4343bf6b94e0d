"""The one harness for local networks of Meshnet processes.

``meshnet_up``, the test fixtures and the benchmarks start trackers, workers
and nodes only through this package, and stop them only through
:class:`ManagedProcess`. ``processes`` holds the command lines and the
managed process; ``network`` the network built from them; ``databases`` the
fresh databases a throwaway network runs over; ``stand_in_nodes`` nodes that
only register (their endpoints answer challenges, nothing more; imported by
name, it is not re-exported here); ``topology`` what
``meshnet_up`` reads and ``demo`` the steps it takes. Nothing here imports Django or torch.
"""

from tracker_app.localnet.databases import fresh_process_database, query_process_database
from tracker_app.localnet.network import (
    THROWAWAY_ENV,
    LocalNetwork,
    NodeProcess,
    TrackerProcess,
    fresh_sqlite_database,
    migrate,
    process_env,
    start_node,
    start_tracker,
    start_worker,
)
from tracker_app.localnet.processes import (
    LOOPBACK,
    ROOT,
    ManagedProcess,
    ProcessExited,
    free_port,
    manage_argv,
    node_argv,
    run_checked,
    run_command,
    stop_together,
    tracker_argv,
    wait_for_port,
    wait_until,
    worker_argv,
)
from tracker_app.localnet.topology import NodeSpec, Topology, TopologyError, topology_load

__all__ = [
    "LOOPBACK",
    "ROOT",
    "THROWAWAY_ENV",
    "LocalNetwork",
    "ManagedProcess",
    "NodeProcess",
    "NodeSpec",
    "ProcessExited",
    "Topology",
    "TopologyError",
    "TrackerProcess",
    "free_port",
    "fresh_process_database",
    "fresh_sqlite_database",
    "manage_argv",
    "migrate",
    "node_argv",
    "process_env",
    "query_process_database",
    "run_checked",
    "run_command",
    "start_node",
    "start_tracker",
    "start_worker",
    "stop_together",
    "topology_load",
    "tracker_argv",
    "wait_for_port",
    "wait_until",
    "worker_argv",
]
