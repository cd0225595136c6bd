"""The one boto3 session builder of the ``aws`` provider: the provider's EC2 clients, its
prices (:mod:`.prices`), ``config check --online`` (:mod:`.online`) and the EventBridge/SQS
events (:mod:`.events`) all get their session here, so ``profile`` and ``credentials_file``
mean the same everywhere (:data:`.iam.CALLS` lists what those clients call). boto3 is
imported on first call only.
"""

from __future__ import annotations

from typing import Any

from slurm_spot.config import AwsProviderConfig


def boto_session(settings: AwsProviderConfig) -> Any:
    """A ``boto3.session.Session`` for ``settings``: region, ``profile``, and
    ``credentials_file`` in place of ``~/.aws/credentials`` when set (slurmctld runs the hooks
    with an empty environment, so ``AWS_SHARED_CREDENTIALS_FILE`` cannot reach them). The
    rest of boto3's credential chain is unchanged.

    Raises:
        botocore.exceptions.ProfileNotFound: ``profile`` is in no credentials or config file.
    """
    import boto3
    import botocore.session

    core = botocore.session.Session()
    if settings.credentials_file is not None:
        core.set_config_variable("credentials_file", str(settings.credentials_file))
    return boto3.session.Session(
        botocore_session=core, profile_name=settings.profile, region_name=settings.region
    )
