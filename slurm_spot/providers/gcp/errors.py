"""Compute Engine error codes as data: which :class:`ErrorClass` each code means, and which of
several codes in one operation decides.

Codes come from two places (GCE REST reference, ``Operation`` and "Handling API errors"):

- ``operation.error.errors[*].code`` of a zone/region operation that ended with an error
  (``ZONE_RESOURCE_POOL_EXHAUSTED``, ``QUOTA_EXCEEDED``, ``VM_MIN_COUNT_NOT_REACHED`` ...); a
  capacity error may carry ``errorDetails[*].errorInfo.metadatas.zone`` / ``.vmType``;
- ``error.errors[*].reason`` of an HTTP error response (``rateLimitExceeded``,
  ``quotaExceeded``, ``notFound`` ...).

Codes compare case-insensitively and without separators (:func:`normalize_code`), so
``QUOTA_EXCEEDED`` and ``quotaExceeded`` are one row. Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from slurm_spot.providers.base import ErrorClass, classify, normalize_code

#: Code -> class. Unlisted codes are ErrorClass.UNKNOWN (tests/data/cloud-errors.yaml, part gcp).
GCP_ERROR_CLASSES: Mapping[str, ErrorClass] = {
    # capacity: this (machine type, zone, market) has none now -> next zone / type / market
    "ZONE_RESOURCE_POOL_EXHAUSTED": ErrorClass.CAPACITY,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": ErrorClass.CAPACITY,
    "STOCKOUT": ErrorClass.CAPACITY,
    "VM_MIN_COUNT_NOT_REACHED": ErrorClass.CAPACITY,
    "POOL_COOLDOWN": ErrorClass.CAPACITY,  # slurm-spot's own: every pool is cooling down
    # quota: regional limits; other zones do not help
    "QUOTA_EXCEEDED": ErrorClass.QUOTA,
    # throttle: retry the same request later
    "RATE_LIMIT_EXCEEDED": ErrorClass.THROTTLE,
    "USER_RATE_LIMIT_EXCEEDED": ErrorClass.THROTTLE,
    # config: the request is wrong; stop until the config changes
    "INVALID": ErrorClass.CONFIG,
    "BAD_REQUEST": ErrorClass.CONFIG,
    "REQUIRED": ErrorClass.CONFIG,
    "NOT_FOUND": ErrorClass.CONFIG,
    "RESOURCE_NOT_FOUND": ErrorClass.CONFIG,
    "INVALID_FIELD_VALUE": ErrorClass.CONFIG,
    "INVALID_INSTANCE_NAME": ErrorClass.CONFIG,  # slurm-spot's own: cluster-node > 63 chars
    # auth: credentials or permissions
    "FORBIDDEN": ErrorClass.AUTH,
    "UNAUTHORIZED": ErrorClass.AUTH,
    "AUTH_ERROR": ErrorClass.AUTH,
    "ACCESS_NOT_CONFIGURED": ErrorClass.AUTH,
    "INSUFFICIENT_PERMISSIONS": ErrorClass.AUTH,
}

#: Codes that only say "something else went wrong" and lose to any other code of the same
#: operation: ``[VM_MIN_COUNT_NOT_REACHED, QUOTA_EXCEEDED]`` is a quota error.
GENERIC_CODES: frozenset[str] = frozenset({"VM_MIN_COUNT_NOT_REACHED"})

#: Codes that are not a failure: the instance already exists (an idempotent re-run).
EXISTS_CODES: frozenset[str] = frozenset({"RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS"})

_GENERIC = {normalize_code(c) for c in GENERIC_CODES}
_EXISTS = {normalize_code(c) for c in EXISTS_CODES}


@dataclass(frozen=True)
class GceError:
    """One entry of ``operation.error.errors`` or of an HTTP error's ``error.errors``.

    Attributes:
        code: the code as GCE sent it (``ZONE_RESOURCE_POOL_EXHAUSTED``, ``rateLimitExceeded``).
        message: its human-readable message ("" if none).
        zone: ``errorInfo.metadatas.zone`` of a capacity error, or None.
        vm_type: ``errorInfo.metadatas.vmType``, or None.
    """

    code: str
    message: str = ""
    zone: str | None = None
    vm_type: str | None = None

    @property
    def error_class(self) -> ErrorClass:
        """The class of :attr:`code` (UNKNOWN when unlisted)."""
        return classify_gcp(self.code)

    @property
    def is_exists(self) -> bool:
        """True for ``RESOURCE_ALREADY_EXISTS``: fine on a re-run, not a failure."""
        return normalize_code(self.code) in _EXISTS


def classify_gcp(code: str) -> ErrorClass:
    """The :class:`ErrorClass` of one GCE code, in any spelling; UNKNOWN if unlisted."""
    return classify(code, GCP_ERROR_CLASSES)


def specificity(code: str) -> int:
    """How much a code says: 0 for generic codes, 1 for unlisted ones, 2 for listed ones."""
    normalized = normalize_code(code)
    if normalized in _GENERIC:
        return 0
    return 1 if classify_gcp(code) is ErrorClass.UNKNOWN else 2


def most_specific(errors: Iterable[GceError]) -> GceError | None:
    """The error that decides what to do next among several of one operation, ignoring
    ``RESOURCE_ALREADY_EXISTS``; the first one wins a tie. None if no failure is left."""
    best: GceError | None = None
    for error in errors:
        if error.is_exists:
            continue
        if best is None or specificity(error.code) > specificity(best.code):
            best = error
    return best


def errors_from_resource(error: Mapping[str, object] | None) -> tuple[GceError, ...]:
    """Parse an ``Operation.error`` (``{"errors": [{"code", "message", "errorDetails"}]}``)
    or an HTTP ``error`` body (``{"errors": [{"reason", "message"}]}``) as REST JSON."""
    if not error:
        return ()
    items = error.get("errors") or []
    parsed = []
    for item in items if isinstance(items, Sequence) else []:
        if not isinstance(item, Mapping):
            continue
        code = str(item.get("code") or item.get("reason") or "UNKNOWN")
        zone, vm_type = _error_info(item.get("errorDetails"))
        parsed.append(GceError(code, str(item.get("message") or ""), zone, vm_type))
    return tuple(parsed)


def _error_info(details: object) -> tuple[str | None, str | None]:
    if not isinstance(details, Sequence):
        return None, None
    for detail in details:
        info = detail.get("errorInfo") if isinstance(detail, Mapping) else None
        metadatas = info.get("metadatas") if isinstance(info, Mapping) else None
        if isinstance(metadatas, Mapping):
            zone, vm_type = metadatas.get("zone"), metadatas.get("vmType")
            return (str(zone) if zone else None), (str(vm_type) if vm_type else None)
    return None, None
