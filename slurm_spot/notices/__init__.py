"""Interruption-notice sources read by ``slurm-spot watch`` on a compute node.

Each source implements :class:`slurm_spot.notices.base.NoticeSource`. :func:`source_for`
picks the one for a provider type, importing only what that provider needs.
"""
