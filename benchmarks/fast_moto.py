"""Speed fixes for moto in the benchmarks: the same answers, only the fake gets faster.

- moto 5.2's ``TaggedEC2Resource.get_tags`` scans every tag of every resource for each
  instance it describes, so a DescribeInstances of N tagged instances costs N x (all tags):
  ~40 s at 1000 instances, ~15 min at 5000 on this machine. It becomes a lookup in the same
  tag store.
- Its instance lookups by id (``get_instance``, ``get_instance_by_id``,
  ``get_multi_instances_by_id``, ``all_instances``) go through ``all_reservations()``, which
  copies every reservation each time: CreateTags on 1000 instances checks each id that way
  (N x N copies, ~30 s for 300 instances here), TerminateInstances likewise. They now walk
  the same reservations without copying them (none of them changes a reservation).
- Its response serializer works out, for every field of every record, which attribute of the
  Python object holds the value (alias providers asked per call) and which response
  transformer applies: ~30 ms per instance of a DescribeInstances here, so a page of 1000
  took longer than slurm-spot's 30 s read timeout. Both answers depend only on the object's
  class, the field and its shape, so they are worked out once per such triple.

slurm-spot's own code is untouched (the tests use moto as it is).
"""

from __future__ import annotations

from typing import Any


def patch() -> None:
    """Make moto's EC2 tag lookups per resource O(its tags)."""
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    def get_tags(self: Any) -> list[dict[str, str]]:
        if not self.id:
            return []
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(self.id), "")
        return [{"resource_id": self.id, "key": k, "value": v, "resource_type": kind}
                for k, v in self.ec2_backend.tags.get(self.id, {}).items()]

    TaggedEC2Resource.get_tags = get_tags  # type: ignore[method-assign]

    from moto.ec2.exceptions import InvalidInstanceIdError
    from moto.ec2.models.instances import InstanceBackend

    def each(self: Any) -> Any:
        for reservation in list(self.reservations.values()):
            yield from reservation.instances

    def all_instances(self: Any, filters: Any = None) -> list[Any]:
        return [i for i in each(self) if i.applies(filters)]

    def get_instance_by_id(self: Any, instance_id: str) -> Any:
        return next((i for i in each(self) if i.id == instance_id), None)

    def get_instance(self: Any, instance_id: str) -> Any:
        found = get_instance_by_id(self, instance_id)
        if found is None:
            raise InvalidInstanceIdError(instance_id)
        return found

    def get_multi_instances_by_id(self: Any, instance_ids: list[str],
                                  filters: Any = None) -> list[Any]:
        known = {i.id: i for i in each(self)}
        missing = [i for i in instance_ids if i not in known]
        if missing:
            raise InvalidInstanceIdError(missing)
        return [known[i] for i in instance_ids if known[i].applies(filters)]

    InstanceBackend.all_instances = all_instances  # type: ignore[method-assign]
    InstanceBackend.get_instance_by_id = get_instance_by_id  # type: ignore[method-assign]
    InstanceBackend.get_instance = get_instance  # type: ignore[method-assign]
    InstanceBackend.get_multi_instances_by_id = (  # type: ignore[method-assign]
        get_multi_instances_by_id)

    from moto.core import serialize

    keys_of: dict[tuple[Any, ...], tuple[Any, list[str]]] = {}
    transform_of: dict[tuple[int, str], Any] = {}

    def pick(self: Any, context: Any) -> Any:
        where = (type(self), type(context.obj), context.key, id(context.shape))
        known = keys_of.get(where)
        if known is None or known[0] is not context.shape:
            known = keys_of[where] = (context.shape, list(self.get_possible_keys(context)))
        obj = context.obj
        for key in known[1]:
            value = serialize.get_value(obj, key, serialize.MISSING)
            if value is not serialize.MISSING:
                break
        else:
            value = None
        key_path = f"{context.key_path}.{context.key}"
        slot = (id(self.response_transformers), key_path)
        if slot not in transform_of:
            transform_of[slot] = next((fn for path, fn in self.response_transformers.items()
                                       if key_path.endswith(path)), None)
        transform = transform_of[slot]
        return transform(value) if transform is not None else value

    serialize.AttributePicker.__call__ = pick  # type: ignore[method-assign]
