"""What is kept out of the choice: banned nodes and quarantined routes (ADR-0003, ADR-0007).

A *ban* keeps a node out for a time after it failed; a *quarantine* keeps a
route out until a probe agrees (or for a set time). In the order they act:

- ``bans`` — a node that failed mid-generation is banned with exponential
  back-off; a completed request clears its count.
- ``receivers`` — a topology change queues a probe of the model's routes
  (the probe itself runs in ``tracker_app.probes``).
- ``probe_verdicts`` — the probe's answers compared with a reference:
  which routes disagree and which nodes to blame.
- ``quarantines`` — what follows from the verdicts: ``RouteQuarantine`` rows,
  reputation, re-probes and release.
- ``kept_out`` — ``Exclusions``: the bans and quarantines a tracker's store
  holds, its own and its peers', applied before any policy sees a candidate.
"""
