"""The only code that touches google-cloud-compute: a thin adapter whose methods take and
return REST JSON dicts and typed records, never SDK objects.

The library is imported when a :class:`ComputeApi` is built (``google.cloud.compute_v1``
costs ~1.7 s). Traps of the library this adapter avoids (docs/testing-clouds.md):

- ``insert()`` / ``bulk_insert()`` poll the public endpoint whatever the client options say:
  the ``*_unary()`` calls are used and operations are waited on here
  (``zoneOperations.wait`` / ``regionOperations.wait``);
- an operation's errors are read from ``operation.error.errors[*].code`` (the library raises
  only when ``httpErrorStatusCode`` is set);
- get/list/wait retry 503s for 600 s by default: every call passes ``retry=`` and ``timeout=``.

Credentials: AnonymousCredentials when ``api_endpoint`` is a plain-http loopback URL (tests);
else ``credentials_file`` when set (a service-account key or an authorized-user file);
else Application Default Credentials. No credential material is ever logged.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from slurm_spot.config import GcpProviderConfig
from slurm_spot.errors import ProviderError
from slurm_spot.providers.gcp.errors import (
    GceError,
    errors_from_resource,
    gce_error,
    most_specific,
)
from slurm_spot.providers.gcp.requests import parse_timestamp, short_name

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
PAGE_SIZE = 500
T = TypeVar("T")


@dataclass(frozen=True)
class OperationStatus:
    """A zone or region operation (GCE ``Operation``) as far as slurm-spot needs it.

    Attributes:
        name: operation name.
        scope: ``zones/<zone>`` or ``regions/<region>``.
        done: status is DONE.
        errors: ``error.errors`` (empty when it succeeded or is still running).
        insert_time: when GCE accepted the request (aware UTC), or None.
    """

    name: str
    scope: str
    done: bool
    errors: tuple[GceError, ...] = ()
    insert_time: datetime | None = None


class GceCallError(ProviderError):
    """An API call failed at the HTTP level (or never reached the API).

    Attributes:
        http_status: the HTTP status, or None when the endpoint could not be reached.
        errors: the ``error.errors`` entries (``reason`` as code).
    """

    def __init__(self, http_status: int | None, errors: tuple[GceError, ...], message: str):
        self.http_status = http_status
        self.errors = errors
        best = most_specific(errors) or (errors[0] if errors else GceError("UNKNOWN", message))
        super().__init__(best.code, best.message or message, best.error_class.value)


def operation_from_resource(resource: Mapping[str, Any]) -> OperationStatus:
    """Parse an ``Operation`` (REST JSON) into an :class:`OperationStatus` (pure)."""
    scope = (f"zones/{short_name(resource['zone'])}" if resource.get("zone")
             else f"regions/{short_name(resource.get('region'))}")
    return OperationStatus(
        name=str(resource.get("name", "")),
        scope=scope,
        done=resource.get("status") == "DONE",
        errors=errors_from_resource(resource.get("error")),
        insert_time=parse_timestamp(resource.get("insertTime")),
    )


class ComputeApi:
    """Counted, bounded calls to the Compute Engine API of one project.

    Args:
        settings: project, region, ``api_endpoint`` and ``credentials_file``.
        call_timeout_s: HTTP timeout of each call, seconds.
        read_retry_s: how long reads (list, wait) retry 429/500/503, seconds.

    Raises:
        ProviderError: (``auth``) the credentials file cannot be read.
    """

    def __init__(self, settings: GcpProviderConfig, call_timeout_s: float = 30.0,
                 read_retry_s: float = 20.0) -> None:
        from google.api_core import exceptions, retry
        from google.api_core.client_options import ClientOptions
        from google.auth import exceptions as auth_errors
        from google.cloud import compute_v1

        self._v1 = compute_v1
        self._exceptions = exceptions
        self._auth_errors = auth_errors
        self.project = settings.project
        self.calls = 0
        self._count_lock = threading.Lock()  # deletes run from several threads
        self.call_timeout_s = call_timeout_s
        self._read_retry = retry.Retry(
            predicate=retry.if_exception_type(
                exceptions.ServiceUnavailable, exceptions.InternalServerError,
                exceptions.TooManyRequests),
            initial=0.5, maximum=4.0, multiplier=2.0, timeout=read_retry_s)
        kwargs: dict[str, Any] = {"transport": "rest", "credentials": _credentials(settings)}
        if settings.api_endpoint:
            kwargs["client_options"] = ClientOptions(api_endpoint=settings.api_endpoint)
        self._instances = compute_v1.InstancesClient(**kwargs)
        self._region_instances = compute_v1.RegionInstancesClient(**kwargs)
        self._zone_ops = compute_v1.ZoneOperationsClient(**kwargs)
        self._region_ops = compute_v1.RegionOperationsClient(**kwargs)
        for client in (self._instances, self._region_instances, self._zone_ops,
                       self._region_ops):
            _environment_once(client)

    def _call(self, fn: Callable[..., T], **kwargs: Any) -> T:
        with self._count_lock:
            self.calls += 1
        try:
            return fn(**kwargs)
        except self._exceptions.GoogleAPICallError as exc:
            raise _call_error(exc) from None
        except self._exceptions.RetryError as exc:
            raise GceCallError(None, (), f"gave up retrying: {exc.cause}") from None
        except self._auth_errors.GoogleAuthError as exc:
            raise _auth_refused(exc) from None
        except OSError as exc:  # requests' ConnectionError/Timeout derive from OSError
            raise _unreachable("the Compute API", exc) from None

    def _dict(self, message: Any) -> dict[str, Any]:
        """``message`` as its REST JSON object (camelCase keys, enums by name), as
        ``json.loads(to_json(message))`` gives it without the text in between: proto-plus's
        ``to_json`` indents, which makes ``json.dumps`` take its pure-Python encoder (~1 ms of
        CPU per listed instance, more than parsing the HTTP answer)."""
        return type(message).to_dict(
            message, use_integers_for_enums=False, preserving_proto_field_name=False)

    def bulk_insert(self, body: Mapping[str, Any], zone: str | None, region: str,
                    request_id: str) -> OperationStatus:
        """``instances.bulkInsert`` in ``zone``, or ``regionInstances.bulkInsert`` in ``region``
        when ``zone`` is None. Not retried here (the caller decides, reusing ``request_id``).

        Raises:
            GceCallError: the request was refused or the API was unreachable.
        """
        resource = self._v1.BulkInsertInstanceResource.from_json(json.dumps(body))
        common = {"project": self.project, "request_id": request_id,
                  "bulk_insert_instance_resource_resource": resource}
        if zone:
            request: Any = self._v1.BulkInsertInstanceRequest(zone=zone, **common)
            method: Callable[..., Any] = self._instances.bulk_insert_unary
        else:
            request = self._v1.BulkInsertRegionInstanceRequest(region=region, **common)
            method = self._region_instances.bulk_insert_unary
        op = self._call(method, request=request, retry=None, timeout=self.call_timeout_s)
        return operation_from_resource(self._dict(op))

    def wait(self, op: OperationStatus, timeout_s: float) -> OperationStatus:
        """One ``zoneOperations.wait`` / ``regionOperations.wait`` (returns when DONE or after
        at most ``timeout_s`` seconds, or GCE's own ~2 min).

        Raises:
            GceCallError: the wait call itself failed.
        """
        kind, where = op.scope.split("/", 1)
        client, key = (self._zone_ops, "zone") if kind == "zones" else (self._region_ops, "region")
        result = self._call(client.wait, project=self.project, operation=op.name,
                            retry=self._read_retry, timeout=max(timeout_s, 1.0), **{key: where})
        return operation_from_resource(self._dict(result))

    def list_instances(self, filter_: str) -> list[dict[str, Any]]:
        """``instances.aggregatedList`` with ``filter_``, every page (one counted call each).

        Raises:
            GceCallError: a page could not be read.
        """
        request = self._v1.AggregatedListInstancesRequest(
            project=self.project, filter=filter_, max_results=PAGE_SIZE)
        return [instance for response in self._pages(self._instances.aggregated_list, request)
                for scoped in response.get("items", {}).values()
                for instance in scoped.get("instances", [])]

    def list_zone_operations(self, zone: str, filter_: str) -> list[dict[str, Any]]:
        """``zoneOperations.list`` in ``zone`` with ``filter_``, every page (one counted call
        each): the REST JSON of each operation.

        Raises:
            GceCallError: a page could not be read.
        """
        request = self._v1.ListZoneOperationsRequest(
            project=self.project, zone=zone, filter=filter_, max_results=PAGE_SIZE)
        return [op for response in self._pages(self._zone_ops.list, request)
                for op in response.get("items", [])]

    def _pages(self, list_call: Callable[..., Any], request: Any) -> list[dict[str, Any]]:
        """Every page of a list call (``list_call(request=request)``, a ``*List*Request`` whose
        ``page_token`` this sets), each the REST JSON of one response, one counted read call
        (retried as reads are) per page, until one has no ``nextPageToken``.

        Raises:
            GceCallError: a page could not be read (no page is returned then).
        """
        responses: list[dict[str, Any]] = []
        token = ""
        while True:
            request.page_token = token
            page = self._call(list_call, request=request,
                              retry=self._read_retry, timeout=self.call_timeout_s)
            responses.append(self._dict(next(iter(page.pages))))
            token = responses[-1].get("nextPageToken", "")
            if not token:
                return responses

    def delete(self, zone: str, name: str, request_id: str = "") -> OperationStatus | None:
        """``instances.delete``; None if the instance is already gone (404).

        Raises:
            GceCallError: any other refusal.
        """
        try:
            request = self._v1.DeleteInstanceRequest(
                project=self.project, zone=zone, instance=name,
                **({"request_id": request_id} if request_id else {}))
            op = self._call(self._instances.delete_unary, request=request, retry=None,
                            timeout=self.call_timeout_s)
        except GceCallError as exc:
            if exc.http_status == 404:
                return None
            raise
        return operation_from_resource(self._dict(op))


#: The read-only resource getters of :class:`ResourceReader`: kind -> (google-cloud-compute
#: client class, REST method name as in the Compute Engine API reference).
READ_KINDS: Mapping[str, tuple[str, str]] = {
    "zone": ("ZonesClient", "zones.get"),
    "region": ("RegionsClient", "regions.get"),
    "machine_type": ("MachineTypesClient", "machineTypes.get"),
    "accelerator_type": ("AcceleratorTypesClient", "acceleratorTypes.get"),
    "image": ("ImagesClient", "images.get"),
    "image_family": ("ImagesClient", "images.getFromFamily"),
    "network": ("NetworksClient", "networks.get"),
    "subnetwork": ("SubnetworksClient", "subnetworks.get"),
    "instance_template": ("InstanceTemplatesClient", "instanceTemplates.get"),
}
RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com"


class ResourceReader:
    """Read-only ``get`` calls for ``config check --online`` (zones, machine and accelerator
    types, images, networks, regions with their quotas, instance templates) and the project's
    ``testIamPermissions`` (Cloud Resource Manager v1, through google-auth's authorized
    session: no other library). Clients are built on first use of each kind.

    Args:
        settings: project, ``api_endpoint``, ``credentials_file`` (as :class:`ComputeApi`).
        call_timeout_s: HTTP timeout of each call, seconds; reads are not retried (a check
            reports what it sees).

    Raises:
        ProviderError: (``auth``) the credentials file cannot be read.
    """

    def __init__(self, settings: GcpProviderConfig, call_timeout_s: float = 20.0) -> None:
        from google.api_core import exceptions
        from google.api_core.client_options import ClientOptions
        from google.auth import exceptions as auth_errors
        from google.cloud import compute_v1

        self._v1 = compute_v1
        self._exceptions = exceptions
        self._auth_errors = auth_errors
        self.settings = settings
        self.project = settings.project
        self.call_timeout_s = call_timeout_s
        self._credentials = _credentials(settings)
        self._kwargs: dict[str, Any] = {"transport": "rest", "credentials": self._credentials}
        if settings.api_endpoint:
            self._kwargs["client_options"] = ClientOptions(api_endpoint=settings.api_endpoint)
        self._clients: dict[str, Any] = {}

    def get(self, kind: str, **names: str) -> dict[str, Any] | None:
        """The resource (REST JSON) of ``kind`` (a key of :data:`READ_KINDS`) named by
        ``names`` (``project`` defaults to the provider's; e.g. ``zone=``,
        ``machine_type=``), or None when the API answers 404.

        Raises:
            GceCallError: any other refusal (403: not allowed), or the API is unreachable.
        """
        class_name, _ = READ_KINDS[kind]
        if class_name not in self._clients:
            self._clients[class_name] = getattr(self._v1, class_name)(**self._kwargs)
        client = self._clients[class_name]
        method = client.get_from_family if kind == "image_family" else client.get
        try:
            found = method(**{"project": self.project, **names}, retry=None,
                           timeout=self.call_timeout_s)
        except self._exceptions.NotFound:
            return None
        except self._exceptions.GoogleAPICallError as exc:
            raise _call_error(exc) from None
        except self._auth_errors.GoogleAuthError as exc:
            raise _auth_refused(exc) from None
        except OSError as exc:
            raise _unreachable("the Compute API", exc) from None
        return type(found).to_dict(
            found, use_integers_for_enums=False, preserving_proto_field_name=False)

    def granted(self, permissions: list[str]) -> set[str]:
        """Which of ``permissions`` the credentials hold on the project (Cloud Resource
        Manager v1 ``projects.testIamPermissions``; its endpoint is ``api_endpoint`` when that
        is a plain-http loopback URL, as in tests, else the public one).

        Raises:
            GceCallError: the call was refused (the API disabled, no network).
        """
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        endpoint = urlparse(self.settings.api_endpoint or "")
        base = self.settings.api_endpoint.rstrip("/") if (
            self.settings.api_endpoint and endpoint.scheme == "http"
            and endpoint.hostname in LOOPBACK_HOSTS) else RESOURCE_MANAGER
        credentials = self._credentials
        try:
            if credentials is None:
                credentials, _ = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
            session = AuthorizedSession(credentials)
            reply = session.post(f"{base}/v1/projects/{self.project}:testIamPermissions",
                                 json={"permissions": permissions}, timeout=self.call_timeout_s)
        except self._auth_errors.GoogleAuthError as exc:
            raise _auth_refused(exc) from None
        except OSError as exc:
            raise _unreachable(base, exc) from None
        if reply.status_code != 200:
            error = GceError(f"HTTP_{reply.status_code}", reply.text[:300])
            raise GceCallError(reply.status_code, (error,), error.message)
        return set(reply.json().get("permissions", []))


def _environment_once(client: Any) -> None:
    """Read the proxy and CA-bundle variables once for ``client``'s HTTP session instead of on
    every request.

    requests (under google-auth's ``AuthorizedSession``) looks up ``*_proxy``/``no_proxy``
    in the whole process environment on each request (``trust_env``): two scans of
    ``os.environ`` per call, about a quarter of the CPU of an ``instances.delete`` (1000 of
    them per 1000-node suspend). The same settings are taken once here: the proxies for the
    client's host (``requests.utils.get_environ_proxies``, which honours ``no_proxy``) and
    ``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE``, as requests itself would take them (requests
    documentation, "Proxies" and "SSL Cert Verification"). A client without the REST
    transport's session is left as it is.
    """
    import os

    from requests.utils import get_environ_proxies

    transport = getattr(client, "_transport", None)
    session = getattr(transport, "_session", None)
    host = getattr(transport, "_host", "")
    if session is None or not getattr(session, "trust_env", False):
        return
    url = host if "://" in host else f"https://{host}"
    session.proxies.update(get_environ_proxies(url))
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle and session.verify is True:
        session.verify = bundle
    session.trust_env = False


def _auth_refused(exc: BaseException) -> GceCallError:
    """The error of a call whose credentials google-auth refused (``exc``, a
    ``GoogleAuthError``): code ``AUTH_ERROR``, no HTTP status."""
    error = GceError("AUTH_ERROR", f"credentials refused: {type(exc).__name__}")
    return GceCallError(None, (error,), error.message)


def _unreachable(where: str, exc: OSError) -> GceCallError:
    """The error of a call that never reached ``where`` (an endpoint or API, as the message
    names it; ``exc``: the connection's error): code ``ENDPOINT_UNREACHABLE``, no HTTP status."""
    error = GceError("ENDPOINT_UNREACHABLE", f"cannot reach {where}: {exc}")
    return GceCallError(None, (error,), error.message)


def _call_error(exc: Any) -> GceCallError:
    status = getattr(exc, "code", None)
    items = [e for e in (getattr(exc, "errors", None) or []) if isinstance(e, Mapping)]
    errors = errors_from_resource({"errors": items})
    reason = getattr(exc, "reason", None)
    if reason and not errors:
        errors = (gce_error(str(reason), str(getattr(exc, "message", ""))),)
    return GceCallError(int(status) if status else None, errors, str(getattr(exc, "message", exc)))


def _credentials(settings: GcpProviderConfig) -> Any:
    endpoint = urlparse(settings.api_endpoint or "")
    if endpoint.scheme == "http" and endpoint.hostname in LOOPBACK_HOSTS:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    if settings.credentials_file:
        return _file_credentials(settings.credentials_file)
    return None


def _file_credentials(path: Path) -> Any:
    """A service-account key or an authorized-user file, loaded with the loader of its own
    type (google-auth discourages the generic one for files of unknown origin)."""
    from google.auth import exceptions
    from google.oauth2 import credentials, service_account

    def refuse(why: str) -> ProviderError:
        return ProviderError("CREDENTIALS_FILE", f"cannot load {path}: {why}", "auth")

    try:
        kind = json.loads(path.read_text()).get("type")
    except (OSError, ValueError, AttributeError) as exc:
        raise refuse(type(exc).__name__) from None
    try:
        if kind == "service_account":
            return service_account.Credentials.from_service_account_file(
                str(path), scopes=[CLOUD_PLATFORM_SCOPE])
        if kind == "authorized_user":
            return credentials.Credentials.from_authorized_user_file(
                str(path), scopes=[CLOUD_PLATFORM_SCOPE])
    except (exceptions.GoogleAuthError, ValueError, KeyError) as exc:
        raise refuse(type(exc).__name__) from None
    raise refuse(f"unsupported credentials type {str(kind)[:40]!r} (use a service account key "
                 "or an authorized-user file)")
