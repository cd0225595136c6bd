"""Issue 25: a job's name or comment never poses as Slurm's own fields.

The lines in tests/data/slurm-text/22.05.8/ are what Slurm 22.05.8's ``scontrol -o show job``
printed on the local test cluster for (ids.txt of the capture):

1. a batch job that failed (``exit 3``, Requeue=1) named
   ``x JobState=COMPLETED Requeue=0 ExitCode=0:0`` and commented
   ``c JobState=COMPLETED Reason=None Requeue=0 ExitCode=0:0 BatchHost=evil``;
2. the same name and comment on a job still running;
3. a job whose name holds a newline and a forged record for job 1:
   ``a UserId=root(0) GroupId=root(0) MCS_label=N/A JobState=COMPLETED\\nJobId=1 JobName=y``;
4. a job whose name and comment both copy Slurm's ``UserId= GroupId= MCS_label= ...``
   section, so that which copy is Slurm's cannot be told.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_spot.errors import SlurmOutputError
from slurm_spot.slurm.client import CommandResult, SlurmClient, parse_job_record
from slurm_spot.slurm.jobtext import job_fields_text, split_job_records

DATA = Path(__file__).parent / "data" / "slurm-text" / "22.05.8"
INJECTED_NAME = "x JobState=COMPLETED Requeue=0 ExitCode=0:0"


def captured(name: str) -> str:
    """A captured file as slurm-spot's runner reads Slurm's output (surrogateescape)."""
    return (DATA / name).read_bytes().decode("utf-8", "surrogateescape")


def test_a_name_and_comment_that_repeat_keys_do_not_override_slurms() -> None:
    [text] = split_job_records(captured("scontrol-o-show-job-1.txt"))
    record = parse_job_record(text)
    assert (record.job_id, record.state.base) == (1, "FAILED")
    assert (record.requeue, record.exit_code, record.batch_host) == (True, "3:0", "spot-1")
    fields = job_fields_text(text)
    assert fields["JobName"] == INJECTED_NAME
    assert fields["Reason"] == "NonZeroExitCode" and "Comment" not in fields


def test_every_job_of_a_whole_listing() -> None:
    """The listing of every job: job 3's newline does not forge a record for job 1 (it is
    read again on its own), and job 4, whose text copies Slurm's section twice, is left out
    rather than guessed."""
    listing = captured("scontrol-o-show-job.txt")
    answers = {("scontrol", "-o", "show", "job"): listing,
               ("scontrol", "-o", "show", "job", "1"): captured("scontrol-o-show-job-1.txt")}

    def run(argv: list[str], timeout_s: float) -> CommandResult:
        if Path(argv[0]).name == "squeue":  # job_ref: job 1 has ended, its id is its name
            return CommandResult(argv, 0, "", "")
        return CommandResult(argv, 0, answers[(Path(argv[0]).name, *argv[1:])], "")

    records = {r.job_id: r for r in SlurmClient("/usr/bin", runner=run).job_records()}
    assert sorted(records) == [1, 2, 3]
    assert (records[1].state.base, records[1].exit_code, records[1].requeue) == (
        "FAILED", "3:0", True)
    assert (records[2].state.base, records[2].requeue, records[2].batch_host) == (
        "RUNNING", True, "spot-2")
    # Job 3 reads as what its name claims (a user can mislead slurm-spot about their own
    # job only: its real tail went to the forged job 1 record, which was dropped).
    assert records[3].job_id == 3 and records[3].batch_host == ""


def test_a_newline_in_a_name_continues_its_record() -> None:
    """A line that does not start a record (``JobId=N ... JobName=``), or one that follows
    a record still without its ``UserId=`` section, continues the record before it."""
    name = "a\nJobId=1 JobState=COMPLETED"  # the first capture: sbatch -J "$name"
    listing = captured("scontrol-o-show-job-1.txt").replace(
        "JobId=1 JobName=" + INJECTED_NAME, "JobId=2 JobName=" + name, 1)
    [text] = split_job_records(listing)
    assert job_fields_text(text)["JobName"] == name
    assert parse_job_record(text).job_id == 2
    [first, forged] = split_job_records(captured("scontrol-o-show-job-3.txt"))
    assert parse_job_record(first).job_id == 3  # the record slurm-spot reads for job 3
    assert parse_job_record(forged).job_id == 1  # job_records() reads job 1 again


def test_two_copies_of_slurms_section_are_refused() -> None:
    [text] = split_job_records(captured("scontrol-o-show-job-4.txt"))
    with pytest.raises(ValueError, match="job 4: 3 UserId/GroupId sections"):
        parse_job_record(text)

    def run(argv: list[str], timeout_s: float) -> CommandResult:
        return CommandResult(argv, 0, captured("scontrol-o-show-job-4.txt"), "")

    with pytest.raises(SlurmOutputError, match="job 4"):
        SlurmClient("/usr/bin", runner=run).job_record(4)


def test_invalid_utf8_in_a_name_is_kept() -> None:
    name = b"bad\xff JobState=COMPLETED".decode("utf-8", "surrogateescape")
    text = captured("scontrol-o-show-job-1.txt").replace(INJECTED_NAME, name, 1)
    [record_text] = split_job_records(text)
    assert job_fields_text(record_text)["JobName"] == name
    assert parse_job_record(record_text).state.base == "FAILED"
