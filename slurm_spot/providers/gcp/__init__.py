"""The ``gcp`` provider: Compute Engine SPOT VMs through ``bulk_insert``.

Modules: :mod:`.provider` (the :class:`~slurm_spot.providers.base.Provider`), :mod:`.launch`
(the launch state machine), :mod:`.requests` (pure request builders and parsers), :mod:`.api`
(the only code touching google-cloud-compute), :mod:`.errors` (the error-code table),
:mod:`.checks` (config checks), :mod:`.notices` (the metadata-server preemption notice).
Importing this package imports no Google library.
"""
