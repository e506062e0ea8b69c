"""Reading YAML: an experiment file into a raw mapping, a ``--set KEY=VALUE`` into a pair.

The loader is a SafeLoader that a hostile file cannot abuse: duplicate keys are errors (YAML
would keep the last value silently); aliases may not contain themselves, and the document they
expand to is capped (a "billion laughs" file is refused before it grows); nesting is capped;
numbers beyond float64 are errors instead of ``inf``, ``0.0`` or a 400-digit int; the file must
be UTF-8 text of reasonable size. Every refusal is an ExperimentError naming the file, the line
and the fix.

Example:
    >>> parse_override("training.lr=1e-4")
    ('training.lr', 0.0001)
"""

from __future__ import annotations

import codecs
import math
import os
import re
import stat
from collections.abc import Callable
from typing import Any, TypeVar

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from rllib_amp.experiment.errors import ExperimentError

# An experiment file is a few KB; anything far larger is the wrong file (or an attack).
MAX_FILE_BYTES = 1 << 20
# Nodes in the document with every alias expanded: far above any real experiment (the
# shipped ones have < 200), far below what costs memory or time.
MAX_EXPANDED_NODES = 100_000
# Nesting depth: PyYAML composes recursively, so an unbounded "[[[[..." exhausts the stack.
MAX_DEPTH = 64
# The longest integer literal below float64's largest value (2**1024 has 309 digits), with
# room for signs and underscores; longer ones are refused before Python converts them.
MAX_INT_CHARS = 400
_FLOAT64_INT_LIMIT = 2**1024
# UTF-32's first: UTF-32-LE's BOM starts with UTF-16-LE's.
_BOMS = {getattr(codecs, f"BOM_UTF{n}_{e}"): f"UTF-{n}" for n in (32, 16) for e in ("LE", "BE")}

_T = TypeVar("_T")


class YamlRefused(yaml.YAMLError):
    """Input the loader refuses although YAML allows it; ``problem`` and ``fix`` are phrases."""

    def __init__(self, problem: str, mark: yaml.Mark | None, fix: str):
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark
        self.fix = fix


def _line(mark: yaml.Mark) -> int:
    return int(mark.line) + 1


class _Loader(yaml.SafeLoader):
    """SafeLoader with bounded aliases and nesting, no duplicate keys, float64-sized numbers;
    ``1e-4`` is a float (PyYAML's YAML 1.1 wants ``1.0e-4``)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._open_anchors: set[str] = set()
        self._depth = 0
        self._sizes: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: object) -> Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise YamlRefused(
                    f"the alias *{event.anchor} sits inside the node it names (a recursive alias)",
                    event.start_mark,
                    "write the value out instead of referring to its own anchor",
                )
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlRefused(
                f"nesting deeper than {MAX_DEPTH} levels",
                event.start_mark,
                "an experiment file needs only a few levels; flatten the structure",
            )
        anchor = getattr(event, "anchor", None) or ""
        if anchor:
            self._open_anchors.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors.discard(anchor)
        self._count(node)
        return node

    def _count(self, node: Node) -> None:
        """Records the node's size with aliases expanded; refuses a document grown too large."""
        children = node.value if isinstance(node, SequenceNode) else []
        if isinstance(node, MappingNode):
            children = [child for pair in node.value for child in pair]
        size = 1 + sum(self._sizes.get(id(child), 1) for child in children)
        if size > MAX_EXPANDED_NODES:
            raise YamlRefused(
                f"aliases expand this document beyond {MAX_EXPANDED_NODES:,} values",
                node.start_mark,
                "write the values out, or use fewer nested aliases",
            )
        self._sizes[id(node)] = size

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # merged keys may be overridden: that is what a merge is for
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: SafeLoader's own error names it
                if first is not None:
                    # 1, 1.0 and true are one key to Python: name both spellings.
                    same = "" if first.value == key_node.value else f" (as {first.value!r})"
                    raise YamlRefused(
                        f"duplicate key {key_node.value!r}{same}: first at line "
                        f"{_line(first.start_mark)}, again at line {_line(key_node.start_mark)}",
                        key_node.start_mark,
                        "keep one of them (YAML would silently use only the last)",
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Node) -> int:
        text = str(node.value)
        if len(text) > MAX_INT_CHARS:
            raise _too_large(text, node)
        value = _scalar(super().construct_yaml_int, node, "an integer")
        if abs(value) >= _FLOAT64_INT_LIMIT:
            raise _too_large(text, node)
        return value

    def construct_yaml_float(self, node: Node) -> float:
        text = str(node.value)
        value = _scalar(super().construct_yaml_float, node, "a number")
        if math.isinf(value) and "inf" not in text.lower():
            raise _too_large(text, node)
        if value == 0.0 and re.search(r"[1-9]", text.lower().split("e")[0]):
            raise YamlRefused(
                f"the number {_clip(text)} is below float64's smallest (about 5e-324) and "
                f"would read as 0",
                node.start_mark,
                "write 0, or a value float64 can hold",
            )
        return value

    def construct_yaml_bool(self, node: Node) -> bool:
        return bool(_scalar(super().construct_yaml_bool, node, "true or false"))

    def construct_yaml_timestamp(self, node: Node) -> object:
        return _scalar(super().construct_yaml_timestamp, node, "a date")


for _tag in ("int", "float", "bool", "timestamp"):
    _method = getattr(_Loader, f"construct_yaml_{_tag}")
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _method)

_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _clip(text: str, n: int = 24) -> str:
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} characters)"


def _too_large(text: str, node: Node) -> YamlRefused:
    return YamlRefused(
        f"the number {_clip(text)} is beyond float64 (largest about 1.8e308)",
        node.start_mark,
        "use a value float64 can hold",
    )


def _scalar(construct: Callable[[Node], _T], node: Node, expected: str) -> _T:
    """Runs one of SafeLoader's scalar constructors; its crashes on bad text become refusals."""
    try:
        return construct(node)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError):
        raise YamlRefused(
            f"{node.tag.rsplit(':', 1)[-1]} value {_clip(str(node.value))!r} is not {expected}",
            node.start_mark,
            "fix the value or drop the tag",
        ) from None


def _yaml_load(text: str) -> object:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _byte_line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _check_text(path: str, data: bytes) -> None:
    """Refuses bytes that are not UTF-8 text YAML can read."""
    for bom, name in _BOMS.items():
        if data.startswith(bom):
            raise ExperimentError(
                f"{path}: the file is {name}, not UTF-8; save it as UTF-8 (e.g. iconv -f {name} "
                f"-t UTF-8)"
            )
    nul = data.find(b"\0")
    if nul >= 0:
        raise ExperimentError(
            f"{path}: line {_byte_line(data, nul)}: a NUL byte: this is not a "
            f"text file; pass an experiment YAML such as tune_configs/cartpole_ppo_amp.yaml"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ExperimentError(
            f"{path}: line {_byte_line(data, e.start)}: byte 0x{data[e.start]:02x} is not UTF-8; "
            f"save the file as UTF-8"
        ) from None
    bad = yaml.reader.Reader.NON_PRINTABLE.search(text)
    if bad:
        at = bad.start()
        raise ExperimentError(
            f"{path}: line {text.count(chr(10), 0, at) + 1}, column "
            f"{at - text.rfind(chr(10), 0, at)}: control character U+{ord(bad.group()):04X} is "
            f"not allowed in YAML text; remove it"
        )


def _read_bytes(path: str) -> bytes:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ExperimentError(
            f"{path}: no such file; pass an experiment YAML such as "
            f"tune_configs/cartpole_ppo_amp.yaml"
        ) from None
    except OSError as e:
        raise ExperimentError(f"{path}: cannot be read ({e.strerror}); check the path") from None
    if stat.S_ISDIR(st.st_mode):
        raise ExperimentError(
            f"{path}: is a folder; pass one experiment YAML in it, e.g. "
            f"tune_configs/cartpole_ppo_amp.yaml"
        )
    if not stat.S_ISREG(st.st_mode):
        raise ExperimentError(
            f"{path}: not a regular file (a device, pipe or socket); pass an experiment YAML file"
        )
    if st.st_size > MAX_FILE_BYTES:
        raise ExperimentError(
            f"{path}: {st.st_size:,} bytes; an experiment file is a few KB (at most "
            f"{MAX_FILE_BYTES:,} bytes): pass the experiment YAML"
        )
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ExperimentError(
            f"{path}: cannot be read ({e.strerror}); check its permissions"
        ) from None


def _yaml_error(e: yaml.YAMLError) -> str:
    """One line: where the YAML error is, what it is and the fix."""
    mark = getattr(e, "problem_mark", None)
    problem = " ".join(str(getattr(e, "problem", None) or str(e).splitlines()[0]).split())
    if isinstance(e, YamlRefused):
        return f"line {_line(mark)}: {problem}; {e.fix}"
    where = f"line {_line(mark)}, column {mark.column + 1}" if mark else "unknown place"
    if isinstance(e, yaml.constructor.ConstructorError):
        return (
            f"YAML error at {where}: {problem}; use plain YAML values (strings, numbers, lists "
            f"and mappings with simple keys)"
        )
    if isinstance(e, yaml.composer.ComposerError):
        fix = (
            "keep one document per file (no second '---')"
            if "document" in problem
            else "define each anchor (&name) once, before its aliases (*name)"
        )
        return f"YAML error at {where}: {problem}; {fix}"
    return f"YAML syntax error at {where}: {problem}; check the indentation, quotes and brackets"


def read_file(path: str) -> object:
    """The parsed content of the YAML file ``path`` (not yet validated).

    Example:
        >>> read_file("tune_configs/cartpole_ppo_amp.yaml")["algorithm"]
        'PPO'
    """
    data = _read_bytes(path)
    if len(data) > MAX_FILE_BYTES:  # it grew after stat
        raise ExperimentError(f"{path}: more than {MAX_FILE_BYTES:,} bytes; pass the experiment")
    _check_text(path, data)
    try:
        raw = _yaml_load(data.decode("utf-8"))
    except yaml.YAMLError as e:
        raise ExperimentError(f"{path}: {_yaml_error(e)}") from None
    except RecursionError:
        raise ExperimentError(
            f"{path}: nested too deeply to read; an experiment file needs only a few levels"
        ) from None
    if raw is None:
        raise ExperimentError(f"{path}: the file is empty; start it with e.g. 'algorithm: PPO'")
    return raw


def parse_override(item: str) -> tuple[str, object]:
    """A ``--set`` item -> (dotted key, value read as YAML): a string where YAML cannot parse
    it, an ExperimentError where the loader refuses it (a duplicate key, an alias bomb...).

    Example:
        >>> parse_override("search.seed={grid: [0, 1]}")
        ('search.seed', {'grid': [0, 1]})
    """
    if not isinstance(item, str):
        raise TypeError(
            f"overrides: expected strings like 'amp.init_scale=1024', got "
            f"{type(item).__name__} {item!r}"
        )
    if "=" not in item:
        raise ExperimentError(
            f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. amp.init_scale=1024"
        )
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ExperimentError(f"--set {item!r}: the key is empty; write e.g. amp.init_scale=1024")
    try:
        value = _yaml_load(raw) if raw.strip() else None
    except YamlRefused as e:
        raise ExperimentError(f"--set {_clip(item, 60)!r}: {_yaml_error(e)}") from None
    except (yaml.YAMLError, RecursionError):
        value = raw
    return key, value
