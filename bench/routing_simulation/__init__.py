"""The routing simulator's parts: topologies, workload and simulator.

``bench/routing_sim.py`` runs them and reports.
"""
