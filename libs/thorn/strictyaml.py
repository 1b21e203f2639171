"""YAML loading that refuses a key repeated in one mapping (YAML keeps the last silently).

Shared by the containerlab importer and thornctl's file reader. Uses libyaml when PyYAML was
built with it: large fabric exports parse many times faster.
"""

from __future__ import annotations

from typing import Any

import yaml


def _unique_mapping(
    loader: yaml.SafeLoader | yaml.CSafeLoader, node: yaml.MappingNode
) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:
            continue  # an unhashable key: construct_mapping reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r}",
                key_node.start_mark,
            )
    return loader.construct_mapping(node, deep=True)


class _PyLoader(yaml.SafeLoader):
    pass


_PyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
Loader: type[yaml.SafeLoader | yaml.CSafeLoader] = _PyLoader

if yaml.__with_libyaml__:

    class _CLoader(yaml.CSafeLoader):
        pass

    _CLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)
    Loader = _CLoader


def load(text: str | bytes) -> Any:
    """Parse YAML safely; raises yaml.YAMLError (with marks) on bad input or repeated keys."""
    return yaml.load(text, Loader=Loader)
