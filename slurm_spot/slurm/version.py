"""Which Slurm runs, and what it offers: every version check of slurm-spot lives here.

A :class:`SlurmVersion` is built once from ``slurmctld -V`` (or ``scontrol -V`` / ``sinfo
--version``, or ``render --slurm-version``) and answers feature questions; callers never compare
version numbers themselves. Each feature names the release that brought it and where that is
written down: the NEWS file and man pages that Debian's packages ship (``slurm-wlm`` 24.11.5 of
trixie and 26.05.5 of forky: /usr/share/doc/slurm-wlm/NEWS.gz, scontrol(1), slurm.conf(5)), and
the "Release Notes for Slurm 25.11" (https://slurm.schedmd.com/news.html). The matrix in
``tests/`` runs 22.05, 24.11 and 26.05 (README, "Slurm versions").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering

from packaging.version import InvalidVersion, Version

from slurm_spot.errors import BadInputError

_VERSION_RE = re.compile(r"(?<![\d.])(\d{2})\.(\d{2})(?:\.(\d+))?")

# data_parser plugin version of each release's --json output (slurm.schedmd.com/rest.html:
# "v0.0.38" 22.05 ... "v0.0.45" 26.05); the JSON parsers accept all of them.
DATA_PARSERS = {
    (22, 5): "v0.0.38", (23, 2): "v0.0.39", (23, 11): "v0.0.40", (24, 5): "v0.0.41",
    (24, 11): "v0.0.42", (25, 5): "v0.0.43", (25, 11): "v0.0.44", (26, 5): "v0.0.45",
}


@total_ordering
@dataclass(frozen=True)
class SlurmVersion:
    """A Slurm release, e.g. ``SlurmVersion.parse("slurm 24.11.5")``.

    ``release`` is a :class:`packaging.version.Version` (``24.11.5``; ``24.11`` when only the
    series is known). Ordering compares releases.
    """

    release: Version

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        """From ``slurm 24.11.5``, ``slurm-wlm 22.05.8``, ``24.11``, ``26.05.5-1``...

        Raises:
            BadInputError: no ``YY.MM[.P]`` Slurm version in ``text``.
        """
        match = _VERSION_RE.search(text.strip())
        if not match:
            raise BadInputError(f"{text.strip()!r} is not a Slurm version such as 23.11 or 24.11.5")
        major, minor, patch = match.group(1), match.group(2), match.group(3)
        try:
            release = Version(f"{int(major)}.{int(minor)}" + (f".{int(patch)}" if patch else ""))
        except InvalidVersion:  # pragma: no cover - the regex admits only digits
            raise BadInputError(f"{text!r} is not a Slurm version") from None
        return cls(release)

    @classmethod
    def of(cls, value: SlurmVersion | tuple[int, int] | str | None) -> SlurmVersion | None:
        """Accept a version, a ``(major, minor)`` tuple, a string, or None (unknown)."""
        if value is None or isinstance(value, SlurmVersion):
            return value
        if isinstance(value, tuple):
            return cls(Version(f"{value[0]}.{value[1]}"))
        return cls.parse(value)

    @classmethod
    def detect(cls, sbin_dir: str = "/usr/sbin", bin_dir: str = "/usr/bin",
               timeout_s: float = 10) -> SlurmVersion | None:
        """The installed Slurm, or None when no Slurm program answers.

        ``slurmctld -V`` comes first (the controller is what the rendered slurm.conf is for);
        ``scontrol -V`` next; ``sinfo --version`` last, as it fails on 22.05 without a
        reachable slurm.conf.
        """
        from slurm_spot.errors import SlurmCommandError
        from slurm_spot.slurm.client import run_command  # the one runner; it imports this module

        for argv in ([f"{sbin_dir}/slurmctld", "-V"], ["slurmctld", "-V"],
                     [f"{bin_dir}/scontrol", "-V"], [f"{bin_dir}/sinfo", "--version"]):
            try:
                out = run_command(argv, timeout_s).stdout
            except SlurmCommandError:
                continue
            if _VERSION_RE.search(out):
                return cls.parse(out)
        return None

    # -- identity ---------------------------------------------------------------------------
    @property
    def series(self) -> tuple[int, int]:
        """``(24, 11)`` for 24.11.5."""
        return self.release.major, self.release.minor

    def at_least(self, major: int, minor: int) -> bool:
        return self.series >= (major, minor)

    def __str__(self) -> str:
        major, minor = self.series
        micro = f".{self.release.micro}" if len(self.release.release) > 2 else ""
        return f"{major}.{minor:02d}{micro}"

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SlurmVersion):
            return NotImplemented
        return self.release < other.release

    # -- features ---------------------------------------------------------------------------
    @property
    def partition_power_options(self) -> bool:
        """``SuspendTime``/``ResumeTimeout`` per partition (slurm.conf(5), 23.02+)."""
        return self.at_least(23, 2)

    @property
    def powered_down_weight(self) -> bool:
        """Node ``Weight`` orders powered-down (``idle~``) nodes. Before 23.02 slurmctld gave a
        node set whose nodes are all powered down the reboot weight (INFINITE-1) in place of
        its Weight, so such nodes tie and the lowest node index wins, and the node table is
        sorted by name (``strnatcmp``): NEWS, "Changes in Slurm 23.02.0rc1": "Make node
        weight usable for powered down and rebooting nodes."; measured on 22.05.8 by
        tests/test_weight_order_e2e.py. Powered-up nodes still go first on every release
        (slurm.conf(5), Weight)."""
        return self.at_least(23, 2)

    @property
    def addr_cache_options(self) -> bool:
        """``CommunicationParameters=NoAddrCache`` and ``SlurmctldParameters=cloud_reg_addrs``
        are needed, and known. 23.11 removed both (NEWS, "Changes in Slurm 23.11.0rc1": "Remove
        cloud_reg_addrs and make it default behavior.", "Remove NoAddrCache
        CommunicationParameter."); slurmctld 24.11.5 and 26.05.5 log each as "defunct"."""
        return not self.at_least(23, 11)

    @property
    def instance_fields(self) -> bool:
        """Nodes carry ``InstanceId`` and ``InstanceType`` (``scontrol update nodename=N
        instanceid=... instancetype=...``, shown by ``scontrol show node``): NEWS, "Changes in
        Slurm 23.11.0rc1": "Add cloud instance id and instance type to node records";
        scontrol(1) 24.11: "InstanceId=<instance_id> Cloud instance ID."."""
        return self.at_least(23, 11)

    @property
    def power_down_force_command(self) -> bool:
        """``scontrol power down force <nodes>``: NEWS, "Changes in Slurm 24.05.0rc1":
        "scontrol - Add new subcommand 'power' for node power control."; scontrol(1) 24.11:
        "power {up|down} [asap|force] {ALL|<NodeList>|<NodeSet>} ... This subcommand
        obsoletes the prior usage of scontrol's update command: scontrol update
        NodeName=<nodes> State={POWER_UP|POWER_DOWN|POWER_DOWN_ASAP|POWER_DOWN_FORCE}".
        It takes no reason."""
        return self.at_least(24, 5)

    @property
    def expedited_requeue(self) -> bool:
        """``sbatch --requeue=expedite`` (25.11+, https://slurm.schedmd.com/news.html, Release
        Notes for Slurm 25.11: "Expedited requeue jobs are eligible to restart immediately,
        are treated as the highest priority job"), so no ``StartTime=now`` is needed for them.
        Only where slurm.conf allows it: sbatch(1) 26.05, "This will only happen if expedited
        requeues are allowed globally with the SlurmctldParameters=enable_expedited_requeue"
        (rendered by slurm_spot.render.slurm_parameters)."""
        return self.at_least(25, 11)

    @property
    def requeue_delay(self) -> bool:
        """``SchedulerParameters=requeue_delay=<seconds>`` (25.11+; slurm.conf(5) 26.05:
        "Delay before a non-Expedited Requeue job is eligible to run after being requeued.
        Defaults to the AuthInfo=cred_expire setting, which itself defaults to 120
        seconds"); before, a requeued job always waits ~121 s (Reason=BeginTime)."""
        return self.at_least(25, 11)

    @property
    def power_actions(self) -> bool:
        """``PowerAction=<name> Location=<slurmctld|slurmd> Program="<path> [args]"`` (26.05,
        slurm.conf(5) "POWERACTION CONFIGURATION"): a named program usable in place of a
        path in ResumeProgram/SuspendProgram/ResumeFailProgram/RebootProgram and selectable
        per request (``scontrol power ... action=<name>``). Plain program paths stay valid,
        and a power-up action must run on slurmctld anyway, so slurm-spot keeps rendering
        its hook paths on every release; nothing else about resume/suspend changes."""
        return self.at_least(26, 5)

    @property
    def suspend_exc_counts_busy(self) -> bool:
        """``SuspendExcNodes=<nodes>:<N>`` counts the set's busy nodes among its N (24.05+).
        slurm.conf(5) 22.05: it "will prevent 4 usable nodes (i.e IDLE and not DOWN, DRAINING
        or already powered down)" from being powered down, and 22.05's
        ``src/slurmctld/power_save.c`` ``_pick_exc_nodes`` keeps N idle nodes (so through
        23.11); from 24.05 the man page says "4 powered up nodes" and ``_pick_exc_nodes``
        subtracts the set's active (allocated, not powering or drained) nodes from N first,
        so N busy nodes leave no idle node kept. ``scontrol update SuspendExcNodes=`` (23.02+,
        scontrol(1)) sets it at run time."""
        return self.at_least(24, 5)

    @property
    def multiple_prolog_slurmctld(self) -> bool:
        """Several ``PrologSlurmctld`` lines run side by side (24.05+: slurm.conf(5) 24.11,
        PrologSlurmctld: "It is possible to configure multiple prolog scripts by including
        this option on multiple lines."; Slurm commit "Allow multiple Prolog/Epilog/
        PrologSlurmctld/EpilogSlurmctld scripts to run.", first in slurm-24-05-0-0rc1).
        Before, slurm.conf holds one, so slurm-spot's (:mod:`slurm_spot.lifecycle.bootwait`) and a
        site's own cannot both run. Every release needs slurm-spot's: a job on powered-up
        nodes is launched on slurmctld's 30 s periodic check otherwise (docs/admin.md)."""
        return self.at_least(24, 5)

    @property
    def scontrol_json(self) -> bool:
        """``scontrol show node --json`` (23.02+; 22.05's scontrol has no ``--json``)."""
        return self.at_least(23, 2)

    @property
    def data_parser(self) -> str:
        """The data_parser version of this release's ``--json`` output (``v0.0.42``)."""
        known = [s for s in DATA_PARSERS if s <= self.series]
        return DATA_PARSERS[max(known)] if known else DATA_PARSERS[(22, 5)]

    def features(self) -> dict[str, bool]:
        """Every feature flag by name (for ``render --json`` and the docs)."""
        names = ("partition_power_options", "addr_cache_options", "instance_fields",
                 "power_down_force_command", "expedited_requeue", "requeue_delay",
                 "power_actions", "multiple_prolog_slurmctld", "scontrol_json")
        return {name: bool(getattr(self, name)) for name in names}


OLDEST_SUPPORTED = SlurmVersion(Version("22.5"))
"""The oldest Slurm slurm-spot supports and tests (Debian 12's 22.05.8)."""
