"""Interruption requeues recorded in the job's AdminComment (what sacct shows)."""

from __future__ import annotations

from tests.fakes.fake_slurm import FakeSlurm


def test_notes_are_appended_and_one_bad_job_does_not_stop_the_others() -> None:
    slurm = FakeSlurm()
    slurm.add_job(7, ["spot-1"], state="PENDING")
    slurm.add_job(8, ["spot-2"], state="PENDING").admin_comment = "site note"
    client = slurm.client()
    errors = client.record_interruption([99, 7, 8], "requeued: spot-interruption:terminate@X")
    assert len(errors) == 1 and "job 99" in errors[0]
    assert slurm.jobs[7].admin_comment == "requeued: spot-interruption:terminate@X"
    assert slurm.jobs[8].admin_comment == "site note; requeued: spot-interruption:terminate@X"
    client.record_interruption([7], "requeued: again")
    assert slurm.jobs[7].admin_comment == ("requeued: spot-interruption:terminate@X; "
                                           "requeued: again")


def test_the_comment_keeps_its_newest_1000_characters() -> None:
    slurm = FakeSlurm()
    slurm.add_job(7, ["spot-1"]).admin_comment = "x" * 990
    slurm.client().record_interruption([7], "requeued: newest")
    comment = slurm.jobs[7].admin_comment
    assert len(comment) == 1000 and comment.endswith("; requeued: newest")


def test_a_name_supplies_no_earlier_note() -> None:
    """Issue 25: ``sbatch -J 'x AdminComment=evil'`` does not put ``evil`` into the note."""
    slurm = FakeSlurm()
    slurm.add_job(7, ["spot-1"], state="PENDING").name = "x AdminComment=evil Comment=y"
    slurm.client().record_interruption([7], "requeued: X")
    assert slurm.jobs[7].admin_comment == "requeued: X"


def test_a_name_with_a_newline_forges_no_other_jobs_record() -> None:
    """Job 8's name starts a line that looks like job 7's record (its real tail, with job
    8's AdminComment, follows): job 7 keeps its own note."""
    slurm = FakeSlurm()
    slurm.add_job(7, ["spot-1"], state="PENDING").admin_comment = "site note"
    job8 = slurm.add_job(8, ["spot-2"], state="PENDING")
    job8.name = "a UserId=u(1) GroupId=u(1) MCS_label=N/A\nJobId=7 JobName=y"
    job8.admin_comment = "evil"
    assert slurm.client().record_interruption([7, 8], "requeued: X") == []
    assert slurm.jobs[7].admin_comment == "site note; requeued: X"
