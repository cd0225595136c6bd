"""CLI commands, one module per topic, each exposing ``COMMANDS``.

The group loads a command's module only when that command runs (:func:`load_command`), so
``slurm-spot task-prolog`` does not import rich, jinja2 or prometheus_client. A new command is
one module here plus one line per command name in :data:`COMMAND_MODULES`.
"""

from __future__ import annotations

import importlib

import click

from slurm_spot.commands.common import add_shared_options

#: command name -> module of ``slurm_spot.commands`` that defines it.
COMMAND_MODULES: dict[str, str] = {
    "resume": "power",
    "suspend": "power",
    "resume-fail": "power",
    "config": "configure",
    "render": "configure",
    "local": "local",
    "watch": "watch",
    "node-name": "node",
    "events": "events",
    "prolog": "jobhooks",
    "task-prolog": "jobhooks",
    "epilog": "jobhooks",
    "prolog-slurmctld": "jobhooks",
    "instances": "instances",
    "reconcile": "reconcile",
    "status": "status",
    "sbatch": "sbatch",
    "rendezvous": "rendezvous",
    "lighthouse": "lighthouse",
    "lighthouse-relay": "lighthouse",
    "demo": "demo",
    "plan": "plan",
    "cost": "cost",
    "simulate": "simulate",
}


#: ``--help`` sections, in order: what people type, the daemons (systemd units), and the
#: programs slurm.conf names (ResumeProgram, SuspendProgram, ResumeFailProgram, Prolog,
#: TaskProlog, Epilog, PrologSlurmctld; slurm.conf(5)), which nobody types but which stay callable by hand.
COMMAND_SECTIONS: dict[str, tuple[str, ...]] = {
    "Commands": ("sbatch", "status", "events", "instances", "node-name", "config", "render",
                 "plan", "cost", "simulate", "local", "demo", "rendezvous",
                 "lighthouse", "lighthouse-relay"),
    "Daemons (run by systemd: slurm-spot reconcile/watch --systemd-unit)": ("reconcile", "watch"),
    "Slurm hooks (slurm.conf runs them; see 'slurm-spot render')": (
        "resume", "suspend", "resume-fail", "prolog", "task-prolog", "epilog",
        "prolog-slurmctld"),
}


def load_command(name: str) -> click.Command | None:
    """The command called ``name`` (None if there is none), importing its module now. It also
    takes ``--config`` and ``-v`` after its own name (``slurm-spot render --config F -v``).

    Raises:
        LookupError: :data:`COMMAND_MODULES` names a module that does not define ``name``.
    """
    module_name = COMMAND_MODULES.get(name)
    if module_name is None:
        return None
    module = importlib.import_module(f"slurm_spot.commands.{module_name}")
    for command in module.COMMANDS:
        if command.name == name:
            add_shared_options(command)
            return command
    raise LookupError(f"slurm_spot.commands.{module_name} defines no command {name!r}")


class LazyGroup(click.Group):
    """A click group whose commands are loaded on first use (:func:`load_command`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMAND_MODULES})

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands in :data:`COMMAND_SECTIONS`' sections (any command not listed there
        goes to the first one), each with its short help."""
        names = self.list_commands(ctx)
        listed = {n for section in COMMAND_SECTIONS.values() for n in section}
        sections = list(COMMAND_SECTIONS.items())
        sections[0] = (sections[0][0],
                       (*sections[0][1], *(n for n in names if n not in listed)))
        width = formatter.width - 6 - max(len(n) for n in names)
        for title, section in sections:
            rows = []
            for name in section:
                command = self.get_command(ctx, name)
                if command is not None and not command.hidden:
                    rows.append((name, command.get_short_help_str(width)))
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            command = load_command(cmd_name)
            if command is None:
                return None
            self.add_command(command)
        return self.commands.get(cmd_name)
