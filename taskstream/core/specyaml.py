"""The one YAML document of a task file, read within bounds, or `ConfigError` naming the line.

PyYAML on its own builds whatever a document describes. A task file is refused, with the
1-based line of the offending node, when it holds:

- nesting more than `MAX_DEPTH` (100) levels deep: PyYAML recurses once per level;
- aliases that, expanded, add more than `MAX_ALIAS_NODES` (100,000) nodes or
  `MAX_ALIAS_CHARS` (10,000,000) characters of scalar text to the document (a "billion
  laughs" alias bomb), or an alias inside its own anchor (a recursive structure). Anchors,
  aliases and merge keys (`<<: *defaults`) within those bounds are fine;
- a lone surrogate such as `"\\ud800"` (a double-quoted escape): not Unicode text, so it can
  be neither stored nor printed;
- a value its tag cannot build: `2026-02-30`, an integer of more than 4,300 digits,
  `!!bool maybe`;
- a syntax error, or more than one document.

Keys repeated inside one mapping, which YAML would silently collapse into the last one, are
returned as problems for the caller to list with the others; so is a second merge key (`<<`)
in one mapping, since `<<: [*a, *b]` says which mapping wins and two `<<` keys do not.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, Final, Protocol

import yaml

from taskstream.core.errors import ConfigError

MAX_DEPTH: Final = 100
"""Most levels of nesting, the top-level mapping being level 1."""
MAX_ALIAS_NODES: Final = 100_000
"""Most nodes (scalars, lists, mappings) that expanding every alias may add."""
MAX_ALIAS_CHARS: Final = 10_000_000
"""Most characters of scalar text that expanding every alias may add."""
_ALIAS_LIMITS: Final = (MAX_ALIAS_NODES, MAX_ALIAS_CHARS)
_ALIAS_UNITS: Final = ("nodes", "characters")
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
_MERGE_KEY: Final = "\x00<<"
"""How a merge key counts among a mapping's keys: apart from a string key `"<<"`."""
_VALUE_TAG: Final = "tag:yaml.org,2002:value"
_STR_TAG: Final = "tag:yaml.org,2002:str"
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_KINDS: Final = {
    "timestamp": "date or time",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
}
_SHOWN_CHARS: Final = 40


def problem_lines(source_name: str, problems: Sequence[str]) -> list[str]:
    """One line per problem, each starting with the file name."""
    return [f"{source_name}: {problem}".replace("\n", " ") for problem in problems]


def read_document(text: str, source_name: str) -> tuple[object, list[str]]:
    """The document of `text` and its duplicate-key problems (`line N: duplicate key 'k'`).

    Anything else wrong (see the module docstring) raises `ConfigError` at once, its lines
    starting with `source_name`.
    """
    try:
        loader = _BoundedLoader(text)  # the reader checks every character here
    except yaml.reader.ReaderError as exc:
        raise ConfigError(problem_lines(source_name, [_unreadable(text, exc)])) from None
    try:
        root = loader.get_single_node()
        if loader.surrogates:
            raise ConfigError(problem_lines(source_name, loader.surrogates))
        # before construction, which merges `<<` keys into the very mapping nodes
        duplicates = sorted(_duplicate_keys(root)) if root is not None else []
        document: object = loader.construct_document(root) if root is not None else None
    except _Refused as exc:
        where = f"line {exc.mark.line + 1}: " if exc.mark is not None else ""
        raise ConfigError(problem_lines(source_name, [where + exc.problem])) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}: " if mark is not None else ""
        reason = ", ".join(part for part in (exc.context, exc.problem) if part) or "cannot parse"
        raise ConfigError(problem_lines(source_name, [f"{where}invalid YAML: {reason}"])) from None
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(problem_lines(source_name, [f"invalid YAML: {exc}"])) from None
    finally:
        loader.dispose()
    return document, [_duplicate(line, key) for line, key in duplicates]


def _duplicate(line: int, key: str) -> str:
    """The problem of a key given twice in one mapping (1-based `line`)."""
    hint = " (merge several mappings with <<: [*a, *b])" if key == "<<" else ""
    return f"line {line}: duplicate key '{key}'{hint}"


def _unreadable(text: str, exc: yaml.reader.ReaderError) -> str:
    """A character YAML does not allow (a control character, say), with its line."""
    line = text.count("\n", 0, exc.position) + 1
    char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "?")
    return f"line {line}: invalid YAML: unacceptable character #x{char:02x} ({exc.reason})"


class _Marked(Protocol):
    line: int
    """0-based."""


class _Refused(Exception):
    """A node the bounds refuse, and where it starts."""

    def __init__(self, mark: _Marked | None, problem: str) -> None:
        super().__init__(problem)
        self.mark = mark
        self.problem = problem


class _BoundedLoader(yaml.SafeLoader):
    """`SafeLoader` that, while composing, bounds depth and alias expansion and notes lone
    surrogates; and that gives a value its constructor rejects the line it is on."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.sizes: dict[int, tuple[int, int]] = {}
        """Expanded (nodes, scalar characters) of every composed node, by `id`."""
        self.added = (0, 0)
        """(nodes, characters) that the aliases composed so far add once expanded."""
        self.path: list[str] = []
        self.surrogates: list[str] = []

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self._count_alias(self._peek())
            return super().compose_node(parent, index)  # type: ignore[arg-type]
        if len(self.path) >= MAX_DEPTH:
            mark = self._peek().start_mark
            raise _Refused(mark, f"nested more than {MAX_DEPTH} levels deep (the most allowed)")
        self.path.append(_label(parent, index))
        try:
            node = super().compose_node(parent, index)  # type: ignore[arg-type]
            if node is not None:
                self.sizes[id(node)] = self._expanded_size(node)
            if isinstance(node, yaml.ScalarNode):
                self._note_surrogate(node, is_key=index is None and parent is not None)
        finally:
            self.path.pop()
        return node

    def _peek(self) -> yaml.Event:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]  # untyped stub
        return event

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        kind = _KINDS.get(str(node.tag).rpartition(":")[2], "value")
        try:
            return super().construct_object(node, deep)
        except ValueError as exc:
            reason = str(exc).partition("; use sys.")[0]  # a hint meant for programmers
        except (KeyError, AttributeError, IndexError, TypeError):
            # PyYAML's own failures on a tagged scalar it cannot read: `!!bool maybe`,
            # `!!timestamp soon`, `!!int ""`
            if not isinstance(node, yaml.ScalarNode):
                raise
            reason = f"not {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
        raise _Refused(node.start_mark, f"invalid {kind} {_shown(node)}: {reason}") from None

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Put the pairs of the mappings `node` merges (`<<: *a`, `<<: [*a, *b]`) before its
        own, so that construction, where the last pair of a key wins, keeps its own value
        first, then that of the earliest mapping merged: YAML's order, which PyYAML 6.0.4
        inverts for a list. A key node merged more than once is kept once (its last place)."""
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        own: list[tuple[yaml.Node, yaml.Node]] = []
        for key, value in node.value:
            if key.tag != _MERGE_TAG:
                if key.tag == _VALUE_TAG:  # as PyYAML: a `=` key is the string "="
                    key.tag = _STR_TAG
                own.append((key, value))
                continue
            for source in reversed(_merged_mappings(node, value)):  # the earliest last: it wins
                self.flatten_mapping(source)
                merged.extend(source.value)
        last = {id(key): n for n, (key, _) in enumerate(merged)}
        node.value = [pair for n, pair in enumerate(merged) if last[id(pair[0])] == n] + own

    def _count_alias(self, event: yaml.Event) -> None:
        anchor = str(getattr(event, "anchor", ""))
        target = self.anchors.get(anchor)
        if target is None:
            return  # the composer reports the undefined alias
        size = self.sizes.get(id(target))
        if size is None:
            raise _Refused(
                event.start_mark,
                f"alias *{anchor} is inside its own anchor &{anchor} "
                "(recursive structures are not allowed)",
            )
        self.added = (self.added[0] + size[0], self.added[1] + size[1])
        over = [
            f"more than {limit} {what}"
            for added, limit, what in zip(self.added, _ALIAS_LIMITS, _ALIAS_UNITS, strict=True)
            if added > limit
        ]
        if over:
            raise _Refused(
                event.start_mark,
                f"expanding aliases would add {' and '.join(over)} (at alias *{anchor}); "
                f"a task file's aliases may add at most {MAX_ALIAS_NODES} nodes and "
                f"{MAX_ALIAS_CHARS} characters of text (an alias bomb?)",
            )

    def _expanded_size(self, node: yaml.Node) -> tuple[int, int]:
        if isinstance(node, yaml.ScalarNode):
            return 1, len(node.value)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        sizes = [self.sizes[id(child)] for child in children]
        return 1 + sum(s[0] for s in sizes), sum(s[1] for s in sizes)

    def _note_surrogate(self, node: yaml.ScalarNode, *, is_key: bool) -> None:
        found = _SURROGATE.search(node.value)
        if found is None:
            return
        where = _dotted(self.path) or "top level"
        what = "a key" if is_key else "the value"
        self.surrogates.append(
            f"line {node.start_mark.line + 1}: {where}: {what} holds the lone surrogate "
            f"{found.group()!a}, which is not Unicode text (write the character itself)"
        )


def _merged_mappings(node: yaml.Node, value: yaml.Node) -> list[yaml.MappingNode]:
    """The mappings that `<<: value` merges into `node`, in their order; `ConstructorError`
    (PyYAML's words) for anything else."""
    sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
    for source in sources:
        if not isinstance(source, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                "expected a mapping or list of mappings for merging, but found "
                + str(getattr(source, "id", "a value")),
                source.start_mark,
            )
    return list(sources)


def _label(parent: yaml.Node | None, index: object) -> str:
    """How the node composed at `index` of `parent` shows in a dotted path (a key: not)."""
    if parent is None:
        return ""
    if isinstance(index, int):
        return f"[{index}]"
    if isinstance(index, yaml.ScalarNode):
        return _printable(str(index.value))
    return "" if index is None else "?"


def _dotted(labels: Sequence[str]) -> str:
    """`["", "tasks", "[0]", "payload"]` -> `tasks[0].payload`."""
    out = ""
    for label in labels:
        if label and not label.startswith("[") and out:
            out += "."
        out += label
    return out


def _printable(text: str) -> str:
    """`text` with any lone surrogate written as its escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _shown(node: yaml.Node) -> str:
    value = node.value if isinstance(node, yaml.ScalarNode) else ""
    short = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "..."
    return repr(_printable(short))


def _duplicate_keys(root: yaml.Node) -> Iterator[tuple[int, str]]:
    """(1-based line, key) of every key repeated inside one mapping, anywhere in the tree."""
    stack, visited = [root], set[int]()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                # a second `<<` too: which of two merges wins is anyone's guess
                name = _MERGE_KEY if key.tag == _MERGE_TAG else key.value
                if isinstance(key, yaml.ScalarNode) and name in seen:
                    yield key.start_mark.line + 1, str(key.value)
                if isinstance(key, yaml.ScalarNode):
                    seen.add(name)
                stack.extend((key, value))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
