"""``SlurmClient.jobs(ids)`` returns only the jobs asked for: Slurm 22.05's ``squeue --json``
ignores ``--jobs`` and lists every job it holds (seen on the real slurmctld in
tests/test_aws_e2e.py: the watcher read a finished job's state instead of the requeued one's)."""

from __future__ import annotations

import json

from slurm_spot.slurm.client import CommandResult, SlurmClient

# What squeue 22.05 printed for `squeue --json --jobs 2` (trimmed): both jobs.
ALL_JOBS = {"jobs": [
    {"job_id": 1, "job_state": "COMPLETED", "name": "wrap", "restart_cnt": 0},
    {"job_id": 2, "job_state": "COMPLETING", "name": "wrap", "restart_cnt": 1},
    {"job_id": 8, "job_state": "PENDING", "name": "arr", "array_job_id": 7, "array_task_id": 1},
]}


def _client(argvs: list[list[str]]) -> SlurmClient:
    def runner(argv: list[str], timeout_s: float) -> CommandResult:
        argvs.append(argv)
        return CommandResult(argv, 0, json.dumps(ALL_JOBS), "")

    return SlurmClient("/usr/bin", runner=runner)


def test_jobs_by_id_drops_the_jobs_squeue_lists_anyway() -> None:
    argvs: list[list[str]] = []
    found = _client(argvs).jobs([2])
    assert [(j.job_id, j.state.base, j.restarts) for j in found] == [(2, "COMPLETING", 1)]
    assert argvs == [["/usr/bin/squeue", "--json", "--jobs", "2"]]


def test_ids_are_unique_job_ids_never_a_whole_array() -> None:
    """Task 1 of array 1 has unique id 1 (Slurm reuses the array's id for one task), task 0
    has id 2: asking for job 1 must not return task 0 too."""
    array = {"jobs": [
        {"job_id": 1, "job_state": "PENDING", "array_job_id": 1, "array_task_id": 1},
        {"job_id": 2, "job_state": "RUNNING", "array_job_id": 1, "array_task_id": 0},
    ]}

    def runner(argv: list[str], timeout_s: float) -> CommandResult:
        if argv[1:3] == ["-h", "-j"]:  # job_ref's lookup: squeue -h -j N -o "%A %F %K"
            return CommandResult(argv, 0, "1 1 1\n", "")
        return CommandResult(argv, 0, json.dumps(array), "")

    client = SlurmClient("/usr/bin", runner=runner)
    assert [(j.job_id, j.state.base) for j in client.jobs([1])] == [(1, "PENDING")]
    assert [j.job_id for j in client.jobs()] == [1, 2]
    assert client.jobs([]) == [] and client.jobs([99]) == []
    # scancel/scontrol get the task's own name, not "1" (which means the whole array).
    assert client.job_ref(1) == "1_1" and client.job_ref("777") == "777"
