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
- A recursive alias (``x: &a [*a]``), nesting deeper than :data:`MAX_DEPTH` levels or a
  document that aliases expand to more than :data:`MAX_VALUES` values (an "alias bomb":
  9 copies of 9 copies of ...) is refused from the parser's event stream, before anything
  recursive walks it (:class:`YamlShapeError`).
- :func:`check_trusted_file`: root runs programs and reads credentials named in the config,
  so the config and credentials files must be writable by root only (and owned by root when
  slurm-spot runs as root).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import yaml

from slurm_spot.config.source import check_trusted_file  # noqa: F401 - named here too

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


MAX_DEPTH = 100
"""Most levels of nested mappings and sequences (aliases expanded); spot.yaml needs 5."""
MAX_VALUES = 100_000
"""Most values (scalars, mappings, sequences) in the document with every alias expanded; a
spot.yaml has a few hundred."""


class YamlShapeError(ValueError):
    """The document is YAML, but not one to expand: a recursive alias, too deep nesting or
    too many values once aliases are expanded.

    Attributes:
        line: the line (1-based) where the problem was found.
        problem: what is wrong, without the line.
    """

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


def check_shape(text: str) -> None:
    """Refuse a document that would make the composer, the scan or validation recurse or
    expand without bound, in one pass over the parser's events (PyYAML's parser is not
    recursive; its composer is, one Python frame per level).

    Each anchored node's expanded size and depth is recorded when it ends; an alias adds
    them to its parent instead of walking the node again.

    Raises:
        YamlShapeError: an alias inside the node its anchor names (recursive), nesting
            deeper than :data:`MAX_DEPTH` levels, or more than :data:`MAX_VALUES` values
            with aliases expanded; the line is the alias's or the collection's.
        yaml.YAMLError: not YAML.
    """
    stack: list[_Open] = []  # the collections open at this event
    open_anchors: dict[str, int] = {}  # anchor -> line, of the open collections
    done: dict[str, tuple[int, int]] = {}  # anchor -> (values, depth) once its node ended
    values = 0  # in the document so far, every alias expanded

    def count(size: int, depth: int, line: int, what: str) -> None:
        nonlocal values
        values += size
        if values > MAX_VALUES:
            raise YamlShapeError(line, f"{what} expands the document to more than "
                                 f"{MAX_VALUES} values (an alias bomb?); spot.yaml has a "
                                 "few hundred")
        if len(stack) + depth > MAX_DEPTH:
            raise YamlShapeError(line, f"{what} nests more than {MAX_DEPTH} levels deep; "
                                 "spot.yaml needs a handful")
        if stack:
            stack[-1].values += size
            stack[-1].depth = max(stack[-1].depth, depth)

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, yaml.AliasEvent):
            name = event.anchor
            if name in open_anchors:
                raise YamlShapeError(line, f"recursive alias *{name}: it is inside the node "
                                     f"its anchor &{name} (line {open_anchors[name]}) names, "
                                     "which would contain itself")
            if name in done:  # an unknown alias: the composer names it
                size, depth = done[name]
                count(size, depth, line, f"alias *{name}")
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                done[event.anchor] = (1, 0)
            count(1, 0, line, "a value")
        elif isinstance(event, yaml.CollectionStartEvent):
            count(1, 1, line, "a mapping or list")
            stack.append(_Open(event.anchor, line))
            if event.anchor is not None:
                open_anchors[event.anchor] = line
        elif isinstance(event, yaml.CollectionEndEvent):
            node = stack.pop()
            if node.anchor is not None:
                open_anchors.pop(node.anchor, None)
                done[node.anchor] = (node.values + 1, node.depth + 1)
            if stack:
                stack[-1].values += node.values
                stack[-1].depth = max(stack[-1].depth, node.depth + 1)


@dataclass
class _Open:
    """A mapping or sequence whose end event has not come yet."""

    anchor: str | None
    line: int
    values: int = 0  # inside it so far (aliases expanded), itself not counted
    depth: int = 0  # levels inside it so far


def read_yaml(text: str) -> tuple[object, dict[Path_, int], list[str]]:
    """Parse ``text`` (one YAML document).

    Returns:
        ``(data, lines, problems)``: the data as :func:`yaml.safe_load` gives it; the line
        (1-based) of every mapping key and sequence item by its path (``("node_sets", 0,
        "count")``); one problem per duplicate key, placeholder or control character, each
        starting ``line N:``.

    Raises:
        yaml.YAMLError: not YAML (its ``problem_mark`` has the line).
        YamlShapeError: a recursive alias, too deep or too large once aliases are expanded
            (:func:`check_shape`).
    """
    check_shape(text)
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    lines: dict[Path_, int] = {}
    problems: list[str] = []
    if node is not None:
        _scan(node, (), lines, problems)
    return yaml.safe_load(text), lines, problems


def _dotted(path: Path_) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


def _scan(node: yaml.Node, path: Path_, lines: dict[Path_, int], problems: list[str],
          seen_nodes: set[int] | None = None) -> None:
    """Record the line of every path (an aliased node under each path it appears at) and the
    problems of each node once, however many aliases name it (``seen_nodes``: ids of the
    nodes whose problems are recorded)."""
    seen_nodes = set() if seen_nodes is None else seen_nodes
    first = id(node) not in seen_nodes
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                _scan(value_node, path, lines, problems, seen_nodes)
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node)
            line = key_node.start_mark.line + 1
            if key in seen and first:
                problems.append(f"line {line}: {_dotted((*path, key))}: duplicate key "
                                f"(first given at line {seen[key]})")
            seen[key] = line
            lines[(*path, key)] = line
            _scan(value_node, (*path, key), lines, problems, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _scan(item, (*path, i), lines, problems, seen_nodes)
    elif isinstance(node, yaml.ScalarNode) and node.tag == _STR_TAG and first:
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
