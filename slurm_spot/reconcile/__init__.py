"""The reconciler (docs/DESIGN.md flow 6).

Modules: :mod:`.rules` (pure classification of each node), :mod:`.reconciler` (one pass:
snapshot, classify, act), :mod:`.history` (facts read back from the events file),
:mod:`.loop` (the daemon loop, lock and reloads), :mod:`.metrics` (Prometheus),
:mod:`.reasons` (the node reasons slurm-spot writes and reads back). Importing this package
imports none of them.
"""
