"""Reading ``spot.yaml`` as text: what the YAML parser alone lets through.

- Every node of the document keeps its line, so every validation error names one
  (:func:`read_yaml` returns a path -> line map).
- A key given twice in one mapping is an error (PyYAML keeps the last one silently).
- A string value with an unrendered template placeholder (``@SUBNET_ID@``, ``${zone}``,
  ``{{ launch_template }}``, ``{% if %}``, ``$ami``) is an error naming the placeholder, the
  file and the line: such a value reaches EC2/GCE or a generated file as is.
- A string value with a control character (newline, tab, ESC, DEL ...) is an error: values
  end up in generated files (slurm.conf, systemd units) and exported variables, where a
  newline starts a new setting.
- :func:`check_trusted_file`: root runs programs and reads credentials named in the config,
  so the config and credentials files must be writable by root only (and owned by root when
  slurm-spot runs as root).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import yaml

Path_ = tuple[str | int, ...]

_PLACEHOLDERS = re.compile(
    r"@[A-Za-z_][A-Za-z0-9_]*@"      # autoconf / sed templates
    r"|\$\{[^}]*\}"                   # shell, Terraform, envsubst
    r"|\{\{.*?\}\}|\{%.*?%\}"         # Jinja2 / Ansible / Helm
    r"|\$[A-Za-z_][A-Za-z0-9_]*"      # shell, envsubst
)
# Values that look like placeholders but are real settings: EC2 CreateFleet
# LaunchTemplateSpecification.Version accepts "$Latest" and "$Default" (EC2 API reference).
_LITERAL_DOLLAR = {("launch_template_version", "$Latest"), ("launch_template_version", "$Default")}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"


def read_yaml(text: str) -> tuple[object, dict[Path_, int], list[str]]:
    """Parse ``text`` (one YAML document).

    Returns:
        ``(data, lines, problems)``: the data as :func:`yaml.safe_load` gives it; the line
        (1-based) of every mapping key and sequence item by its path (``("node_sets", 0,
        "count")``); one problem per duplicate key, placeholder or control character, each
        starting ``line N:``.

    Raises:
        yaml.YAMLError: not YAML (its ``problem_mark`` has the line).
    """
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    lines: dict[Path_, int] = {}
    problems: list[str] = []
    if node is not None:
        _scan(node, (), lines, problems)
    return yaml.safe_load(text), lines, problems


def _dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _scan(node: yaml.Node, path: Path_, lines: dict[Path_, int], problems: list[str]) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                _scan(value_node, path, lines, problems)
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append(f"line {line}: {_dotted((*path, key))}: duplicate key "
                                f"(first given at line {seen[key]})")
            seen[key] = line
            lines[(*path, key)] = line
            _scan(value_node, (*path, key), lines, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _scan(item, (*path, i), lines, problems)
    elif isinstance(node, yaml.ScalarNode) and node.tag == _STR_TAG:
        problems.extend(_value_problems(node.value, path, node.start_mark.line + 1))


def _value_problems(value: str, path: Path_, line: int) -> Iterator[str]:
    where = f"line {line}: {_dotted(path)}"
    control = _CONTROL.search(value)
    if control:
        yield (f"{where}: control character U+{ord(control.group()):04X} in the value; "
               "values go into generated files and environment variables, one line each")
    key = str(path[-1]) if path else ""
    for match in _PLACEHOLDERS.finditer(value):
        if (key, value) in _LITERAL_DOLLAR:
            continue
        yield (f"{where}: unrendered placeholder {match.group()!r}; fill in the template "
               "that produced this file")
        break


def line_of(lines: dict[Path_, int], loc: Path_) -> int | None:
    """The line of ``loc`` or of its nearest ancestor that has one (a missing key's
    mapping)."""
    for end in range(len(loc), -1, -1):
        key = tuple(loc[:end])
        if key in lines:
            return lines[key]
    return None


def with_line(problem: str, lines: dict[Path_, int]) -> str:
    """``node_sets.1.name: ...`` -> ``line 9: node_sets.1.name: ...``."""
    head = problem.split(":", 1)[0]
    if not lines or " " in head:
        return problem
    path = tuple(int(p) if p.isdigit() else p for p in head.split("."))
    line = line_of(lines, path)
    return f"line {line}: {problem}" if line else problem


def check_trusted_file(path: Path, info: os.stat_result, what: str) -> str | None:
    """Why ``path`` (with ``os.stat``/``fstat`` result ``info``) cannot be trusted, or None.

    A file root acts on must not be writable by anyone but its owner, and, when slurm-spot
    runs as root, must be owned by root: otherwise whoever can write it can make root run
    their programs or use their credentials.
    """
    mode = stat.S_IMODE(info.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{what} {path} is writable by {'others' if mode & stat.S_IWOTH else 'its group'}"
                f" (mode {mode:04o}); root runs programs and reads credentials named in it. "
                f"Fix: chmod go-w {path}")
    if os.geteuid() == 0 and info.st_uid != 0:
        return (f"{what} {path} is owned by uid {info.st_uid}, but slurm-spot runs as root "
                f"and acts on it. Fix: chown root:root {path} && chmod go-w {path}")
    return None
