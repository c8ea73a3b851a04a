"""The dataflows and worker processes, one subpackage per pipeline.

- :mod:`.send`: the send dataflow of a tier, its dispatcher and the send step's stages;
- :mod:`.receipts`: the reconciliation dataflow (status to Cassandra) and receipt matching;
- :mod:`.webhooks`: the client status webhook dataflow;
- :mod:`.scheduling`: the scheduler process and recurring schedules;
- :mod:`.campaigns`: the campaign expander process, its manifests and state notices;
- :mod:`.common`: what more than one pipeline is built from (items, pure steps, composite
  steps, the DLQ guard, the runner, the bulk-yield window).

The shared pieces live in their own subpackage rather than at the top of ``flows/`` so that
every module sits in exactly one named place, and ``flows.common`` reads as what it is: a
dependency of the pipelines, never one of them.
"""
