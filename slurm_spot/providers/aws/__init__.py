"""The ``aws`` provider: EC2 spot instances through ``create_fleet`` (type ``instant``).

Modules: :mod:`.provider` (the :class:`~slurm_spot.providers.base.Provider`), :mod:`.launch`
and :mod:`.fleet` (the launch plan and its I/O seam), :mod:`.errors` (the error-code table),
:mod:`.catalog` (instance shapes, ``instance_types.yaml``), :mod:`.checks` (config checks),
:mod:`.notices` (the IMDSv2 interruption notice). Importing this package imports no boto3.
"""
