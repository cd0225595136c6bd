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

A machine type or accelerator type that a zone does not offer has no code of its own: GCE
answers the request with the generic "bad resource" codes (HTTP 400 ``invalid``: "Invalid value
for field 'resource.machineType': 'zones/europe-west8-a/machineTypes/f1-micro'. Machine type
with name 'f1-micro' does not exist in zone 'europe-west8-a'."; HTTP 404 ``notFound``: "The
resource 'projects/P/zones/us-west1-b/acceleratorTypes/nvidia-tesla-p4' was not found"; both
as reported from the field, docs/testing-clouds.md). The class still comes from the code
(:data:`NOT_OFFERED_CODES`); what the error is about, the zonal resource it names
(:data:`OFFERING_COLLECTIONS`), is read from the resource reference GCE puts only in the
message. Such an error is PERMANENT for that (type, zone) pair, remembered and never tried
again (:class:`~slurm_spot.providers.ledger.UnofferedPairs`), and never capacity; any other
``invalid``/``notFound`` stays CONFIG.
"""

from __future__ import annotations

import re
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
    # permanent: the (machine or accelerator type, zone) pair is not offered. GCE's own
    # answer is a NOT_OFFERED_CODES code naming the type's zonal resource (see the module
    # docstring); this row is slurm-spot's own code for a launch whose every pair is
    # remembered as not offered, so nothing was asked.
    "TYPE_NOT_OFFERED": ErrorClass.PERMANENT,
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

#: Codes GCE answers for a request naming a resource that does not exist. Naming a zone's
#: machine type or accelerator type (:data:`OFFERING_COLLECTIONS`), they mean "this type is
#: not offered in this zone": PERMANENT for that pair instead of CONFIG.
NOT_OFFERED_CODES: frozenset[str] = frozenset(
    {"INVALID", "NOT_FOUND", "RESOURCE_NOT_FOUND", "INVALID_FIELD_VALUE"})

#: Zonal resource collections (``zones/<zone>/<collection>/<type>``) whose absence means the
#: type is not offered in that zone; the value is the word GCE's messages use for each.
OFFERING_COLLECTIONS: Mapping[str, str] = {"machineTypes": "Machine", "acceleratorTypes": "Accelerator"}

_GENERIC = {normalize_code(c) for c in GENERIC_CODES}
_NOT_OFFERED = {normalize_code(c) for c in NOT_OFFERED_CODES}
_NAME = r"[a-z0-9][a-z0-9-]*"
# zones/<zone>/machineTypes/<type> (a full or partial resource URL) ...
_RESOURCE_PATH = re.compile(
    rf"zones/(?P<zone>{_NAME})/(?:{'|'.join(OFFERING_COLLECTIONS)})/(?P<type>{_NAME})")
# ... or, where the request gave a bare type name: "Machine type with name 'T' does not exist
# in zone 'Z'" (the form of HTTP 400 ``invalid``).
_RESOURCE_SENTENCE = re.compile(
    rf"(?:{'|'.join(OFFERING_COLLECTIONS.values())}) type (?:with name )?'(?P<type>{_NAME})'"
    rf" does not exist in zone '(?P<zone>{_NAME})'")
_EXISTS = {normalize_code(c) for c in EXISTS_CODES}


@dataclass(frozen=True)
class GceError:
    """One entry of ``operation.error.errors`` or of an HTTP error's ``error.errors``.

    Attributes:
        code: the code as GCE sent it (``ZONE_RESOURCE_POOL_EXHAUSTED``, ``rateLimitExceeded``).
        message: its human-readable message ("" if none).
        zone: the zone the error is about: ``errorInfo.metadatas.zone`` of a capacity error,
            or the zone of the type resource a not-offered error names; else None.
        vm_type: ``errorInfo.metadatas.vmType``, or None.
        not_offered: the machine or accelerator type a :data:`NOT_OFFERED_CODES` error names
            as missing from :attr:`zone` (``a2-highgpu-1g``, ``nvidia-tesla-t4``), else None.
    """

    code: str
    message: str = ""
    zone: str | None = None
    vm_type: str | None = None
    not_offered: str | None = None

    @property
    def error_class(self) -> ErrorClass:
        """The class of :attr:`code` (UNKNOWN when unlisted); PERMANENT for a not-offered
        (type, zone) pair (:attr:`not_offered`)."""
        if self.not_offered is not None:
            return ErrorClass.PERMANENT
        return classify_gcp(self.code)

    @property
    def pair(self) -> tuple[str, str] | None:
        """``(type, zone)`` that is not offered, when this error says so and names the zone."""
        if self.not_offered is None or self.zone is None:
            return None
        return self.not_offered, self.zone

    @property
    def is_exists(self) -> bool:
        """True for ``RESOURCE_ALREADY_EXISTS``: fine on a re-run, not a failure."""
        return normalize_code(self.code) in _EXISTS


def not_offered_resource(code: str, message: str) -> tuple[str, str] | None:
    """``(type, zone)`` when ``code`` is one of :data:`NOT_OFFERED_CODES` and ``message`` names
    a zone's machine type or accelerator type (see the module docstring); else None."""
    if normalize_code(code) not in _NOT_OFFERED:
        return None
    found = _RESOURCE_PATH.search(message) or _RESOURCE_SENTENCE.search(message)
    return (found.group("type"), found.group("zone")) if found else None


def gce_error(code: str, message: str = "", zone: str | None = None,
              vm_type: str | None = None) -> GceError:
    """A :class:`GceError`, with :attr:`~GceError.not_offered` and its zone filled in when the
    error says a type is not offered in a zone (:func:`not_offered_resource`)."""
    pair = not_offered_resource(code, message)
    if pair is None:
        return GceError(code, message, zone, vm_type)
    return GceError(code, message, pair[1], vm_type, not_offered=pair[0])


#: GCE states a quota's size only in the message of ``QUOTA_EXCEEDED`` ("Quota 'CPUS'
#: exceeded.  Limit: 24.0 in region us-central1."; "Quota 'NVIDIA_A100_GPUS' exceeded.
#: Limit: 8.0 in region us-central1.", GCE "Resource quotas", errors of bulkInsert): the
#: metric and the number are read from it, the class never (it comes from the code).
_QUOTA_SENTENCE = re.compile(
    r"Quota '(?P<metric>[A-Z0-9_]+)' exceeded\.\s+Limit: (?P<limit>\d+)(?:\.\d+)?")


@dataclass(frozen=True)
class QuotaLimit:
    """A GCE quota a ``QUOTA_EXCEEDED`` error names: ``metric`` (``CPUS``, ``N2_CPUS``,
    ``PREEMPTIBLE_NVIDIA_A100_GPUS``, ``INSTANCES``) and ``limit`` in the metric's unit."""

    metric: str
    limit: int

    @property
    def unit(self) -> str:
        """``vCPU`` for a CPU metric, ``GPU`` for a GPU metric, ``instance`` for INSTANCES,
        else "" (a metric slurm-spot cannot size a node in)."""
        if self.metric == "CPUS" or self.metric.endswith("_CPUS"):
            return "vCPU"
        if self.metric.endswith("_GPUS"):
            return "GPU"
        return "instance" if self.metric == "INSTANCES" else ""


def quota_limit(error: GceError) -> QuotaLimit | None:
    """The quota a QUOTA-class error names with its limit (:data:`_QUOTA_SENTENCE`), else
    None (another class, or a message without the sentence). Pure."""
    if error.error_class is not ErrorClass.QUOTA:
        return None
    found = _QUOTA_SENTENCE.search(error.message)
    return QuotaLimit(found.group("metric"), int(found.group("limit"))) if found else None


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
        parsed.append(gce_error(code, str(item.get("message") or ""), zone, vm_type))
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
