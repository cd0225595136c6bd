"""``config check --online`` for GCP: ask Compute Engine, read-only, about each node set.

Per node set of the provider (every finding names its spot.yaml field):

- ``zones.get``: each zone exists (and is UP);
- ``machineTypes.get`` per zone for ``gcp.machine_type`` and the ``instance_types``, and
  ``acceleratorTypes.get`` for the GPUs attached as ``guestAccelerators``
  (:func:`~.requests.attaches_gpus`): offered in no zone is an error, in some a warning;
- ``images.get`` / ``images.getFromFamily`` for ``gcp.image``; ``networks.get`` and
  ``subnetworks.get``; ``instanceTemplates.get`` for ``gcp.instance_template``;
- ``regions.get``: the region's quotas. Spot and preemptible VMs count against the
  ``PREEMPTIBLE_*`` quotas when the project has them, else against the standard ones
  (Compute Engine documentation, "Preemptible quotas"): vCPUs (``CPUS``) and GPUs
  (``NVIDIA_<MODEL>_GPUS``) must hold one node (else error) and all nodes (else warning).

Once per provider: Cloud Resource Manager ``projects.testIamPermissions`` with the
controller's permissions (:mod:`.iam`); a missing one is an error, a refused test a warning.
"""

from __future__ import annotations

import re
from typing import Any

from slurm_spot.config import GcpProviderConfig, NodeSetConfig, SpotConfig
from slurm_spot.errors import ProviderError
from slurm_spot.providers.base import Finding, expect_settings
from slurm_spot.providers.gcp.iam import permissions
from slurm_spot.providers.gcp.requests import accelerator_type, attaches_gpus, short_name

#: Accelerator types whose quota metric is not ``NVIDIA_<MODEL>_GPUS`` spelled from the name.
GPU_METRICS = {"nvidia-h100-80gb": "NVIDIA_H100_GPUS", "nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS"}


def gpu_metric(accelerator: str) -> str:
    """The regional quota metric of accelerator type ``accelerator``
    (``nvidia-tesla-t4`` -> ``NVIDIA_T4_GPUS``, ``nvidia-a100-80gb`` -> ``NVIDIA_A100_80GB_GPUS``)."""
    if accelerator in GPU_METRICS:
        return GPU_METRICS[accelerator]
    model = accelerator.removeprefix("nvidia-").removeprefix("tesla-")
    return f"NVIDIA_{model.upper().replace('-', '_')}_GPUS"


def check_gcp_online(config: SpotConfig, name: str, reader: Any = None) -> list[Finding]:
    """The findings for provider ``name`` (see the module docstring).

    Args:
        reader: a :class:`~.api.ResourceReader` (tests); default: one for the provider's
            settings.
    """
    from google.auth.exceptions import GoogleAuthError

    from slurm_spot.providers.gcp.api import ResourceReader

    settings = expect_settings(config.providers[name], GcpProviderConfig, name)
    findings: list[Finding] = []
    where = f"providers.{name}"
    try:
        reader = reader or ResourceReader(settings)
        region = reader.get("region", region=settings.region)
    except (ProviderError, GoogleAuthError) as exc:  # no credentials found is the latter
        return [Finding(where, f"cannot read region {settings.region} of project "
                        f"{settings.project}: {exc}; nothing else was checked")]
    if region is None:
        return [Finding(f"{where}.region", f"region {settings.region!r} does not exist in "
                        f"project {settings.project}")]
    quotas = {q.get("metric", ""): q for q in region.get("quotas", [])}
    for index, ns in enumerate(config.node_sets):
        if ns.provider == name and ns.gcp is not None:
            _NodeSet(reader, settings, ns, f"node_sets.{index}", quotas, findings).run()
    try:
        needed = permissions(include_optional=False)
        missing = sorted(set(needed) - reader.granted(needed))
    except ProviderError as exc:
        findings.append(Finding(where, f"cannot test the credentials' permissions "
                                f"(projects.testIamPermissions: {exc}); compare them with "
                                "'slurm-spot config iam --provider " + name + "'", "warning"))
    else:
        if missing:
            findings.append(Finding(where, f"the credentials lack {', '.join(missing)} on project "
                                    f"{settings.project}; 'slurm-spot config iam' lists them"))
    return findings


class _NodeSet:
    def __init__(self, reader: Any, settings: GcpProviderConfig, ns: NodeSetConfig, where: str,
                 quotas: dict[str, dict[str, Any]], findings: list[Finding]) -> None:
        assert ns.gcp is not None
        self.reader = reader
        self.settings = settings
        self.ns = ns
        self.opts = ns.gcp
        self.where = where
        self.quotas = quotas
        self.findings = findings

    def add(self, field: str, message: str, severity: str = "error") -> None:
        self.findings.append(Finding(f"{self.where}.{field}", message, severity))

    def get(self, field: str, kind: str, **names: str) -> dict[str, Any] | None:
        """The resource, or None; a refused read becomes a warning on ``field``."""
        try:
            return self.reader.get(kind, **names)
        except ProviderError as exc:
            self.add(field, f"cannot read it (not checked): {exc}", "warning")
            return {}

    def run(self) -> None:
        zones = []
        for i, zone in enumerate(self.opts.zones):
            found = self.get(f"gcp.zones.{i}", "zone", zone=zone)
            if found is None:
                self.add(f"gcp.zones.{i}", f"zone {zone!r} does not exist")
            else:
                zones.append(zone)
                if found and found.get("status", "UP") != "UP":
                    self.add(f"gcp.zones.{i}", f"zone {zone!r} is {found['status']}", "warning")
        shapes = self.machine_types(zones)
        self.image_and_network()
        if self.opts.instance_template and self.get(
                "gcp.instance_template", "instance_template",
                instance_template=short_name(self.opts.instance_template)) is None:
            self.add("gcp.instance_template", f"instance template "
                     f"{self.opts.instance_template!r} does not exist in project "
                     f"{self.settings.project}")
        self.quota(shapes)

    def machine_types(self, zones: list[str]) -> list[dict[str, Any]]:
        """Check each machine type (and its accelerators) in each zone; the shapes found."""
        named: list[tuple[str, str]] = []
        if self.opts.machine_type:
            named.append(("gcp.machine_type", self.opts.machine_type))
        named += [(f"instance_types.{k}", t) for k, t in enumerate(self.ns.instance_types)]
        shapes = []
        for field, machine in named:
            offered = []
            for zone in zones:
                found = self.get(field, "machine_type", zone=zone, machine_type=machine)
                if found is not None:
                    offered.append(zone)
                    if found:
                        shapes.append(found)
            self.offer(field, f"machine type {machine!r}", zones, offered)
            if self.ns.gpus and attaches_gpus(machine):
                accelerator = accelerator_type(self.ns.gpus.type)
                with_gpu = [z for z in offered if self.get(
                    "gpus.type", "accelerator_type", zone=z,
                    accelerator_type=accelerator) is not None]
                self.offer("gpus.type", f"accelerator type {accelerator!r} (for {machine})",
                           offered, with_gpu)
        return shapes

    def offer(self, field: str, what: str, zones: list[str], offered: list[str]) -> None:
        missing = [z for z in zones if z not in offered]
        if zones and len(missing) == len(zones):
            self.add(field, f"{what} is not offered in any of the node set's zones "
                     f"({', '.join(zones)})")
        elif missing:
            self.add(field, f"{what} is not offered in {', '.join(missing)}: those zones are "
                     "skipped", "warning")

    def image_and_network(self) -> None:
        project = self.settings.project
        if self.opts.image and not self.opts.instance_template:
            match = re.fullmatch(r"(?:.*/)?projects/([^/]+)/global/images/(family/)?([^/]+)",
                                 self.opts.image)
            image_project, family, image = (match.groups() if match
                                            else (project, None, self.opts.image))
            found = (self.get("gcp.image", "image_family", project=image_project, family=image)
                     if family else
                     self.get("gcp.image", "image", project=image_project, image=image))
            if found is None:
                self.add("gcp.image", f"image {self.opts.image!r} does not exist (project "
                         f"{image_project})")
        if not self.opts.instance_template:
            network = short_name(self.opts.network)
            if self.get("gcp.network", "network", network=network) is None:
                self.add("gcp.network", f"network {network!r} does not exist in project {project}")
        if self.opts.subnetwork:
            subnet = short_name(self.opts.subnetwork)
            if self.get("gcp.subnetwork", "subnetwork", region=self.settings.region,
                        subnetwork=subnet) is None:
                self.add("gcp.subnetwork", f"subnetwork {subnet!r} does not exist in region "
                         f"{self.settings.region}")

    def quota(self, shapes: list[dict[str, Any]]) -> None:
        if not shapes or not self.quotas:
            return
        cpus = min(int(s.get("guestCpus", 0)) for s in shapes)
        needs: list[tuple[str, int]] = [("CPUS", cpus)]
        if self.ns.gpus:
            bundled = [a for s in shapes for a in s.get("accelerators", [])]
            accelerator = (bundled[0]["guestAcceleratorType"] if bundled
                           else accelerator_type(self.ns.gpus.type))
            count = int(bundled[0]["guestAcceleratorCount"]) if bundled else self.ns.gpus.count
            needs.append((gpu_metric(accelerator), count))
        markets = [self.ns.market] + (["on-demand"] if self.ns.fallback == "on-demand" else [])
        for market in markets:
            for metric, per_node in needs:
                self.one_quota(market, metric, per_node)

    def one_quota(self, market: str, metric: str, per_node: int) -> None:
        preemptible = self.quotas.get(f"PREEMPTIBLE_{metric}")
        quota = (preemptible if market == "spot" and preemptible and preemptible.get("limit")
                 else self.quotas.get(metric))
        if per_node <= 0:
            return
        if quota is None:
            self.add("count", f"no {metric} quota in region {self.settings.region} (not "
                     "checked)", "warning")
            return
        name = quota.get("metric", metric)
        limit, usage = float(quota.get("limit", 0)), float(quota.get("usage", 0))
        field = "gpus" if "GPUS" in metric else "count"
        if limit < per_node:
            self.add(field, f"the {market} quota {name} of region {self.settings.region} is "
                     f"{limit:g}, below one node ({per_node}): no node can start; ask for more "
                     "in IAM & Admin > Quotas")
        elif limit - usage < per_node * self.ns.count:
            self.add("count", f"the {market} quota {name} of region {self.settings.region} has "
                     f"{limit - usage:g} free ({limit:g} - {usage:g} used): "
                     f"{int((limit - usage) // per_node)} of the {self.ns.count} nodes fit at once",
                     "warning")

