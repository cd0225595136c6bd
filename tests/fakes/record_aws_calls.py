"""A pytest plugin that records the AWS API calls slurm-spot's own code makes during a run:
``pytest -p tests.fakes.record_aws_calls ...`` with ``SLURM_SPOT_RECORD_AWS_CALLS=<file>``
writes ``[[service, operation], ...]`` (botocore names: ``["ec2", "CreateFleet"]``) there at
the end. Used by tests/test_config_iam.py to check that ``config iam`` covers them.

Every botocore client call goes through ``BaseClient._make_api_call``; a call counts as
slurm-spot's when a frame of the ``slurm_spot`` package is on its stack, or when boto3's
transfer manager (s3transfer) makes it from its worker threads (only the S3 checkpoint store
uses it). Calls a test makes itself to set moto up (``create_vpc``) are left out.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from botocore.client import BaseClient

_PACKAGE = str(Path(__file__).resolve().parents[2] / "slurm_spot")
_original = BaseClient._make_api_call
CALLS: set[tuple[str, str]] = set()


def _ours() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE) or f"{os.sep}s3transfer{os.sep}" in name:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _recording(self: Any, operation_name: str, api_params: Any) -> Any:
    if _ours():
        CALLS.add((self.meta.service_model.service_name, operation_name))
    return _original(self, operation_name, api_params)


def pytest_configure(config: Any) -> None:
    BaseClient._make_api_call = _recording  # type: ignore[method-assign]


def pytest_unconfigure(config: Any) -> None:
    BaseClient._make_api_call = _original  # type: ignore[method-assign]
    out = os.environ.get("SLURM_SPOT_RECORD_AWS_CALLS")
    if out:
        Path(out).write_text(json.dumps(sorted(CALLS)))
