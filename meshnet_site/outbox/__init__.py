"""The outbox: how a process that is not a tracker (the Celery worker) tells the dashboards.

The channel layer reaches every tracker's dashboards only when it is Redis;
the embedded in-memory layer lives inside one process. So what a background
job must show (a node went offline, a route was quarantined, a refund) is
written here, in the job's own transaction, and every running tracker
claims and forwards it to its channel layer (``tracker_app.dashboard.outbox_relay``).
The database is the one thing every process shares in both modes.
"""
