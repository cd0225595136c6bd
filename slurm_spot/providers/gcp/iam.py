"""The IAM permissions slurm-spot's Compute Engine calls need, as data.

:data:`CALLS` maps each REST method the package calls (:mod:`.api`: the provider's bulk
inserts, listings, deletes and operation waits; :class:`~.api.ResourceReader` for
``config check --online``) to the permissions it needs, from the Compute Engine IAM
permissions reference. A bulk insert needs, besides ``compute.instances.create``, the
permissions of what the instance uses: its disks and image, its network, its labels and
scheduling, and an instance template when one is named. tests/test_config_iam.py records
every method the tests' GCE fake is called with and fails if one is missing here.

Only the controller calls the Compute API; a compute node reads its preemption notice from the
metadata server, which needs no permission. The checkpoint store is S3-compatible only.
"""

from __future__ import annotations

from dataclasses import dataclass

from slurm_spot.config import SpotConfig

#: Predefined roles that hold the controller's permissions (Compute Engine IAM roles):
#: Compute Instance Admin (v1), and Service Account User when the instances (or their
#: template) run as a service account.
PREDEFINED_ROLES = ("roles/compute.instanceAdmin.v1", "roles/iam.serviceAccountUser")


@dataclass(frozen=True)
class GceCall:
    """One Compute Engine REST method slurm-spot calls.

    Attributes:
        method: the method as the API reference names it (``instances.bulkInsert``).
        permissions: the IAM permissions it needs.
        optional: only ``config check --online`` calls it (a refusal is a warning there).
    """

    method: str
    permissions: tuple[str, ...]
    optional: bool = False


_CREATE = ("compute.instances.create", "compute.instances.setLabels",
           "compute.instances.setMetadata", "compute.instances.setScheduling",
           "compute.instances.setServiceAccount", "compute.disks.create",
           "compute.images.useReadOnly", "compute.subnetworks.use",
           "compute.instanceTemplates.useReadOnly", "iam.serviceAccounts.actAs")

CALLS: tuple[GceCall, ...] = (
    GceCall("instances.bulkInsert", _CREATE),
    GceCall("regionInstances.bulkInsert", _CREATE),
    GceCall("instances.aggregatedList", ("compute.instances.list",)),
    GceCall("instances.delete", ("compute.instances.delete",)),
    GceCall("zoneOperations.wait", ("compute.zoneOperations.get",)),
    GceCall("zoneOperations.get", ("compute.zoneOperations.get",)),
    # the reconciler's preemption events (providers/gcp/events.py)
    GceCall("zoneOperations.list", ("compute.zoneOperations.list",)),
    GceCall("regionOperations.wait", ("compute.regionOperations.get",)),
    GceCall("regionOperations.get", ("compute.regionOperations.get",)),
    GceCall("zones.get", ("compute.zones.get",), optional=True),
    GceCall("regions.get", ("compute.regions.get",), optional=True),
    GceCall("machineTypes.get", ("compute.machineTypes.get",), optional=True),
    GceCall("acceleratorTypes.get", ("compute.acceleratorTypes.get",), optional=True),
    GceCall("images.get", ("compute.images.get",), optional=True),
    GceCall("images.getFromFamily", ("compute.images.getFromFamily",), optional=True),
    GceCall("networks.get", ("compute.networks.get",), optional=True),
    GceCall("subnetworks.get", ("compute.subnetworks.get",), optional=True),
    GceCall("instanceTemplates.get", ("compute.instanceTemplates.get",), optional=True),
    GceCall("projects.testIamPermissions", (), optional=True),
)


def permissions(include_optional: bool = True) -> list[str]:
    """The controller's permissions, sorted, each once."""
    return sorted({p for c in CALLS if include_optional or not c.optional
                   for p in c.permissions})


def call(method: str) -> GceCall | None:
    """The :data:`CALLS` entry of ``method``, or None."""
    return next((c for c in CALLS if c.method == method), None)


def custom_role(project: str | None = None) -> dict[str, object]:
    """A custom role with exactly the controller's permissions, in the file format of
    ``gcloud iam roles create --file`` (title, description, stage, includedPermissions)."""
    return {
        "title": "slurm-spot controller",
        "description": "Launch, list and delete slurm-spot's Spot VMs; read what spot.yaml "
                       f"names{' in ' + project if project else ''} (config check --online).",
        "stage": "GA",
        "includedPermissions": permissions(),
    }


def grants(config: SpotConfig, name: str) -> dict[str, dict[str, object]]:
    """What ``config iam`` prints for the ``gcp`` provider ``name``: for the controller and the
    nodes, where to attach (``attach``) which permissions (:func:`permissions`), and the
    custom role and predefined roles that grant them."""
    project = getattr(config.providers[name], "project", None)
    return {
        "controller": {"attach": f"the controller's service account, on project {project}: "
                       f"the custom role below, or {' and '.join(PREDEFINED_ROLES)}",
                       "permissions": permissions(), "predefined_roles": list(PREDEFINED_ROLES),
                       "custom_role": custom_role(project)},
        "nodes": {"attach": "the compute nodes need no permission (the watcher reads the "
                  "metadata server)", "permissions": []},
    }
