"""The IAM permissions slurm-spot's AWS calls need, as data, and the policies built from them.

:data:`CALLS` lists every AWS API operation the package makes (boto3 clients of
:mod:`.provider`, :mod:`.prices`, :mod:`.online`, :mod:`.catalog`, :mod:`.events`
and the S3 checkpoint store :mod:`slurm_spot.checkpoint.s3` / :mod:`~slurm_spot.checkpoint.s3inflight`),
by botocore's operation name, with the IAM actions it needs and who makes it:

- ``controller``: the resume/suspend hooks, the reconciler, ``plan``/``cost`` and
  ``config check --online``, on the Slurm controller;
- ``node``: ``slurm-spot watch`` on a compute node reads only the instance metadata service
  (IMDSv2), which needs no IAM action: its policy is empty unless the checkpoint store's is
  attached;
- ``store``: a job's checkpoints under an ``s3://`` root (the compute nodes' instance profile;
  the controller too, for ``cost``'s storage figures).

tests/test_config_iam.py records every call the AWS and S3 tests make and fails if one is not
in :data:`CALLS`, so a new call cannot ship without its permission. Action names and their
dependent actions: the Service Authorization Reference (Amazon EC2, Amazon S3, Service Quotas,
IAM) and the EC2 User Guide, "EC2 Fleet prerequisites" (CreateFleet also needs RunInstances,
CreateTags for its tag specifications, RequestSpotInstances for spot, the launch template read,
``iam:PassRole`` for the template's instance profile and, once per account, the EC2 Fleet and
Spot service-linked roles).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from slurm_spot.config import SpotConfig

Role = Literal["controller", "node", "store"]
ROLES: tuple[Role, ...] = ("controller", "node", "store")


@dataclass(frozen=True)
class ApiCall:
    """One AWS operation slurm-spot makes.

    Attributes:
        service: the botocore service name (``ec2``, ``s3``, ``service-quotas``, ``iam``, ``sts``).
        operation: botocore's operation name (``CreateFleet``; boto3's ``create_fleet``).
        actions: the IAM actions it needs (empty: none, as for ``sts:GetCallerIdentity``).
        role: who makes it (see the module docstring).
        optional: a check that is skipped with a warning when refused (``config check
            --online``); the rest are needed for slurm-spot to work.
    """

    service: str
    operation: str
    actions: tuple[str, ...]
    role: Role
    optional: bool = False


_FLEET = ("ec2:CreateFleet", "ec2:RunInstances", "ec2:CreateTags", "ec2:RequestSpotInstances",
          "ec2:DescribeLaunchTemplates", "ec2:DescribeLaunchTemplateVersions")

CALLS: tuple[ApiCall, ...] = (
    # launch, list, tag, terminate (providers/aws/provider.py, launch.py)
    ApiCall("ec2", "CreateFleet", _FLEET, "controller"),
    ApiCall("ec2", "DescribeInstances", ("ec2:DescribeInstances",), "controller"),
    ApiCall("ec2", "CreateTags", ("ec2:CreateTags",), "controller"),
    ApiCall("ec2", "TerminateInstances", ("ec2:TerminateInstances",), "controller"),
    ApiCall("ec2", "DescribeSubnets", ("ec2:DescribeSubnets",), "controller"),
    # the reconciler's EventBridge events, with providers.<name>.events_queue_url
    # (providers/aws/events.py)
    ApiCall("sqs", "ReceiveMessage", ("sqs:ReceiveMessage",), "controller"),
    ApiCall("sqs", "DeleteMessageBatch", ("sqs:DeleteMessage",), "controller"),
    # prices and shapes (providers/aws/prices.py, catalog.py)
    ApiCall("ec2", "DescribeSpotPriceHistory", ("ec2:DescribeSpotPriceHistory",), "controller"),
    # on-demand prices of a region the catalogue does not cover (plan, cost: prices.py)
    ApiCall("pricing", "GetProducts", ("pricing:GetProducts",), "controller"),
    ApiCall("ec2", "DescribeInstanceTypes", ("ec2:DescribeInstanceTypes",), "controller"),
    # config check --online (providers/aws/online.py)
    ApiCall("ec2", "DescribeLaunchTemplates", ("ec2:DescribeLaunchTemplates",), "controller"),
    ApiCall("ec2", "DescribeLaunchTemplateVersions", ("ec2:DescribeLaunchTemplateVersions",),
            "controller"),
    ApiCall("ec2", "DescribeInstanceTypeOfferings", ("ec2:DescribeInstanceTypeOfferings",),
            "controller"),
    ApiCall("service-quotas", "GetServiceQuota", ("servicequotas:GetServiceQuota",),
            "controller", optional=True),
    ApiCall("sts", "GetCallerIdentity", (), "controller"),
    ApiCall("iam", "SimulatePrincipalPolicy", ("iam:SimulatePrincipalPolicy",), "controller",
            optional=True),
    ApiCall("iam", "GetRole", ("iam:GetRole",), "controller", optional=True),
    # the checkpoint store (checkpoint/s3.py, s3inflight.py; boto3's transfer manager for
    # upload_file/download_file: multipart for large files)
    ApiCall("s3", "ListObjectsV2", ("s3:ListBucket",), "store"),
    ApiCall("s3", "ListMultipartUploads", ("s3:ListBucketMultipartUploads",), "store"),
    ApiCall("s3", "GetObject", ("s3:GetObject",), "store"),
    ApiCall("s3", "HeadObject", ("s3:GetObject",), "store"),
    ApiCall("s3", "PutObject", ("s3:PutObject",), "store"),
    ApiCall("s3", "CopyObject", ("s3:GetObject", "s3:PutObject"), "store"),
    ApiCall("s3", "DeleteObject", ("s3:DeleteObject",), "store"),
    ApiCall("s3", "DeleteObjects", ("s3:DeleteObject",), "store"),
    ApiCall("s3", "CreateMultipartUpload", ("s3:PutObject",), "store"),
    ApiCall("s3", "UploadPart", ("s3:PutObject",), "store"),
    ApiCall("s3", "CompleteMultipartUpload", ("s3:PutObject",), "store"),
    ApiCall("s3", "AbortMultipartUpload", ("s3:AbortMultipartUpload",), "store"),
)

#: Actions whose resource is the bucket, not its objects (Service Authorization Reference, S3).
_BUCKET_ACTIONS = {"s3:ListBucket", "s3:ListBucketMultipartUploads"}


def call(service: str, operation: str) -> ApiCall | None:
    """The :data:`CALLS` entry of ``service``/``operation`` (botocore names), or None."""
    return next((c for c in CALLS if (c.service, c.operation) == (service, operation)), None)


def actions(role: Role, include_optional: bool = True) -> list[str]:
    """The IAM actions of ``role``'s calls, sorted, each once."""
    return sorted({a for c in CALLS if c.role == role and (include_optional or not c.optional)
                   for a in c.actions})


def policies(config: SpotConfig | None = None) -> dict[str, dict[str, Any]]:
    """The IAM policy documents (``Version`` 2012-10-17): ``controller`` (for the
    controller's role or user) and ``store`` (the checkpoint store: for the compute nodes'
    instance profile, and the controller's for ``cost``). The nodes need nothing else
    (``node`` calls: none).

    The controller's EC2 actions cannot be narrowed by resource usefully (Describe* take no
    resource), so they apply to ``*``; ``iam:PassRole`` is limited to roles passed to EC2 and
    service-linked roles to the EC2 Fleet and Spot services. With ``config`` and an ``s3://``
    checkpoint root, the store's actions are limited to that bucket and prefix; without, to
    every bucket (``arn:aws:s3:::*``) for the admin to narrow.
    """
    controller = [
        _statement("SlurmSpotEc2", [a for a in actions("controller") if a.startswith("ec2:")],
                   ["*"]),
        _statement("SlurmSpotChecks",
                   [a for a in actions("controller") if not a.startswith(("ec2:", "iam:"))]
                   + [a for a in actions("controller") if a.startswith("iam:")], ["*"]),
        _statement("SlurmSpotPassRoleToInstances", ["iam:PassRole"], ["*"],
                   {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}),
        _statement("SlurmSpotFleetServiceLinkedRoles", ["iam:CreateServiceLinkedRole"], ["*"],
                   {"StringEquals": {"iam:AWSServiceName": ["ec2fleet.amazonaws.com",
                                                            "spot.amazonaws.com"]}}),
    ]
    bucket, prefix = _store_location(config)
    objects = f"arn:aws:s3:::{bucket}/{prefix}*"
    store_actions = actions("store")
    store = [
        _statement("SlurmSpotCheckpointBucket", [a for a in store_actions if a in _BUCKET_ACTIONS],
                   [f"arn:aws:s3:::{bucket}"],
                   {"StringLike": {"s3:prefix": [f"{prefix}*"]}} if prefix else None),
        _statement("SlurmSpotCheckpointObjects",
                   [a for a in store_actions if a not in _BUCKET_ACTIONS], [objects]),
    ]
    return {"controller": _document(controller), "store": _document(store)}


def covers(policy_actions: Iterable[str], needed: Iterable[str]) -> list[str]:
    """The actions of ``needed`` that ``policy_actions`` (which may hold ``service:*``) lack."""
    granted = {a.lower() for a in policy_actions}
    return [a for a in needed
            if a.lower() not in granted and f"{a.split(':')[0].lower()}:*" not in granted]


def policy_actions(document: Mapping[str, Any]) -> list[str]:
    """Every action an Allow statement of ``document`` names."""
    found: list[str] = []
    for statement in document.get("Statement", []):
        if statement.get("Effect") == "Allow":
            named = statement.get("Action", [])
            found.extend([named] if isinstance(named, str) else named)
    return found


def _statement(sid: str, names: list[str], resources: list[str],
               condition: dict[str, Any] | None = None) -> dict[str, Any]:
    statement: dict[str, Any] = {"Sid": sid, "Effect": "Allow", "Action": sorted(set(names)),
                                 "Resource": resources}
    if condition:
        statement["Condition"] = condition
    return statement


def _document(statements: list[dict[str, Any]]) -> dict[str, Any]:
    return {"Version": "2012-10-17", "Statement": statements}


def _store_location(config: SpotConfig | None) -> tuple[str, str]:
    """(bucket, key prefix ending in ``/`` or "") of an ``s3://`` checkpoint root, as the S3
    store reads it (:func:`slurm_spot.contract.location.parse_s3_url`: percent-escapes decoded);
    ``*`` and "" without one."""
    if config is None or not config.checkpoint.is_s3:
        return "*", ""
    from slurm_spot.contract.location import parse_s3_url

    return parse_s3_url(str(config.checkpoint.root))


def grants(config: SpotConfig) -> dict[str, dict[str, object]]:
    """What ``config iam`` prints for an ``aws`` provider: for the controller, the checkpoint
    store and the nodes, where to attach (``attach``) which policy document (``policy``,
    None: nothing to attach), from :func:`policies`."""
    documents = policies(config)
    store = ("the compute nodes' instance profile (jobs write their checkpoints) and the "
             "controller's role (cost reads them)" if config.checkpoint.is_s3 else
             "only if a job uses an s3:// checkpoint root (--checkpoint-root): the compute "
             "nodes' instance profile, narrowed to that bucket")
    return {
        "controller": {"attach": "the controller's IAM role or user (the hooks, the "
                       "reconciler, config check --online)", "policy": documents["controller"]},
        "checkpoint_store": {"attach": store, "policy": documents["store"]},
        "nodes": {"attach": "the compute nodes need nothing else (the watcher reads only the "
                  "instance metadata service)", "policy": None},
    }
