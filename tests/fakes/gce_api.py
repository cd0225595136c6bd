"""A small fake of the Compute Engine REST API (v1), for the real google-cloud-compute client.

Serves on 127.0.0.1 (random port) from a thread; point the client at it with
``ClientOptions(api_endpoint=fake.endpoint)``, ``transport="rest"``, AnonymousCredentials.

Covers: instances insert, bulkInsert (zonal and regional), get, list (label filter, paging),
aggregatedList (same), delete; zone/region operations get and wait; zone operations list
(``operationType`` filter, paging), where :meth:`FakeCompute.preempt` adds the
``compute.instances.preempted`` system operation GCE adds on a preemption. Request ids are honoured
(the same ``requestId`` returns the first operation). Operations start RUNNING and are DONE
from the ``polls_until_done``-th get/wait on (default: the first); their effects happen at once.

Regional bulkInsert with a location policy picks the first ALLOW zone in name order (unlisted
zones of the region are allowed only when nothing is ALLOWed) and does not try another zone
by itself: a capacity error names that zone in ``errorInfo.metadatas.zone``.

A machine type or accelerator type can be taken off a zone's offer (:meth:`FakeCompute.unoffer`);
a bulk insert that may land there is then refused the way GCE refuses a type a zone does not
offer (as reported from the field; docs/testing-clouds.md): HTTP 400 ``invalid`` "Invalid value
for field 'resource.instanceProperties.machineType': 'T'. Machine type with name 'T' does not
exist in zone 'Z'." for a machine type, HTTP 404 ``notFound`` "The resource
'projects/P/zones/Z/acceleratorTypes/A' was not found" for an accelerator type. A regional
request is refused when any zone it ALLOWs lacks the type (the first in name order is named):
the stricter of the two things GCE might do, so a caller must cope with it.

Read-only resources for ``config check --online`` (zones, regions with quotas, machine and
accelerator types, images and image families of any project, networks, subnetworks, instance
templates) answer ``get`` from :attr:`FakeCompute.machine_types`, :attr:`~FakeCompute.images`
... (404 ``notFound`` when absent, or when the type is :meth:`~FakeCompute.unoffer`-ed in the
zone); Cloud Resource Manager's ``projects.testIamPermissions`` (``POST
/v1/projects/P:testIamPermissions`` on the same server) grants what
:attr:`FakeCompute.granted` holds (None: everything asked).

Errors: :meth:`FakeCompute.fail_operation` makes the next matching bulk insert end with
``error.errors`` (codes in order); :meth:`FakeCompute.fail_http` makes the next calls of a
method fail with an HTTP error; :attr:`FakeCompute.capacity` caps how many instances a zone
still has room for.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

BASE = "/compute/v1/projects/"
SELF = "https://www.googleapis.com/compute/v1/projects/"


@dataclass
class _OpFailure:
    codes: list[str]
    zone: str | None
    market: str | None
    times: int | None
    message: str | None


@dataclass
class _HttpFailure:
    method: str
    status: int
    reason: str
    times: int


@dataclass
class FakeCompute:
    """The fake's state; use as a context manager (starts and stops the server)."""

    project: str = "test-project"
    regions: dict[str, list[str]] = field(default_factory=lambda: {
        "us-central1": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"],
        "europe-west4": ["europe-west4-a", "europe-west4-b", "europe-west4-c"]})
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    templates: dict[str, dict[str, Any]] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    not_offered: set[tuple[str, str]] = field(default_factory=set)  # (type, zone)
    machine_types: dict[str, dict[str, Any]] = field(default_factory=lambda: {
        "n1-standard-8": {"guestCpus": 8, "memoryMb": 30720},
        "g2-standard-4": {"guestCpus": 4, "memoryMb": 16384, "accelerators": [
            {"guestAcceleratorType": "nvidia-l4", "guestAcceleratorCount": 1}]},
        "a2-highgpu-1g": {"guestCpus": 12, "memoryMb": 87040, "accelerators": [
            {"guestAcceleratorType": "nvidia-tesla-a100", "guestAcceleratorCount": 1}]}})
    accelerator_types: set[str] = field(default_factory=lambda: {
        "nvidia-tesla-t4", "nvidia-l4", "nvidia-tesla-a100", "nvidia-tesla-v100"})
    images: set[tuple[str, str]] = field(default_factory=lambda: {("test-project", "slurm-node")})
    image_families: set[tuple[str, str]] = field(
        default_factory=lambda: {("debian-cloud", "debian-12")})
    networks: set[str] = field(default_factory=lambda: {"default"})
    subnetworks: set[tuple[str, str]] = field(default_factory=set)  # (region, name)
    quotas: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {
        region: [{"metric": "CPUS", "limit": 1000.0, "usage": 0.0},
                 {"metric": "PREEMPTIBLE_CPUS", "limit": 1000.0, "usage": 0.0},
                 {"metric": "NVIDIA_T4_GPUS", "limit": 16.0, "usage": 0.0},
                 {"metric": "PREEMPTIBLE_NVIDIA_T4_GPUS", "limit": 16.0, "usage": 0.0}]
        for region in ("us-central1", "europe-west4")})
    granted: set[str] | None = None
    clock_offset_s: float = 0.0
    polls_until_done: int = 1
    latency_s: float = 0.0  # each request waits this long before it is handled (API latency)
    max_in_flight: int = 0  # most requests being handled at once so far
    _in_flight: int = 0
    _polls: dict[str, int] = field(default_factory=dict)
    _request_ids: dict[str, str] = field(default_factory=dict)
    _op_failures: list[_OpFailure] = field(default_factory=list)
    _http_failures: list[_HttpFailure] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _server: ThreadingHTTPServer | None = None

    # -- life cycle --------------------------------------------------------------------------
    def __enter__(self) -> FakeCompute:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:PORT`` of the running server."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- injection and inspection --------------------------------------------------------------
    def fail_operation(self, codes: str | list[str], zone: str | None = None,
                       market: str | None = None, times: int | None = 1,
                       message: str | None = None) -> None:
        """The next ``times`` bulk inserts landing in ``zone`` (any if None) for ``market``
        (``spot``/``on-demand``, any if None) create nothing and end with ``codes``
        (``times=None``: always)."""
        codes = [codes] if isinstance(codes, str) else codes
        self._op_failures.append(_OpFailure(codes, zone, market, times, message))

    def forget_failures(self) -> None:
        """Drop every failure :meth:`fail_operation` queued that no insert has used yet."""
        self._op_failures.clear()

    def fail_http(self, method: str, status: int, reason: str, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (``bulkInsert``, ``delete``,
        ``aggregatedList``, ``list``, ``get``, ``wait``) fail with HTTP ``status``/``reason``."""
        self._http_failures.append(_HttpFailure(method, status, reason, times))

    def unoffer(self, type_name: str, zone: str) -> None:
        """Machine or accelerator type ``type_name`` is not offered in ``zone``."""
        self.not_offered.add((type_name, zone))

    def offering_error(self, scope: str, body: dict[str, Any]) -> tuple[int, str, str] | None:
        """(HTTP status, reason, message) refusing a bulk insert that names a type not offered
        in a zone it may land in (see the module docstring); None when all is offered."""
        kind, where = scope.split("/")
        props = self._properties(body)
        if kind == "zones":
            zones = [where]
        else:
            prefs = {k.split("/")[-1]: v.get("preference") for k, v in
                     ((body.get("locationPolicy") or {}).get("locations") or {}).items()}
            zones = sorted(z for z, p in prefs.items() if p == "ALLOW") or \
                [z for z in self.regions[where] if prefs.get(z) != "DENY"]
        machine = str(props.get("machineType") or "").rsplit("/", 1)[-1]
        accelerators = [str(a.get("acceleratorType", "")).rsplit("/", 1)[-1]
                        for a in props.get("guestAccelerators") or []]
        for zone in zones:
            if (machine, zone) in self.not_offered:
                return (400, "invalid", "Invalid value for field "
                        f"'resource.instanceProperties.machineType': '{machine}'. Machine type "
                        f"with name '{machine}' does not exist in zone '{zone}'.")
            for accelerator in accelerators:
                if (accelerator, zone) in self.not_offered:
                    return (404, "notFound", f"The resource 'projects/{self.project}/zones/"
                            f"{zone}/acceleratorTypes/{accelerator}' was not found")
        return None

    def add_template(self, name: str, properties: dict[str, Any]) -> None:
        """Register global instance template ``name`` (its ``properties``)."""
        self.templates[name] = properties

    def calls(self, method: str) -> list[dict[str, Any]]:
        """The requests received for ``method`` (``bulkInsert`` ...), each with ``path``,
        ``query`` and ``body``."""
        return [r for r in self.requests if r["method"] == method]

    def all_instances(self) -> list[dict[str, Any]]:
        """Every instance (REST JSON), sorted by zone and name."""
        with self._lock:
            return [json.loads(json.dumps(v)) for _, v in sorted(self.instances.items())]

    def preempt(self, zone: str, name: str, status: str = "STOPPING") -> dict[str, Any]:
        """Preempt an instance as GCE does: a DONE ``compute.instances.preempted`` operation
        by ``system`` in its zone's operations list, and the instance ``status`` (STOPPING
        while GCE stops it; ``RUNNING`` models a listing that has not caught up yet)."""
        with self._lock:
            self.instances[(zone, name)]["status"] = status
            op = self.new_operation(f"zones/{zone}", "compute.instances.preempted", name, None)
            name_ = op["name"]
            op.update(name=f"systemevent-{name_}", status="DONE", progress=100, user="system",
                      endTime=self.now(), statusMessage="Instance was preempted.",
                      targetId=self.instances[(zone, name)]["id"])
            self.operations[op["name"]] = self.operations.pop(name_)
            return op

    def set_status(self, zone: str, name: str, status: str) -> None:
        """Change an instance's status (``TERMINATED`` after a preemption with STOP ...)."""
        self.instances[(zone, name)]["status"] = status

    # -- helpers -----------------------------------------------------------------------------
    def now(self) -> str:
        stamp = datetime.now(timezone.utc) + timedelta(seconds=self.clock_offset_s)
        return stamp.isoformat(timespec="milliseconds")

    def new_operation(self, scope: str, kind: str, target: str, request_id: str | None,
                      errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}"
        op: dict[str, Any] = {
            "kind": "compute#operation", "id": str(next(self._ids)), "name": name,
            "operationType": kind, "status": "RUNNING", "progress": 0,
            "insertTime": self.now(), "startTime": self.now(),
            "targetLink": f"{SELF}{self.project}/{scope}/instances/{target}",
            "selfLink": f"{SELF}{self.project}/{scope}/operations/{name}",
            scope.split("/")[0][:-1]: f"{SELF}{self.project}/{scope}",
        }
        if request_id:
            op["clientOperationId"] = request_id
            self._request_ids[request_id] = name
        if errors:
            op["error"] = {"errors": errors}
        self.operations[name] = op
        return op

    def take_op_failure(self, zone: str, market: str) -> _OpFailure | None:
        for failure in self._op_failures:
            if failure.zone in (None, zone) and failure.market in (None, market):
                if failure.times is not None:
                    failure.times -= 1
                    if failure.times <= 0:
                        self._op_failures.remove(failure)
                return failure
        return None

    def take_http_failure(self, method: str) -> _HttpFailure | None:
        for failure in self._http_failures:
            if failure.method == method:
                failure.times -= 1
                if failure.times <= 0:
                    self._http_failures.remove(failure)
                return failure
        return None

    def bulk_insert(self, scope: str, body: dict[str, Any], request_id: str | None) -> dict:
        if request_id in self._request_ids:
            return self.operations[self._request_ids[request_id]]
        zone = self._pick_zone(scope, body.get("locationPolicy") or {})
        props = self._properties(body)
        market = "spot" if props.get("scheduling", {}).get("provisioningModel") == "SPOT" \
            else "on-demand"
        # In name order: the JSON map's order is the client's, and tests need to know which
        # nodes get the room left in a zone.
        names = sorted(body.get("perInstanceProperties") or {})
        failure = self.take_op_failure(zone, market)
        if failure is not None:
            errors = [_error(c, zone, props, failure.message) for c in failure.codes]
            return self.new_operation(scope, "bulkInsert", names[0], request_id, errors)
        errors = []
        for name in names:
            if any(n == name and z == zone for z, n in self.instances):
                errors.append({"code": "RESOURCE_ALREADY_EXISTS",
                               "message": f"The resource '{name}' already exists"})
            elif self.capacity.get(zone, 1 << 30) <= 0:
                errors.append(_error("ZONE_RESOURCE_POOL_EXHAUSTED", zone, props, None))
            else:
                self.capacity[zone] = self.capacity.get(zone, 1 << 30) - 1
                self.create(zone, name, props)
        unique = {e["code"]: e for e in errors}
        return self.new_operation(scope, "bulkInsert", names[0], request_id,
                                  list(unique.values()))

    def _pick_zone(self, scope: str, policy: dict[str, Any]) -> str:
        kind, where = scope.split("/")
        if kind == "zones":
            return where
        prefs = {k.split("/")[-1]: v.get("preference") for k, v in
                 (policy.get("locations") or {}).items()}
        allowed = [z for z, p in prefs.items() if p == "ALLOW"]
        if not allowed:
            allowed = [z for z in self.regions[where] if prefs.get(z) != "DENY"]
        return sorted(allowed)[0]

    def _properties(self, body: dict[str, Any]) -> dict[str, Any]:
        props: dict[str, Any] = {}
        template = body.get("sourceInstanceTemplate")
        if template:
            props.update(json.loads(json.dumps(self.templates[template.split("/")[-1]])))
        props.update(body.get("instanceProperties") or {})
        return props

    def create(self, zone: str, name: str, props: dict[str, Any]) -> dict[str, Any]:
        scope = f"{SELF}{self.project}/zones/{zone}"
        number = next(self._ids)
        instance = {
            "kind": "compute#instance", "id": str(number), "name": name,
            "zone": scope, "status": "RUNNING", "creationTimestamp": self.now(),
            "machineType": f"{scope}/machineTypes/{props.get('machineType', 'n1-standard-1')}",
            "labels": dict(props.get("labels") or {}),
            "scheduling": dict(props.get("scheduling") or {}),
            "guestAccelerators": list(props.get("guestAccelerators") or []),
            "disks": list(props.get("disks") or []),
            "networkInterfaces": [{**nic, "name": f"nic{i}",
                                   "networkIP": f"10.128.{number // 250}.{number % 250 + 2}"}
                                  for i, nic in enumerate(props.get("networkInterfaces")
                                                          or [{}])],
            "selfLink": f"{scope}/instances/{name}",
        }
        self.instances[(zone, name)] = instance
        return instance

    def matching(self, query: dict[str, str], zone: str | None) -> list[dict[str, Any]]:
        wanted = re.findall(r'labels\.([a-z0-9_-]+)\s*=\s*"?([^"\s)]*)"?', query.get("filter", ""))
        found = []
        for (z, _), inst in sorted(self.instances.items()):
            if zone is not None and z != zone:
                continue
            if all(inst["labels"].get(k) == v for k, v in wanted):
                found.append(inst)
        return found


def _error(code: str, zone: str, props: dict[str, Any], message: str | None) -> dict[str, Any]:
    text = message or (f"The zone 'projects/p/zones/{zone}' does not have enough resources "
                       "available to fulfill the request.")
    error: dict[str, Any] = {"code": code, "message": text}
    if "RESOURCE_POOL" in code or code == "STOCKOUT":
        error["errorDetails"] = [{"errorInfo": {
            "reason": "resource_availability", "domain": "compute.googleapis.com",
            "metadatas": {"zone": zone, "vmType": props.get("machineType", "")}}}]
    return error


def _page(items: list[Any], query: dict[str, str]) -> tuple[list[Any], str | None]:
    start = int(query.get("pageToken") or 0)
    size = int(query.get("maxResults") or 500)
    end = start + size
    return items[start:end], (str(end) if end < len(items) else None)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeCompute
    # keep-alive, as the Compute API's front end: a client reuses its connections (every
    # answer carries its Content-Length)
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK
    ROUTES = [
        ("POST", r"(zones|regions)/([^/]+)/instances/bulkInsert", "bulkInsert"),
        ("POST", r"zones/([^/]+)/instances", "insert"),
        ("GET", r"aggregated/instances", "aggregatedList"),
        ("GET", r"zones/([^/]+)/instances", "list"),
        ("GET", r"zones/([^/]+)/instances/([^/]+)", "get"),
        ("DELETE", r"zones/([^/]+)/instances/([^/]+)", "delete"),
        ("GET", r"zones/([^/]+)/operations", "listOperations"),
        ("GET", r"(zones|regions)/([^/]+)/operations/([^/]+)", "getOperation"),
        ("POST", r"(zones|regions)/([^/]+)/operations/([^/]+)/wait", "wait"),
        ("GET", r"zones/([^/]+)", "zones.get"),
        ("GET", r"regions/([^/]+)", "regions.get"),
        ("GET", r"zones/([^/]+)/machineTypes/([^/]+)", "machineTypes.get"),
        ("GET", r"zones/([^/]+)/acceleratorTypes/([^/]+)", "acceleratorTypes.get"),
        ("GET", r"global/networks/([^/]+)", "networks.get"),
        ("GET", r"regions/([^/]+)/subnetworks/([^/]+)", "subnetworks.get"),
        ("GET", r"global/instanceTemplates/([^/]+)", "instanceTemplates.get"),
    ]
    #: Routes of any project (public images) and of Cloud Resource Manager.
    OTHER_ROUTES = [
        ("GET", r"/compute/v1/projects/([^/]+)/global/images/family/([^/]+)",
         "images.getFromFamily"),
        ("GET", r"/compute/v1/projects/([^/]+)/global/images/([^/]+)", "images.get"),
        ("POST", r"/v1/projects/([^/:]+):testIamPermissions", "projects.testIamPermissions"),
    ]

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")

    def _route(self, verb: str) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        prefix = f"{BASE}{self.fake.project}/"
        routes = [(v, p, m, url.path) for v, p, m in self.OTHER_ROUTES]
        if url.path.startswith(prefix):
            routes += [(v, p, m, url.path[len(prefix):]) for v, p, m in self.ROUTES]
        elif not any(re.fullmatch(p, url.path) for _, p, _ in self.OTHER_ROUTES):
            return self._error(404, "notFound", f"unknown project in {url.path}")
        for method_verb, pattern, method, rest in routes:
            match = re.fullmatch(pattern, rest)
            if method_verb == verb and match:
                with self.fake._lock:
                    self.fake._in_flight += 1
                    self.fake.max_in_flight = max(self.fake.max_in_flight, self.fake._in_flight)
                try:
                    if self.fake.latency_s:
                        time.sleep(self.fake.latency_s)
                    with self.fake._lock:
                        self.fake.requests.append(
                            {"method": method, "path": url.path, "query": query, "body": body})
                        failure = self.fake.take_http_failure(method)
                        if failure is not None:
                            return self._error(failure.status, failure.reason, "injected")
                        handler = "_" + method.replace(".", "_")
                        return getattr(self, handler)(query, body, *match.groups())
                finally:
                    with self.fake._lock:
                        self.fake._in_flight -= 1
        return self._error(404, "notFound", f"no route for {verb} {url.path}")

    def _send(self, payload: dict[str, Any], status: int = 200) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, reason: str, message: str) -> None:
        self._send({"error": {"code": status, "message": message, "errors": [
            {"message": message, "domain": "global", "reason": reason}]}}, status)

    def _bulkInsert(self, query: dict, body: dict, kind: str, where: str) -> None:
        template = body.get("sourceInstanceTemplate")
        if template and template.split("/")[-1] not in self.fake.templates:
            return self._error(404, "notFound", f"The resource '{template}' was not found")
        refusal = self.fake.offering_error(f"{kind}/{where}", body)
        if refusal is not None:
            return self._error(*refusal)
        self._send(self.fake.bulk_insert(f"{kind}/{where}", body, query.get("requestId")))

    def _insert(self, query: dict, body: dict, zone: str) -> None:
        self.fake.create(zone, body["name"], body)
        self._send(self.fake.new_operation(f"zones/{zone}", "insert", body["name"],
                                           query.get("requestId")))

    def _aggregatedList(self, query: dict, body: dict) -> None:
        items, token = _page(self.fake.matching(query, None), query)
        scoped: dict[str, Any] = {}
        for inst in items:
            key = "zones/" + inst["zone"].split("/")[-1]
            scoped.setdefault(key, {"instances": []})["instances"].append(inst)
        payload: dict[str, Any] = {"kind": "compute#instanceAggregatedList", "items": scoped}
        if token:
            payload["nextPageToken"] = token
        self._send(payload)

    def _list(self, query: dict, body: dict, zone: str) -> None:
        items, token = _page(self.fake.matching(query, zone), query)
        payload: dict[str, Any] = {"kind": "compute#instanceList", "items": items}
        if token:
            payload["nextPageToken"] = token
        self._send(payload)

    def _get(self, query: dict, body: dict, zone: str, name: str) -> None:
        inst = self.fake.instances.get((zone, name))
        if inst is None:
            return self._error(404, "notFound", f"The resource '{name}' was not found")
        self._send(inst)

    def _delete(self, query: dict, body: dict, zone: str, name: str) -> None:
        if self.fake.instances.pop((zone, name), None) is None:
            return self._error(404, "notFound", f"The resource '{name}' was not found")
        self._send(self.fake.new_operation(f"zones/{zone}", "delete", name,
                                           query.get("requestId")))

    def _getOperation(self, query: dict, body: dict, kind: str, where: str, name: str) -> None:
        op = self.fake.operations.get(name)
        if op is None:
            return self._error(404, "notFound", f"The resource '{name}' was not found")
        polls = self.fake._polls[name] = self.fake._polls.get(name, 0) + 1
        if polls >= self.fake.polls_until_done:
            op.update(status="DONE", progress=100, endTime=op.get("endTime") or self.fake.now())
        self._send(op)

    def _listOperations(self, query: dict, body: dict, zone: str) -> None:
        wanted = re.findall(r'operationType\s*=\s*"?([^"\s)]*)"?', query.get("filter", ""))
        ops = [op for op in self.fake.operations.values()
               if op.get("zone", "").endswith(f"/zones/{zone}")
               and all(op["operationType"] == w for w in wanted)]
        items, token = _page(ops, query)
        payload: dict[str, Any] = {"kind": "compute#operationList", "items": items}
        if token:
            payload["nextPageToken"] = token
        self._send(payload)

    def _wait(self, query: dict, body: dict, kind: str, where: str, name: str) -> None:
        self._getOperation(query, body, kind, where, name)

    # -- read-only resources (config check --online) -----------------------------------------
    def _found(self, kind: str, name: str, resource: dict[str, Any] | None) -> None:
        if resource is None:
            return self._error(404, "notFound", f"The resource '{kind}/{name}' was not found")
        self._send({"name": name, "selfLink": f"{SELF}{self.fake.project}/{kind}/{name}",
                    **resource})

    def _all_zones(self) -> dict[str, str]:
        return {z: r for r, zones in self.fake.regions.items() for z in zones}

    def _zones_get(self, query: dict, body: dict, zone: str) -> None:
        region = self._all_zones().get(zone)
        self._found("zones", zone, None if region is None else {
            "status": "UP", "region": f"{SELF}{self.fake.project}/regions/{region}"})

    def _regions_get(self, query: dict, body: dict, region: str) -> None:
        self._found("regions", region, None if region not in self.fake.regions else {
            "status": "UP", "quotas": self.fake.quotas.get(region, [])})

    def _machineTypes_get(self, query: dict, body: dict, zone: str, name: str) -> None:
        known = self.fake.machine_types.get(name)
        offered = zone in self._all_zones() and (name, zone) not in self.fake.not_offered
        self._found(f"zones/{zone}/machineTypes", name, known if known and offered else None)

    def _acceleratorTypes_get(self, query: dict, body: dict, zone: str, name: str) -> None:
        offered = (name in self.fake.accelerator_types and zone in self._all_zones()
                   and (name, zone) not in self.fake.not_offered)
        self._found(f"zones/{zone}/acceleratorTypes", name,
                    {"maximumCardsPerInstance": 8} if offered else None)

    def _images_get(self, query: dict, body: dict, project: str, name: str) -> None:
        self._found("global/images", name,
                    {"status": "READY"} if (project, name) in self.fake.images else None)

    def _images_getFromFamily(self, query: dict, body: dict, project: str, family: str) -> None:
        self._found("global/images", f"{family}-v1", {"status": "READY", "family": family}
                    if (project, family) in self.fake.image_families else None)

    def _networks_get(self, query: dict, body: dict, name: str) -> None:
        self._found("global/networks", name, {} if name in self.fake.networks else None)

    def _subnetworks_get(self, query: dict, body: dict, region: str, name: str) -> None:
        self._found(f"regions/{region}/subnetworks", name,
                    {} if (region, name) in self.fake.subnetworks else None)

    def _instanceTemplates_get(self, query: dict, body: dict, name: str) -> None:
        template = self.fake.templates.get(name)
        self._found("global/instanceTemplates", name,
                    None if template is None else {"properties": template})

    def _projects_testIamPermissions(self, query: dict, body: dict, project: str) -> None:
        if project != self.fake.project:
            return self._error(403, "forbidden", f"no access to project {project}")
        asked = list(body.get("permissions") or [])
        granted = asked if self.fake.granted is None else \
            [p for p in asked if p in self.fake.granted]
        self._send({"permissions": granted} if granted else {})


def gcp_config(fake: FakeCompute, node_sets: list[dict[str, Any]], cluster: str = "demo",
               **top: Any) -> Any:
    """A validated ``SpotConfig`` whose provider ``gcp`` points at ``fake``; each node set
    gets ``provider: gcp`` and one partition holds them all. Without ``state_dir``/``log_dir``
    each config gets fresh temporary ones (never the host's /var/lib/slurm-spot), removed when
    the test process ends."""
    import atexit
    import shutil
    import tempfile

    from slurm_spot.config import SpotConfig

    for key in ("state_dir", "log_dir"):
        if key not in top:
            top[key] = tempfile.mkdtemp(prefix=f"slurm-spot-gcp-{key}-")
            atexit.register(shutil.rmtree, top[key], True)

    return SpotConfig.model_validate({
        "cluster": cluster,
        "providers": {"gcp": {"type": "gcp", "project": fake.project, "region": "us-central1",
                              "api_endpoint": fake.endpoint}},
        "node_sets": [{"provider": "gcp", **ns} for ns in node_sets],
        "partitions": [{"name": "cloud", "node_sets": [ns["name"] for ns in node_sets]}],
        **top,
    })
