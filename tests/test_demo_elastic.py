"""``slurm-spot demo --elastic``: what it reports from the training's events and sample log,
and the options it refuses (the run itself: tests/test_demo_elastic_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.localcluster.elastic_report import (
    LOSS_TOLERANCE,
    Interruption,
    check_samples,
    joins,
    match_interruptions,
    output_events,
    rounds,
    summary_lines,
    verdict,
    world_sizes,
)


def step(n: int, world: int, t: float, loss: float = 0.5) -> dict:
    return {"event": "step", "step": n, "epoch": 0, "loss": loss, "world_size": world, "time": t}


# A run as rank 0 logs it: 3 workers; a notice at t=104 (step 4 saved, world 2 from t=109);
# a replacement joins (regroup at step 6, world 3 at t=120); a kill at t=125 after step 8:
# the survivors resume from the checkpoint at step 6 and log step 7 again at t=133;
# a second replacement joins at step 9.
EVENTS = [
    {"event": "start", "step": 0, "world_size": 3, "time": 100.0},
    step(1, 3, 101.0), step(2, 3, 102.0), step(3, 3, 103.0), step(4, 3, 104.5),
    {"event": "leave", "step": 4, "leaving_ranks": [2], "time": 105.0},
    {"event": "resume", "step": 4, "world_size": 2, "time": 108.0},
    step(5, 2, 109.0), step(6, 2, 110.0),
    {"event": "regroup", "step": 6, "world_size": 2, "time": 115.0},
    {"event": "resume", "step": 6, "world_size": 3, "time": 119.0},
    step(7, 3, 120.0), step(8, 3, 121.0),
    {"event": "resume", "step": 6, "world_size": 2, "time": 131.0},
    step(7, 2, 133.0), step(8, 2, 134.0), step(9, 2, 135.0),
    {"event": "resume", "step": 9, "world_size": 3, "time": 150.0},
    step(10, 3, 151.5),
    {"event": "done", "step": 10, "loss": 0.1, "world_size": 3, "time": 152.0},
]


def test_world_sizes_and_rounds_from_rank_0_events() -> None:
    assert world_sizes(EVENTS) == [3, 2, 3, 2, 3]
    found = rounds(EVENTS)
    assert [(c.world_before, c.world_after) for c in found] == [(3, 2), (2, 3), (3, 2), (2, 3)]
    assert [c.saved_on_leave for c in found] == [True, True, False, False]
    notice, join1, kill, join2 = found
    # paused: last step before -> first step after
    assert notice.paused_s == 4.5 and notice.recomputed_steps == 0
    assert join1.paused_s == 10.0 and join1.resumed_from == 6
    assert kill.paused_s == 12.0 and kill.recomputed_steps == 2 and kill.resumed_from == 6
    assert join2.paused_s == 16.5


def test_a_node_replaced_in_the_same_round_and_a_last_round_without_steps_yet() -> None:
    """A lost node whose replacement was already waiting: the round keeps the world (3 ->
    3) and is still the interruption's; a round with no step after it has no pause yet."""
    events = [step(1, 3, 1.0), step(2, 3, 2.0),
              {"event": "resume", "step": 1, "world_size": 3, "time": 6.0},
              step(2, 3, 7.0), {"event": "resume", "step": 2, "world_size": 2, "time": 9.0}]
    same, last = rounds(events)
    assert (same.world_before, same.world_after, same.recomputed_steps) == (3, 3, 1)
    assert same.paused_s == 5.0 and last.paused_s is None
    (matched,) = match_interruptions([Interruption("notice", "spot-3", 3.0)], [same, last])
    assert matched["world_after"] == 3 and matched["saved_on_leave"] is False
    assert world_sizes(events) == [3]


def test_interruptions_match_the_next_shrink_after_each_reclaim() -> None:
    found = rounds(EVENTS)
    caused = [Interruption("notice", "spot-3", 104.0), Interruption("no-notice", "spot-2", 125.0)]
    notice, kill = match_interruptions(caused, found)
    assert (notice["kind"], notice["node"], notice["paused_s"]) == ("notice", "spot-3", 4.5)
    assert notice["resumed_after_s"] == 4.0
    assert (kill["kind"], kill["node"], kill["paused_s"]) == ("no-notice", "spot-2", 12.0)
    assert kill["recomputed_steps"] == 2
    # A reclaim the training never reacted to shows as such, not as another's change.
    (late,) = match_interruptions([Interruption("notice", "spot-4", 200.0)], found)
    assert late["paused_s"] is None and late["world_after"] is None


def test_joins_carry_the_replacement_that_started_before_them() -> None:
    """The job output as it comes: a companion's first line before the round it joined; the
    first companion joined in the round after the notice (world 3 -> 3); the second started
    before the survivors' round after a loss (3 -> 2) and grew the world 2 -> 3 after it."""
    text = "\n".join([
        json.dumps(step(1, 3, 1.0)), json.dumps(step(2, 3, 2.0)),
        "slurm-spot: replacement job 7 requested (2 agents running, ...)",
        "slurm-spot: replacement 7 on spot-4 joins job 3",
        json.dumps({"event": "leave", "step": 2, "leaving_ranks": [1], "time": 2.5}),
        json.dumps({"event": "resume", "step": 2, "world_size": 3, "time": 20.0}),
        json.dumps(step(3, 3, 21.0)),
        "slurm-spot: replacement 9 on spot-5 joins job 3",
        json.dumps({"event": "resume", "step": 2, "world_size": 2, "time": 30.0}),
        json.dumps(step(3, 2, 31.0)), "W1201 22:15:53 torch noise",
        json.dumps({"event": "regroup", "step": 3, "world_size": 2, "time": 40.0}),
        json.dumps({"event": "resume", "step": 3, "world_size": 3, "time": 45.0}),
        json.dumps(step(4, 3, 46.0)), "{not json"])
    events = output_events(text)
    assert [e["event"] for e in events].count("replacement") == 2
    same, lost, grown = rounds(events)
    assert same.replacement == {"job_id": "7", "node": "spot-4"} and same.saved_on_leave
    assert lost.replacement is None and grown.replacement == {"job_id": "9", "node": "spot-5"}
    (joined,) = joins(rounds(events))
    assert (joined["replacement_job"], joined["replacement_node"]) == ("9", "spot-5")
    assert (joined["world_before"], joined["world_after"], joined["paused_s"]) == (2, 3, 15.0)
    assert [j["replacement_job"] for j in joins(rounds(EVENTS))] == [None, None]


def rows(step_: int, world: int, epoch: int, samples_per_rank: list[list[int]],
         ranks: list[int] | None = None) -> list[str]:
    return [json.dumps({"step": step_, "epoch": epoch, "rank": r, "world": world,
                        "samples": samples_per_rank[r]})
            for r in (ranks if ranks is not None else range(world))]


def test_sample_check_sets_aside_the_work_lost_without_notice() -> None:
    # 2 samples a step, epochs of 4 samples (2 steps). World 2; steps 3 and 4 are run, the
    # node dies (step 4 only logged by rank 0), the survivor resumes from step 2.
    lines = [*rows(1, 2, 0, [[0], [1]]), *rows(2, 2, 0, [[2], [3]]),
             *rows(3, 2, 1, [[3], [1]]), *rows(4, 2, 1, [[0], [2]], ranks=[0]),
             *rows(3, 1, 1, [[3, 1]]), *rows(4, 1, 1, [[0, 2]]), *rows(5, 1, 2, [[1, 0]])]
    check = check_samples(lines, steps=5, per_epoch_samples=4)
    assert check.problems == []
    assert (check.steps, check.epochs, check.whole_epochs, check.rerun_steps) == (5, 3, 2, 2)


def test_sample_check_finds_a_sample_twice_a_missing_step_and_a_missing_rank() -> None:
    twice = [*rows(1, 2, 0, [[0], [1]]), *rows(2, 2, 0, [[1], [3]])]
    assert check_samples(twice, 2, 4).problems == ["epoch 0: a sample used twice"]
    gap = [*rows(1, 1, 0, [[0, 1]]), *rows(3, 1, 1, [[2, 3]])]
    assert check_samples(gap, 3, 4).problems[0] == "steps missing: [2]"
    short = [*rows(1, 2, 0, [[0], [1]], ranks=[0])]
    assert "step 1: ranks [0] of a world of 2" in check_samples(short, 1, 4).problems


def result(**overrides: object) -> dict:
    base = {
        "job_id": 3, "state": "COMPLETED", "restarts": 0, "steps": 10, "wall_s": 200.0,
        "world_sizes": [3, 2, 3, 2, 3],
        "interruptions": match_interruptions([Interruption("notice", "spot-3", 104.0),
                                              Interruption("no-notice", "spot-2", 125.0)],
                                             rounds(EVENTS)),
        "joins": joins(rounds([*EVENTS[:10], {"event": "replacement", "job_id": "7",
                                              "node": "spot-4"}, *EVENTS[10:]])),
        "final_loss": 0.0152, "reference_loss": 0.0176, "loss_tolerance": LOSS_TOLERANCE,
        "loss_within_tolerance": True,
        "samples": {"steps": 10, "epochs": 1, "whole_epochs": 0, "rerun_steps": 2, "ok": True,
                    "problems": []},
        "coordinator": {"node": "coord-1", "job_id": 1, "rendezvous": "127.0.0.1:4000"},
    }
    base.update(overrides)
    return base


def test_summary_lines_say_what_happened() -> None:
    lines = summary_lines(result())
    assert lines[0] == ("job 3: COMPLETED after 200.0 s, 10 steps, 0 restart(s) (never "
                        "requeued: yes)")
    assert "coord-1 (on-demand, job 1) hosts the rendezvous at 127.0.0.1:4000" in lines[1]
    assert lines[2] == "  world sizes: 3 -> 2 -> 3 -> 2 -> 3"
    assert lines[3].startswith("  notice    spot-3: world 3 -> 2 at step 4, resumed from step 4 "
                               "(0 recomputed), training paused 4.5 s")
    assert "no-notice spot-2: world 3 -> 2 at step 8, resumed from step 6 (2 recomputed)" \
        in lines[4]
    assert lines[5].startswith("  joined    spot-4 (replacement job 7): world 2 -> 3 at step 6")
    assert lines[6].startswith("  joined    ? (replacement job ?)")
    assert "each sample once per epoch: yes (2 step(s) redone" in lines[7]
    assert lines[-1].endswith("tolerance 0.01): within")


def test_verdict_fails_a_requeue_an_unfinished_job_and_a_loss_off_the_reference() -> None:
    assert verdict(result()) == []
    assert verdict(result(restarts=1)) == ["the job was requeued 1 time(s)"]
    assert verdict(result(state="FAILED")) == ["job state FAILED, not COMPLETED"]
    off = verdict(result(final_loss=0.0176 + LOSS_TOLERANCE + 0.001))
    assert off and "off the reference" in off[0]
    assert verdict(result(final_loss=None)) == ["no final or reference loss"]


@pytest.mark.parametrize("args, named", [
    (["--checkpoint-root", "s3://bucket/p"], "--checkpoint-root"),
    (["--s3-endpoint-url", "http://localhost:9000"], "--s3-endpoint-url"),
    (["--s3-addressing-style", "path"], "--s3-addressing-style"),
    (["--steps", "300"], "--steps 300"),
    (["--workdir", "/tmp/" + "w" * 80], "--workdir /tmp/www"),
    (["--no-preload"], "--preload/--no-preload"),  # the elastic demo's workers start warm
])
def test_elastic_refuses_options_that_do_not_go_with_it(args: list[str], named: str) -> None:
    """Exit 2 naming the option, before any cluster is started."""
    out = CliRunner().invoke(cli, ["demo", "--elastic", "--workdir", "/nonexistent/x", *args])
    assert out.exit_code == 2, out.output
    assert named in out.output


@pytest.mark.parametrize("elastic", [[], ["--elastic"]], ids=["plain", "elastic"])
@pytest.mark.parametrize("args, named", [(["--notice", "nan"], "--notice"),
                                         (["--boot-delay", "NaN"], "--boot-delay")])
def test_demo_refuses_nan_seconds(monkeypatch: pytest.MonkeyPatch, elastic: list[str],
                                  args: list[str], named: str) -> None:
    """click's FloatRange lets NaN through (no comparison with it is true): exit 2 naming the
    option. Should the check ever pass, the demo fails here instead of starting a cluster."""
    import slurm_spot.localcluster.demo as demo
    import slurm_spot.localcluster.elastic_demo as elastic_demo

    def refuse(self: object) -> None:
        raise AssertionError(f"the demo would start with {args}")

    monkeypatch.setattr(demo.Demo, "run", refuse)
    monkeypatch.setattr(elastic_demo.ElasticDemo, "run", refuse)
    out = CliRunner().invoke(cli, ["demo", *elastic, *args])
    assert out.exit_code == 2, out.output
    assert f"Invalid value for '{named}'" in out.output and "not a number" in out.output


@pytest.mark.parametrize("args", [["--elastic", "--spares", "1"],
                                  ["--fault-tolerant", "--spares", "2"],
                                  ["--spares", "3"], ["--spares", "-1"]])
def test_demo_refuses_spares_it_cannot_keep(monkeypatch: pytest.MonkeyPatch,
                                            args: list[str]) -> None:
    """--spares is the plain demo's (0-2 of its 4 nodes): exit 2 naming it, no cluster."""
    import slurm_spot.localcluster.demo as demo

    def refuse(self: object) -> None:
        raise AssertionError(f"the demo would start with {args}")

    monkeypatch.setattr(demo.Demo, "run", refuse)
    out = CliRunner().invoke(cli, ["demo", "--workdir", "/nonexistent/x", *args])
    assert out.exit_code == 2, out.output
    assert "--spares" in out.output


def test_demo_spares_are_kept_by_slurm_and_the_reconciler(tmp_path: Path) -> None:
    """The demo's cluster with --spares 1: a valid spot.yaml whose node set keeps one spare,
    rendered as Slurm's SuspendExcNodes form (what keeps it up)."""
    from slurm_spot.config import SpotConfig
    from slurm_spot.localcluster.demo import demo_config
    from slurm_spot.render import suspend_exc_nodes

    config = SpotConfig.model_validate(demo_config(tmp_path, spares=1))
    assert config.node_sets[0].spares == 1
    assert suspend_exc_nodes(config) == "spot-[1-4]:1"
    assert "spares" not in demo_config(tmp_path)["node_sets"][0]


@pytest.mark.parametrize("args, named", [
    (["--workdir", "/tmp/" + "w" * 80], "--workdir /tmp/www"),
    (["--fault-tolerant", "--no-preload"], "--preload/--no-preload does not go with"),
    (["--fault-tolerant", "--preload"], "--preload/--no-preload does not go with"),
])
def test_the_plain_and_ft_demos_refuse_what_they_cannot_do(
        monkeypatch: pytest.MonkeyPatch, args: list[str], named: str) -> None:
    """The plain demo with a --workdir too long for its nodes' step sockets started a cluster
    whose jobs were requeued for ever (the elastic demo refused it); --no-preload was ignored
    by the fault-tolerant demo, whose groups always start a new python. Exit 2, no cluster."""
    import slurm_spot.localcluster.demo as demo
    import slurm_spot.localcluster.ft_demo as ft_demo

    def refuse(self: object) -> None:
        raise AssertionError(f"the demo would start with {args}")

    monkeypatch.setattr(demo.Demo, "run", refuse)
    monkeypatch.setattr(ft_demo.FtDemo, "run", refuse)
    out = CliRunner().invoke(cli, ["demo", *args])
    assert out.exit_code == 2, out.output
    assert named in out.output


@pytest.mark.parametrize("mode, default", [([], 900.0), (["--elastic"], 600.0)],
                         ids=["plain", "elastic"])
def test_demo_timeout_is_the_users_and_refused_below_a_minute(
        monkeypatch: pytest.MonkeyPatch, mode: list[str], default: float) -> None:
    """--timeout SECONDS is how long the demo waits before giving up with its diagnosis (a
    slow machine, a test that wants the demo's own error before its own timeout); without it
    each mode keeps its default; under 60 s is exit 2 naming the option."""
    import slurm_spot.localcluster.demo as demo
    import slurm_spot.localcluster.elastic_demo as elastic_demo

    seen: list[float] = []

    def record(self: demo.Demo) -> dict:
        seen.append(self.s.timeout_s)
        raise SystemExit(3)

    monkeypatch.setattr(demo.Demo, "run", record)
    monkeypatch.setattr(elastic_demo.ElasticDemo, "run", record)
    workdir = ["--workdir", "/nonexistent/x"]  # short enough for the step sockets; unused
    first = CliRunner().invoke(cli, ["demo", *mode, *workdir, "--timeout", "120"])
    assert first.exit_code == 3, first.output
    assert CliRunner().invoke(cli, ["demo", *mode, *workdir]).exit_code == 3
    assert seen == [120.0, default]
    out = CliRunner().invoke(cli, ["demo", *mode, *workdir, "--timeout", "5"])
    assert out.exit_code == 2 and "Invalid value for '--timeout'" in out.output, out.output
