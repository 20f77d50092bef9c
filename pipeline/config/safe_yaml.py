"""Reading a YAML file the user names, within bounds: a regular file of at most MAX_YAML_BYTES, a document that
expands to at most MAX_YAML_VALUES values through its aliases; anything else is Refused (loader.py turns that into a
ConfigError) before it is read or expanded.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml


class Refused(ValueError):
    """The file or text is not read: the message says why and what to do."""


# what one params or profile file (or one --set value) may hold: a 1 KB file of nested aliases expands to billions
# of values, and a special file (/dev/zero, a FIFO) never ends; the shipped profiles hold a few hundred values
MAX_YAML_BYTES = 1 << 20
MAX_YAML_VALUES = 100_000
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _expanded_size(root: yaml.Node, where: str) -> int:
    """How many values `root` holds once every alias is expanded, counted without expanding (shared nodes counted
    once per use, from a memo); stops at MAX_YAML_VALUES + 1. A node that contains itself raises Refused."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise Refused(
                f"{where} holds an alias that refers to itself (line {node.start_mark.line + 1}): "
                f"its value would never end. Write the value out, or point the alias at another "
                f"anchor."
            )
        open_.add(id(node))
        children = (
            [c for pair in node.value for c in pair]
            if isinstance(node, yaml.MappingNode)
            else node.value
            if isinstance(node, yaml.SequenceNode)
            else ()
        )
        total = 1
        for child in children:
            total = min(total + size(child), MAX_YAML_VALUES + 1)
        open_.discard(id(node))
        sizes[id(node)] = total
        return total

    return size(root)


def _refuse_duplicate_keys(root: yaml.Node, where: str) -> None:
    """Raise Refused if a mapping holds one key twice: YAML readers keep the last and drop the first without a word
    (a second `train:` section replaces the whole first one). Each node is visited once, however often aliased."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen or isinstance(node, yaml.ScalarNode):
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo += node.value
            continue
        first: dict = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                line = first.get((key.tag, key.value))
                if line is not None:
                    raise Refused(
                        f"{where} sets `{key.value}` twice in one mapping (lines {line} and "
                        f"{key.start_mark.line + 1}): the second would silently replace the first. "
                        f"Keep one, merging their keys."
                    )
                first[key.tag, key.value] = key.start_mark.line + 1
            todo += [key, value]


def load(text: str, where: str):
    """yaml.safe_load, refusing a document that expands to more than MAX_YAML_VALUES values through its aliases."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node, where)
        if _expanded_size(node, where) > MAX_YAML_VALUES:
            raise Refused(
                f"{where} expands to more than {MAX_YAML_VALUES:,} values through its aliases (*name "
                f"repeats the value anchored &name, and aliases of aliases multiply): a parameters "
                f"file holds a few hundred. Write the values out, or use fewer nested aliases."
            )
        return loader.construct_document(node)
    except RecursionError:
        raise Refused(f"{where} nests its values too deeply to be read. Flatten it.") from None
    finally:
        loader.dispose()


def read_text(path: Path) -> str:
    """The UTF-8 text of a regular file of at most MAX_YAML_BYTES; a special file is refused before it is read
    (opened non-blocking: a FIFO without a writer would block the open itself)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((what for test, what in _KINDS if test(mode)), "not a file")
            link = ", through a symbolic link" if path.is_symlink() else ""
            raise Refused(
                f"{path} is not a regular file ({kind}{link}): a parameters file or profile is read "
                f"only from a regular YAML file. Point it at one."
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_YAML_BYTES:
        raise Refused(
            f"{path} is larger than {MAX_YAML_BYTES >> 20} MiB: a parameters file or profile holds a "
            f"few KB. Check that it is the file you meant."
        )
    return data.decode("utf-8")
