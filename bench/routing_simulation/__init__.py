"""The routing simulator's parts: topologies, workload, simulator and conversations.

``bench/routing_sim.py`` runs them and reports.
"""
