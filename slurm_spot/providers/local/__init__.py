"""The ``local`` provider: ``slurmd`` processes on this machine with a simulated spot market.

Modules: :mod:`.provider` (the :class:`~slurm_spot.providers.base.Provider`), :mod:`.boot`
(the detached boot of one instance), :mod:`.notices` (the notice-file source).
"""
