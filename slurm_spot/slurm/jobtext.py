"""Reading ``scontrol -o show job`` text so that what a user writes cannot pose as Slurm's fields.

A job's name, comment, work dir, output paths, features... are the user's free text, printed
as they are: a name ``x JobState=COMPLETED Requeue=0 ExitCode=0:0`` repeats keys, and a name
with a newline even starts a line that looks like another job's record. Slurm 22.05's
scontrol has no ``--json`` (it exits 1: "unrecognized option"), so the text is read by the
order scontrol prints its keys in (``slurm_sprint_job_info``, src/api/job_info.c, 22.05 to
26.05):

``JobId=N`` [``ArrayJobId= ArrayTaskId= ...``] [``HetJobId= HetJobOffset= ...``]
``JobName=<user text>`` ``UserId=user(uid) GroupId=group(gid) MCS_label=...`` then Slurm's own
keys (``JobState`` ... ``ExitCode`` ... ``SubmitTime`` ... ``NodeList BatchHost NumNodes`` ...;
a state reason has its spaces replaced by ``_``) up to ``Features=``, after which users' text
comes again (``Features``, ``Network``, ``Command``, ``WorkDir``, ``Comment``, ``StdOut``...).

So the keys slurm-spot acts on are read only from the head and from the Slurm-written section
that starts at the one ``UserId=<name>(<uid>) GroupId=<name>(<gid>) MCS_label=`` of the record.
A record holding two such sections (a user copied one into a name and a comment) cannot be
told apart from its copy: it is refused (:class:`ValueError`) rather than guessed.
"""

from __future__ import annotations

import re

# JobId, then Slurm's keys before JobName (ArrayJobId, ArrayTaskId, HetJobId, HetJobOffset...;
# any other a later release adds), whose values hold no space: the first " JobName=" is Slurm's.
_HEAD = re.compile(r"JobId=(?P<id>\d+)(?: [A-Z][A-Za-z0-9_:/]*=\S*)*? JobName=")
# Where Slurm's own keys start after the name: UserId=name(uid) GroupId=name(gid) MCS_label=.
_SECTION_START = re.compile(r" UserId=\S*\(\d+\) GroupId=\S*\(\d+\) MCS_label=")
# The first key after Slurm's own section whose value is a user's text.
_SECTION_END = re.compile(r" (?:Features|Prefer|Reservation|Network|Command|WorkDir|"
                          r"AdminComment|SystemComment|Comment|StdErr|StdIn|StdOut)=")
_KEY = re.compile(r"(?:^|(?<= ))[A-Z][A-Za-z0-9_/:]*=")


def split_job_records(stdout: str) -> list[str]:
    """The records of ``scontrol -o show job`` output, one string each.

    scontrol prints one job a line, but a name or comment may hold newlines; a line that does
    not start ``JobId=<digits> [Array.../HetJob... keys] JobName=``, or a record that lacks
    its ``UserId=... GroupId=... MCS_label=`` section so far, continues the record before it
    (joined with ``\\n``, as the user wrote it).
    """
    records: list[str] = []
    for line in stdout.split("\n"):
        starts_record = _HEAD.match(line) is not None
        if records and (not starts_record or _SECTION_START.search(records[-1]) is None):
            records[-1] += "\n" + line
        elif starts_record:
            records.append(line)
    return [r.rstrip("\n") for r in records]


def job_fields_text(record: str) -> dict[str, str]:
    """``{key: value}`` of one ``scontrol -o show job`` record (:func:`split_job_records`),
    for the keys a user cannot write: ``JobId``, the array and heterogeneous-job keys, and
    Slurm's section from ``UserId`` up to ``Features`` (``JobState``, ``Reason``, ``Requeue``,
    ``Restarts``, ``BatchFlag``, ``ExitCode``, the times, ``Partition``, ``NodeList``,
    ``BatchHost``, ``NumNodes``, ``TRES``...); plus ``JobName``, the name exactly as printed.
    The user's other text (``Comment``, ``WorkDir``, ``StdOut``...) is not returned.

    Raises:
        ValueError: not a job record, no ``UserId=... GroupId=... MCS_label=`` section, or
            two of them (a user's text copies one: which is Slurm's cannot be told).
    """
    head = _HEAD.match(record)
    if head is None:
        raise ValueError(f"not a job record: {record[:80]!r}")
    sections = list(_SECTION_START.finditer(record, head.end() - 1))
    if len(sections) != 1:
        what = "no" if not sections else f"{len(sections)}"
        raise ValueError(f"job {head.group('id')}: {what} UserId/GroupId sections in its "
                         "record; a name or comment that copies one is not read")
    start = sections[0].start()
    end_match = _SECTION_END.search(record, start)
    section = record[start + 1: end_match.start() if end_match else len(record)]
    fields = _key_values(record[: head.end() - len(" JobName=")])
    fields["JobName"] = record[head.end(): start]
    for key, value in _key_values(section).items():
        fields.setdefault(key, value)
    return fields


def _key_values(text: str) -> dict[str, str]:
    """``Key=value`` words of Slurm-written text (values may hold ``=``, never ``" Key="``)."""
    starts = [m.start() for m in _KEY.finditer(text)]
    found: dict[str, str] = {}
    for i, start in enumerate(starts):
        end = starts[i + 1] - 1 if i + 1 < len(starts) else len(text)
        key, _, value = text[start:end].partition("=")
        found.setdefault(key, value.strip())
    return found


def job_fields_with_user_text(record: str) -> dict[str, str]:
    """:func:`job_fields_text` plus the keys whose values are the user's own text
    (``Features``, ``WorkDir``, ``StdOut``, ``TresPerNode``...; where a comment repeats such a
    key, the first copy): for code that acts for the job's own user (the elastic agent's
    companion job, the demo), never for decisions slurm-spot takes as root.

    Raises:
        ValueError: as :func:`job_fields_text`.
    """
    from slurm_spot.slurm.states import parse_oneline

    return {**parse_oneline(record), **job_fields_text(record)}


def admin_comment_text(record: str) -> str:
    """The ``AdminComment`` of one ``scontrol -o show job`` record ("" when unset): looked for
    only after Slurm's own section (scontrol 22.05-26.05 prints it after ``WorkDir``), so a
    name cannot supply it; it runs to the next ``" Key="``.

    Raises:
        ValueError: as :func:`job_fields_text`.
    """
    job_fields_text(record)  # the record is one whose section can be told
    start = _SECTION_START.search(record)
    end = _SECTION_END.search(record, start.end() if start else 0)
    found = re.compile(r" AdminComment=(.*?)(?= [A-Za-z:/]+=|$)", re.S).search(
        record, end.start() if end else len(record))
    value = found.group(1).strip() if found else ""
    return "" if value == "(null)" else value
