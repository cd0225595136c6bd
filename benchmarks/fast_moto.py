"""One speed fix for moto in the benchmarks: an EC2 resource's tags looked up by its id.

moto 5.2's ``TaggedEC2Resource.get_tags`` scans every tag of every resource for each instance
it describes, so a DescribeInstances of N tagged instances costs N x (all tags): ~40 s at
1000 instances, ~15 min at 5000 on this machine. :func:`patch` replaces it with a lookup in the
same tag store; the answers are the same, only the fake gets faster. slurm-spot's own code is
untouched (the tests use moto as it is).
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
