"""moto in server mode, behind a small HTTP proxy that answers CreateFleet the way EC2 does.

End-to-end tests run the provider in other processes (``slurm-spot resume`` as a subprocess, the
hooks slurmctld starts), so the botocore event hooks of :class:`tests.fakes.ec2.FleetMarket`
cannot reach them. :class:`Ec2Proxy` does the same at the HTTP level instead:

- every request is forwarded to the moto server unchanged, and its ``Action`` is logged
  (:attr:`Ec2Proxy.actions`): a test counts the CreateFleet calls of a subprocess;
- a CreateFleet whose overrides match :meth:`Ec2Proxy.fail_pools` (instance type, subnet,
  market) is answered like EC2: the failing overrides are removed before moto sees the request
  (moto fills from the first override left) and reported in the response's ``errorSet``; when
  no override is left, the proxy answers itself with a ``CreateFleetResponse`` that launched
  nothing and lists one error per override (HTTP 200, as EC2 does for an instant fleet);
- :meth:`Ec2Proxy.fail_next` makes the next CreateFleet calls fail as a whole with an EC2
  error reply (e.g. ``RequestLimitExceeded``, HTTP 503).

:class:`MotoEc2` starts moto (``ThreadedMotoServer`` on 127.0.0.1, random port) and the proxy,
and creates the :func:`tests.fakes.ec2.make_world` VPC, subnets and launch template.
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlparse
from xml.sax.saxutils import escape

import boto3

from tests.fakes.ec2 import ERROR_MESSAGES, REGION, TEMPLATE, World, make_world, xml_error

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
_OVERRIDE = "LaunchTemplateConfigs.1.Overrides."
_HOP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding"}


@dataclass
class FleetCall:
    """One CreateFleet the proxy saw.

    Attributes:
        market: ``spot`` or ``on-demand`` (``DefaultTargetCapacityType``).
        count: ``TotalTargetCapacity``.
        pools: ``(instance type, subnet)`` of every override, in request order.
        tags: the instance tags of ``TagSpecifications``.
        errors: ``(instance type, subnet, code)`` the proxy reported.
        forwarded: whether moto got the request (False: nothing was launched).
    """

    market: str
    count: int
    pools: list[tuple[str, str]]
    tags: dict[str, str]
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    forwarded: bool = True


class Ec2Proxy:
    """The proxy (see the module docstring); a context manager, or :meth:`start`/:meth:`stop`.

    Args:
        upstream: base URL of the moto server (``http://127.0.0.1:PORT``).
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = _host_port(upstream)
        self.lock = threading.Lock()
        self.actions: list[str] = []
        self.fleets: list[FleetCall] = []
        self.pool_errors: dict[tuple[str, str, str], str] = {}
        self._next_errors: list[tuple[int, str, str]] = []
        self._server: ThreadingHTTPServer | None = None

    # ---- control from the test ----------------------------------------------------------
    def fail_pools(self, code: str = "InsufficientInstanceCapacity", instance_type: str = "*",
                   subnet: str = "*", market: str = "*") -> None:
        """Every CreateFleet override matching the pattern (``*``: any) fails with ``code``."""
        with self.lock:
            self.pool_errors[(instance_type, subnet, market)] = code

    def fail_next(self, status: int, code: str, times: int = 1) -> None:
        """The next ``times`` CreateFleet calls fail as a whole with this EC2 error."""
        with self.lock:
            self._next_errors += [(status, code, ERROR_MESSAGES.get(code, code))] * times

    def clear(self) -> None:
        """No injected failure any more."""
        with self.lock:
            self.pool_errors.clear()
            self._next_errors.clear()

    def count(self, action: str) -> int:
        """How many requests of ``action`` (``CreateFleet``, ``TerminateInstances``...) came."""
        with self.lock:
            return self.actions.count(action)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` of the proxy: the ``endpoint_url`` to configure."""
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # ---- life cycle ---------------------------------------------------------------------
    def start(self) -> Ec2Proxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy._handle(self)

            def do_GET(self) -> None:
                proxy._handle(self)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Ec2Proxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ---- the proxy ----------------------------------------------------------------------
    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        form = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        if not form:
            form = parse_qsl(urlparse(handler.path).query, keep_blank_values=True)
        action = dict(form).get("Action", "")
        with self.lock:
            self.actions.append(action)
        call: FleetCall | None = None
        if action == "CreateFleet":
            answer, form, call = self._create_fleet(form)
            if answer is not None:
                return self._reply(handler, *answer)
            body = urlencode(form).encode()
        status, content_type, data = self._forward(handler, body)
        if call is not None and call.errors and status == 200:
            data = _with_errors(data, call.errors, call.market)
        self._reply(handler, status, content_type, data)

    def _create_fleet(
        self, form: list[tuple[str, str]]
    ) -> tuple[tuple[int, str, bytes] | None, list[tuple[str, str]], FleetCall]:
        """(own answer or None, the form to forward to moto, the call as recorded)."""
        params = dict(form)
        market = params.get("TargetCapacitySpecification.DefaultTargetCapacityType", "on-demand")
        overrides = _overrides(form)
        tags = _tags(params)
        pools = [(o.get("InstanceType", ""), o.get("SubnetId", "")) for o in overrides]
        call = FleetCall(market, int(params.get(
            "TargetCapacitySpecification.TotalTargetCapacity", "0")), pools, tags)
        with self.lock:
            self.fleets.append(call)
            whole = self._next_errors.pop(0) if self._next_errors else None
            codes = [self._code(itype, subnet, market) for itype, subnet in pools]
        if whole is not None:
            call.forwarded = False
            status, code, message = whole
            return (status, "text/xml", xml_error(status, code, message)), form, call
        call.errors = [(t, s, c) for (t, s), c in zip(pools, codes, strict=True) if c]
        usable = [o for o, c in zip(overrides, codes, strict=True) if not c]
        if not usable:
            call.forwarded = False
            return (200, "text/xml", _fleet_reply(call.errors, market)), form, call
        kept = [(k, v) for k, v in form if not k.startswith(_OVERRIDE)]
        kept += [(f"{_OVERRIDE}1.{k}", v) for k, v in usable[0].items()]
        return None, kept, call

    def _code(self, instance_type: str, subnet: str, market: str) -> str:
        for (p_type, p_subnet, p_market), code in self.pool_errors.items():
            if (p_type in ("*", instance_type) and p_subnet in ("*", subnet)
                    and p_market in ("*", market)):
                return code
        return ""

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, bytes]:
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP_HEADERS}
        headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(handler.command, handler.path, body, headers)
            response = conn.getresponse()
            return response.status, response.getheader("Content-Type") or "text/xml", \
                response.read()
        finally:
            conn.close()

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, content_type: str,
               data: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


def _overrides(form: list[tuple[str, str]]) -> list[dict[str, str]]:
    """The overrides of the first launch template config, in index order."""
    found: dict[int, dict[str, str]] = {}
    for key, value in form:
        if key.startswith(_OVERRIDE):
            index, _, name = key[len(_OVERRIDE):].partition(".")
            found.setdefault(int(index), {})[name] = value
    return [found[i] for i in sorted(found)]


def _tags(params: dict[str, str]) -> dict[str, str]:
    tags = {}
    for key, value in params.items():
        if key.startswith("TagSpecification.1.Tag.") and key.endswith(".Key"):
            tags[value] = params.get(key[: -len("Key")] + "Value", "")
    return tags


def _error_items(errors: list[tuple[str, str, str]], market: str) -> str:
    """``errorSet`` items (EC2 API reference, CreateFleetError), one per failed override."""
    items = []
    for instance_type, subnet, code in errors:
        message = ERROR_MESSAGES.get(code, code).format(
            type=instance_type, zone=subnet, max_price="", price="", limit="")
        items.append(
            "<item><launchTemplateAndOverrides><launchTemplateSpecification>"
            f"<launchTemplateName>{escape(TEMPLATE)}</launchTemplateName><version>1</version>"
            "</launchTemplateSpecification><overrides>"
            f"<instanceType>{escape(instance_type)}</instanceType>"
            f"<subnetId>{escape(subnet)}</subnetId></overrides></launchTemplateAndOverrides>"
            f"<lifecycle>{escape(market)}</lifecycle><errorCode>{escape(code)}</errorCode>"
            f"<errorMessage>{escape(message)}</errorMessage></item>"
        )
    return "".join(items)


def _fleet_reply(errors: list[tuple[str, str, str]], market: str) -> bytes:
    """A 200 CreateFleetResponse that launched nothing and lists ``errors``."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<CreateFleetResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        f"<requestId>{uuid.uuid4()}</requestId><fleetId>fleet-{uuid.uuid4()}</fleetId>"
        f"<errorSet>{_error_items(errors, market)}</errorSet><fleetInstanceSet/>"
        "</CreateFleetResponse>"
    ).encode()


def _with_errors(data: bytes, errors: list[tuple[str, str, str]], market: str) -> bytes:
    """moto's CreateFleetResponse with an ``errorSet`` for the overrides the proxy removed."""
    items = _error_items(errors, market)
    return data.decode().replace(
        "</CreateFleetResponse>", f"<errorSet>{items}</errorSet></CreateFleetResponse>").encode()


def _reset(upstream: str) -> None:
    """Empty every moto backend (moto's ``/moto-api/reset``)."""
    conn = http.client.HTTPConnection(*_host_port(upstream), timeout=30)
    try:
        conn.request("POST", "/moto-api/reset")
        response = conn.getresponse()
        response.read()
        assert response.status == 200, f"moto reset answered {response.status}"
    finally:
        conn.close()


def _host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or 80


class MotoEc2:
    """moto server + :class:`Ec2Proxy` + the :func:`make_world` resources, for one test module.

    Attributes:
        proxy: the proxy; its ``url`` is the endpoint the code under test uses.
        ec2: a boto3 EC2 client of :data:`~tests.fakes.ec2.REGION` talking to moto directly
            (not counted by the proxy); :meth:`client` gives one of another region.
        world: subnets, zones and launch template of that region (:meth:`world_in`: another's).
        upstream: the moto server's own URL (``http://127.0.0.1:PORT``).
    """

    def __init__(self) -> None:
        self.proxy: Ec2Proxy
        self.ec2: Any = None
        self.world: World
        self.upstream = ""
        self._clients: dict[str, Any] = {}
        self._server: Any = None
        self._env_before: dict[str, str | None] = {}

    def __enter__(self) -> MotoEc2:
        from moto.server import ThreadedMotoServer

        # moto reads these at request time, in this process: no default AMIs (fast).
        for key, value in {"MOTO_EC2_LOAD_DEFAULT_AMIS": "false"}.items():
            self._env_before[key] = os.environ.get(key)
            os.environ[key] = value
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        upstream = self.upstream = f"http://{host}:{port}"
        _reset(upstream)  # moto's backends are per process: start from an empty account
        self.proxy = Ec2Proxy(upstream).start()
        self.ec2 = boto3.session.Session(
            aws_access_key_id=CREDENTIALS["aws_access_key_id"],
            aws_secret_access_key=CREDENTIALS["aws_secret_access_key"], region_name=REGION,
        ).client("ec2", endpoint_url=upstream)
        self.world = make_world(self.ec2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proxy.stop()
        if self._server is not None:
            host, port = self._server.get_host_and_port()
            _reset(f"http://{host}:{port}")  # leave nothing to the next test in this process
            self._server.stop()
        for key, value in self._env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def client(self, region: str = REGION) -> Any:
        """A boto3 EC2 client of ``region`` talking to moto directly (not counted by the
        proxy); moto keeps one backend per region, chosen by the request's signing region."""
        if region == REGION:
            return self.ec2
        if region not in self._clients:
            self._clients[region] = boto3.session.Session(
                aws_access_key_id=CREDENTIALS["aws_access_key_id"],
                aws_secret_access_key=CREDENTIALS["aws_secret_access_key"], region_name=region,
            ).client("ec2", endpoint_url=self.upstream)
        return self._clients[region]

    def world_in(self, region: str, zones: tuple[str, ...]) -> World:
        """A :func:`make_world` VPC, subnets (one per zone of ``zones``) and launch template in
        another ``region`` of the same moto server (same endpoint, other signing region)."""
        return make_world(self.client(region), zones)

    def records(self, *states: str, region: str = REGION) -> list[dict[str, Any]]:
        """DescribeInstances records of ``region`` straight from moto (all states unless
        given)."""
        filters = [{"Name": "instance-state-name", "Values": list(states)}] if states else []
        pages = self.client(region).get_paginator("describe_instances").paginate(Filters=filters)
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def write_credentials(self, path: os.PathLike[str] | str) -> str:
        """Write a shared credentials file with the dummy keys; returns its path."""
        text = "[default]\n" + "".join(f"{k} = {v}\n" for k, v in CREDENTIALS.items())
        with open(path, "w") as fh:
            fh.write(text)
        return str(path)
