"""sbatch's command-line options, and ``slurm-spot sbatch``'s own among them (pure).

The table is the union of the OPTIONS sections of sbatch(1) of Slurm 22.05.8, 24.11 and 26.05
(Debian's packages, the versions of the test matrix, docs/slurm-versions.md): per long option,
whether it takes a value that may be the next word (``--partition spot``), only an attached
one (``--requeue=expedite``, ``--exclusive=user``), or none; per short option, its long one.

sbatch parses its command line with getopt_long(3): a long option may be abbreviated to any
prefix that names one option only, and an option that takes a value takes the next word when
none is attached. :func:`parse_command_line` does the same over sbatch's options and
slurm-spot's, so an option of either kind may come anywhere before the script, and an
abbreviation is resolved, or refused when it names no option or several (never passed on to
sbatch with the following words shifted: ``--pars job.sh`` must not become ``--pars=job.sh``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from slurm_spot.errors import BadInputError

#: Long options that take a value, attached (``--nodes=2``) or as the next word (``--nodes 2``).
REQUIRED_VALUE = frozenset({
    "account", "acctg-freq", "array", "batch", "bb", "bbf", "begin", "chdir",
    "cluster-constraint", "clusters", "comment", "constraint", "container", "container-id",
    "container-type", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
    "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error", "exclude",
    "export", "export-file", "extra", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus",
    "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "input",
    "job-name", "kill-on-invalid-dep", "licenses", "mail-type", "mail-user", "mcs-label", "mem",
    "mem-bind", "mem-per-cpu", "mem-per-gpu", "mem-update", "mincpus", "network", "nodefile",
    "nodelist", "nodes", "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node",
    "ntasks-per-socket", "open-mode", "output", "partition", "power", "prefer", "priority",
    "profile", "qos", "reservation", "resources", "segment", "signal", "sockets-per-node",
    "switches", "thread-spec", "threads-per-core", "time", "time-min", "tmp", "tres-bind",
    "tres-per-task", "uid", "wait-all-nodes", "wckey", "wrap",
})
#: Long options whose value, if any, must be attached with ``=`` (getopt's optional_argument).
OPTIONAL_VALUE = frozenset({
    "exclusive", "get-user-env", "nice", "no-kill", "oom-kill-step", "propagate", "requeue",
    "resv-ports",
})
#: Long options that take no value.
NO_VALUE = frozenset({
    "consolidate-segments", "contiguous", "help", "hold", "ignore-pbs", "no-requeue",
    "overcommit", "oversubscribe", "parsable", "quiet", "reboot", "spread-job",
    "spread-segments", "stepmgr", "test-only", "usage", "use-min-nodes", "verbose", "version",
    "wait",
})
#: Short option -> its long option.
SHORT = {
    "A": "account", "a": "array", "b": "begin", "D": "chdir", "M": "clusters", "C": "constraint",
    "S": "core-spec", "c": "cpus-per-task", "d": "dependency", "m": "distribution", "e": "error",
    "x": "exclude", "B": "extra-node-info", "G": "gpus", "h": "help", "H": "hold", "i": "input",
    "J": "job-name", "L": "licenses", "k": "no-kill", "F": "nodefile", "w": "nodelist",
    "N": "nodes", "n": "ntasks", "o": "output", "O": "overcommit", "s": "oversubscribe",
    "p": "partition", "q": "qos", "Q": "quiet", "t": "time", "v": "verbose", "V": "version",
    "W": "wait",
}
SBATCH_LONG = REQUIRED_VALUE | OPTIONAL_VALUE | NO_VALUE

#: slurm-spot sbatch's own options: name -> takes a value.
OURS = {"torchrun": False, "dry-run": False, "json": False, "nproc-per-node": True,
        "python": True, "checkpoint-root": True, "s3-endpoint-url": True,
        "s3-addressing-style": True, "elastic": True, "rendezvous": True,
        "join-timeout": True, "coordinator-partition": True, "no-replacements": False,
        "no-preload": False, "fault-tolerant": True}


def resolve_long(name: str, ours: bool = True) -> str:
    """The full long option (without ``--``) that ``name`` spells or abbreviates, among
    sbatch's (and slurm-spot's with ``ours``), as getopt_long resolves it: an exact name
    first, else the one option it is a prefix of.

    Raises:
        BadInputError: ``name`` is a prefix of no option, or of several (names them).
    """
    known = SBATCH_LONG | set(OURS) if ours else SBATCH_LONG
    if name in known:
        return name
    matches = sorted(n for n in known if n.startswith(name)) if name else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise BadInputError(f"--{name} is ambiguous: it abbreviates "
                            + ", ".join(f"--{m}" for m in matches) + "; spell it out")
    raise BadInputError(
        f"--{name}: not an option of sbatch (Slurm 22.05-26.05) or of slurm-spot sbatch; if "
        "your sbatch has it, put it in a '#SBATCH' line of the script")


@dataclass
class CommandLine:
    """``slurm-spot sbatch``'s words, parsed: slurm-spot's options (full name -> value, True
    for a flag), sbatch's options as typed (abbreviations kept; sbatch resolves them the
    same way), the script (None: none given) and its arguments."""

    ours: dict[str, str | bool] = field(default_factory=dict)
    options: list[str] = field(default_factory=list)
    script: str | None = None
    script_args: list[str] = field(default_factory=list)
    help: bool = False


def parse_command_line(words: Sequence[str]) -> CommandLine:
    """Split ``[options] [--] SCRIPT [ARGS]``, options of sbatch and of slurm-spot mixed in
    any order before the script; everything after the script is the script's.

    Raises:
        BadInputError: an unknown or ambiguous long option, an unknown short one, or an option
            that needs a value given none (each names the option).
    """
    line = CommandLine()
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            i = _long(words, i, line)
        else:
            i = _short(words, i, line)
    if i < len(words):
        line.script, line.script_args = words[i], list(words[i + 1:])
    return line


def _long(words: Sequence[str], i: int, line: CommandLine) -> int:
    name, eq, value = words[i][2:].partition("=")
    full = resolve_long(name)
    needs = OURS[full] if full in OURS else full in REQUIRED_VALUE
    if eq and not needs and full not in OPTIONAL_VALUE:
        raise BadInputError(f"--{full} takes no value (got {words[i]!r})")
    if needs and not eq:
        if i + 1 >= len(words):
            raise BadInputError(f"option --{full} needs a value")
        value = words[i + 1]
    if full in OURS:
        if needs and full in line.ours and line.ours[full] != value:
            raise BadInputError(f"--{full} given twice ({line.ours[full]!r} and {value!r}): "
                                "give it once")
        line.ours[full] = value if needs else True
    elif full in ("help",):
        line.help = True
    else:
        line.options.append(words[i])
        if needs and not eq:
            line.options.append(value)
    return i + (2 if needs and not eq else 1)


def _short(words: Sequence[str], i: int, line: CommandLine) -> int:
    """``-H``, ``-vvv``, ``-N2``, ``-N 2``, ``-Hp spot`` (getopt's clustered flags)."""
    word = words[i]
    for at, letter in enumerate(word[1:], start=1):
        if letter not in SHORT:
            raise BadInputError(f"-{letter} (in {word!r}): not an option of sbatch")
        if SHORT[letter] == "help":
            line.help = True
            continue
        if SHORT[letter] in REQUIRED_VALUE:
            if at + 1 < len(word):  # attached: -N2
                line.options.append(word)
                return i + 1
            if i + 1 >= len(words):
                raise BadInputError(f"option -{letter} needs a value")
            line.options.extend([word, words[i + 1]])
            return i + 2
    if word != "-h":
        line.options.append(word.replace("h", "") if "h" in word else word)
    return i + 1


def canonical_option(word: str) -> str:
    """``--no-req`` -> ``--no-requeue``, ``--sig=USR1`` -> ``--signal=USR1`` (sbatch's options
    only); a word that is no option, or no single one, as given (sbatch reports it)."""
    if not word.startswith("--") or word == "--":
        return word
    name, eq, value = word[2:].partition("=")
    try:
        full = resolve_long(name, ours=False)
    except BadInputError:
        return word
    return f"--{full}{eq}{value}"


def split_clusters(options: Sequence[str]) -> list[str]:
    """``options`` with clustered short options split as getopt reads them (pure): ``-Hp``
    -> ``-H -p``, ``-HN2`` -> ``-H -N2``, ``-vvv`` -> ``-v -v -v``; the value word after an
    option that takes one, and every other word, unchanged. Lets a reader of one option
    (``-p``, ``-N``) find it inside a cluster."""
    out: list[str] = []
    i = 0
    while i < len(options):
        word = options[i]
        i += 1
        if word.startswith("--") or not word.startswith("-") or len(word) <= 2:
            out.append(word)
            if (word.startswith("--") and "=" not in word
                    and canonical_option(word)[2:] in REQUIRED_VALUE and i < len(options)):
                out.append(options[i])  # its value: never read as options
                i += 1
            elif (len(word) == 2 and SHORT.get(word[1]) in REQUIRED_VALUE
                    and i < len(options)):
                out.append(options[i])
                i += 1
            continue
        for at, letter in enumerate(word[1:], start=1):
            if SHORT.get(letter) in REQUIRED_VALUE:
                out.append("-" + word[at:])  # -N2 (value attached) or -p (value next)
                if at + 1 == len(word) and i < len(options):
                    out.append(options[i])
                    i += 1
                break
            out.append("-" + letter)
    return out
