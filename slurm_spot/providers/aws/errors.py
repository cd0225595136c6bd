"""EC2 error codes and what slurm-spot does about each (the ``aws`` field cases,
tests/data/cloud-errors.yaml).

The table is data: code -> (:class:`~slurm_spot.providers.base.ErrorClass`, :class:`Scope`).
Codes are compared with :func:`~slurm_spot.providers.base.normalize_code` (case and separators
ignored), never by looking into the message text. A code missing from the table is UNKNOWN.

Where the codes come from: "Error codes for the Amazon EC2 API"
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html) and the
``Errors[].ErrorCode`` of a CreateFleet response of type ``instant``
(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateFleetError.html).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from slurm_spot.providers.base import ErrorClass, normalize_code


class Scope(str, enum.Enum):
    """How far an error reaches, i.e. what is pointless to retry.

    POOL: one instance type in one zone and market; ZONE: every type in a zone; MARKET: the spot
    (or on-demand) market of the region; REGION: everything in the region (quotas); REQUEST: this
    request as written (config); GLOBAL: everything (credentials, unknown).
    """

    POOL = "pool"
    ZONE = "zone"
    MARKET = "market"
    REGION = "region"
    REQUEST = "request"
    GLOBAL = "global"


@dataclass(frozen=True)
class ErrorKind:
    """The class and scope of one EC2 error code."""

    error_class: ErrorClass
    scope: Scope


_C, _Q, _F, _T, _A = (
    ErrorClass.CAPACITY, ErrorClass.QUOTA, ErrorClass.CONFIG, ErrorClass.THROTTLE, ErrorClass.AUTH,
)

#: EC2 error code -> kind. The first six rows are the cases file; the rest are documented EC2
#: codes that reach a launch in practice.
ERROR_TABLE: Mapping[str, ErrorKind] = {
    # tests/data/cloud-errors.yaml (aws)
    "InsufficientInstanceCapacity": ErrorKind(_C, Scope.POOL),
    "InsufficientHostCapacity": ErrorKind(_C, Scope.POOL),
    "SpotMaxPriceTooLow": ErrorKind(_F, Scope.REQUEST),
    "VcpuLimitExceeded": ErrorKind(_Q, Scope.REGION),
    "MaxSpotInstanceCountExceeded": ErrorKind(_Q, Scope.REGION),
    "RequestLimitExceeded": ErrorKind(_T, Scope.GLOBAL),
    # capacity of one pool or zone
    "InsufficientCapacity": ErrorKind(_C, Scope.POOL),
    "InsufficientReservedInstanceCapacity": ErrorKind(_C, Scope.POOL),
    "UnfulfillableCapacity": ErrorKind(_C, Scope.POOL),
    # the instance type is not offered in that zone: remembered, never capacity
    "Unsupported": ErrorKind(ErrorClass.PERMANENT, Scope.POOL),
    "InsufficientFreeAddressesInSubnet": ErrorKind(_C, Scope.ZONE),
    "Server.InsufficientInstanceCapacity": ErrorKind(_C, Scope.POOL),  # a StateReason code
    # quotas (regional)
    "InstanceLimitExceeded": ErrorKind(_Q, Scope.REGION),
    "MaxFleetCountExceeded": ErrorKind(_Q, Scope.REGION),
    "ResourceLimitExceeded": ErrorKind(_Q, Scope.REGION),
    "VolumeLimitExceeded": ErrorKind(_Q, Scope.REGION),
    # the request as written
    "InvalidParameterValue": ErrorKind(_F, Scope.REQUEST),
    "InvalidParameter": ErrorKind(_F, Scope.REQUEST),
    "InvalidParameterCombination": ErrorKind(_F, Scope.REQUEST),
    "MissingParameter": ErrorKind(_F, Scope.REQUEST),
    "InvalidLaunchTemplateName.NotFoundException": ErrorKind(_F, Scope.REQUEST),
    "InvalidLaunchTemplateName.MalformedException": ErrorKind(_F, Scope.REQUEST),
    "InvalidLaunchTemplateId.NotFound": ErrorKind(_F, Scope.REQUEST),
    "InvalidLaunchTemplateId.Malformed": ErrorKind(_F, Scope.REQUEST),
    "InvalidLaunchTemplateId.VersionNotFound": ErrorKind(_F, Scope.REQUEST),
    "InvalidSubnetID.NotFound": ErrorKind(_F, Scope.REQUEST),
    "InvalidAMIID.NotFound": ErrorKind(_F, Scope.REQUEST),
    "InvalidKeyPair.NotFound": ErrorKind(_F, Scope.REQUEST),
    "InvalidGroup.NotFound": ErrorKind(_F, Scope.REQUEST),
    "InvalidInstanceType": ErrorKind(_F, Scope.REQUEST),
    "IdempotentParameterMismatch": ErrorKind(_F, Scope.REQUEST),
    # transient: retry the same request
    "Throttling": ErrorKind(_T, Scope.GLOBAL),
    "ThrottlingException": ErrorKind(_T, Scope.GLOBAL),
    "RequestThrottled": ErrorKind(_T, Scope.GLOBAL),
    "ServiceUnavailable": ErrorKind(_T, Scope.GLOBAL),
    "Unavailable": ErrorKind(_T, Scope.GLOBAL),
    # credentials and permissions
    "UnauthorizedOperation": ErrorKind(_A, Scope.GLOBAL),
    "AuthFailure": ErrorKind(_A, Scope.GLOBAL),
    "Blocked": ErrorKind(_A, Scope.GLOBAL),
    "OptInRequired": ErrorKind(_A, Scope.GLOBAL),
    "PendingVerification": ErrorKind(_A, Scope.GLOBAL),
    "InvalidClientTokenId": ErrorKind(_A, Scope.GLOBAL),
    "ExpiredToken": ErrorKind(_A, Scope.GLOBAL),
    "RequestExpired": ErrorKind(_A, Scope.GLOBAL),
    "SignatureDoesNotMatch": ErrorKind(_A, Scope.GLOBAL),
    "AccessDenied": ErrorKind(_A, Scope.GLOBAL),
    # slurm-spot's own codes (not EC2's), for problems found before any call
    "NoCredentials": ErrorKind(_A, Scope.GLOBAL),  # botocore NoCredentialsError
    "UnsupportedInterruptionBehavior": ErrorKind(_F, Scope.REQUEST),
    "NoInstanceTypes": ErrorKind(_F, Scope.REQUEST),
    "UnknownNode": ErrorKind(_F, Scope.REQUEST),
    "MissingAwsSettings": ErrorKind(_F, Scope.REQUEST),
    "PoolCooldown": ErrorKind(_C, Scope.POOL),  # every pool had no capacity a moment ago
}

_NORMALIZED: dict[str, ErrorKind] = {normalize_code(k): v for k, v in ERROR_TABLE.items()}
_UNKNOWN = ErrorKind(ErrorClass.UNKNOWN, Scope.GLOBAL)

#: CreateFleet adds this entry to point at the real error of another override; it is never the
#: cause itself (ParallelCluster's FleetManager ignores it the same way).
POINTER_CODE = "UnfulfillableCapacity"

#: When several errors come back for one request, the first class in this order decides.
PRECEDENCE: tuple[ErrorClass, ...] = (
    ErrorClass.AUTH, ErrorClass.CONFIG, ErrorClass.QUOTA, ErrorClass.CAPACITY,
    ErrorClass.PERMANENT, ErrorClass.THROTTLE, ErrorClass.UNKNOWN,
)




def error_kind(code: str) -> ErrorKind:
    """The kind of EC2 error ``code`` (any spelling); UNKNOWN/GLOBAL if it is not in the table."""
    return _NORMALIZED.get(normalize_code(code), _UNKNOWN)


@dataclass(frozen=True)
class FleetError:
    """One EC2 error, from a whole-call failure or a CreateFleet ``Errors`` entry.

    Attributes:
        code: EC2's code as sent (``InsufficientInstanceCapacity``).
        message: EC2's message, whitespace-collapsed (never parsed).
        instance_type: the override's instance type, "" for a whole-call error.
        subnet: the override's subnet id, "" for a whole-call error.
        market: ``spot`` or ``on-demand`` (CreateFleet ``Lifecycle``), "" if not given.
    """

    code: str
    message: str
    instance_type: str = ""
    subnet: str = ""
    market: str = ""

    @property
    def kind(self) -> ErrorKind:
        """Class and scope from :data:`ERROR_TABLE`."""
        return error_kind(self.code)

    @property
    def error_class(self) -> ErrorClass:
        """Shortcut for ``kind.error_class``."""
        return self.kind.error_class

    @property
    def is_pointer(self) -> bool:
        """True for the ``UnfulfillableCapacity`` entry that only points at another error."""
        return normalize_code(self.code) == normalize_code(POINTER_CODE)


def from_client_error(exc: Any) -> FleetError:
    """A :class:`FleetError` from a ``botocore.exceptions.ClientError`` (a whole-call failure).

    Reads ``exc.response["Error"]["Code"|"Message"]`` (botocore's parsed EC2 XML error).
    """
    error = getattr(exc, "response", {}).get("Error", {})
    message = " ".join(str(error.get("Message", "")).split())
    return FleetError(str(error.get("Code") or "Unknown"), message)


def fleet_errors(response: Mapping[str, Any]) -> list[FleetError]:
    """The ``Errors`` of a CreateFleet (instant) response as records.

    Pointer entries (``UnfulfillableCapacity``) are dropped unless nothing else came back.
    See the EC2 API reference, CreateFleetError.
    """
    errors = []
    for entry in response.get("Errors") or []:
        overrides = (entry.get("LaunchTemplateAndOverrides") or {}).get("Overrides") or {}
        errors.append(
            FleetError(
                code=str(entry.get("ErrorCode") or "Unknown"),
                message=" ".join(str(entry.get("ErrorMessage") or "").split()),
                instance_type=str(overrides.get("InstanceType") or ""),
                subnet=str(overrides.get("SubnetId") or ""),
                market=str(entry.get("Lifecycle") or ""),
            )
        )
    real = [e for e in errors if not e.is_pointer]
    return real or errors


def decisive(errors: Iterable[FleetError]) -> FleetError | None:
    """The error that decides the next step: the first by :data:`PRECEDENCE`, else None."""
    ranked = sorted(errors, key=lambda e: PRECEDENCE.index(e.error_class))
    return ranked[0] if ranked else None
