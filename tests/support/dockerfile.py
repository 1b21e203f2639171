"""Reading deploy/Dockerfile as a specification: its stages and what a target runs.

Shared by the deploy tests of docker-compose.yml and of the Kubernetes manifests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    """One build stage of a Dockerfile: `FROM <base> AS <name>` and what follows."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse_dockerfile(path: Path) -> list[Stage]:
    """Split a Dockerfile into stages of (INSTRUCTION, arguments) pairs."""
    logical_lines: list[str] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical_lines.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    for line in logical_lines:
        keyword, _, arguments = line.partition(" ")
        keyword, arguments = keyword.upper(), arguments.strip()
        if keyword == "FROM":
            words = [word for word in arguments.split() if not word.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif keyword != "ARG" or stages:
            assert stages, f"{path}: {keyword} before the first FROM"
            stages[-1].instructions.append((keyword, arguments))
    return stages


def stage_chain(stages: list[Stage], target: str | None) -> list[Stage]:
    """The target stage and the stages it is built FROM, target first."""
    by_name = {stage.name: stage for stage in stages if stage.name}
    stage = by_name[target] if target else stages[-1]
    chain = [stage]
    while stage.base in by_name:
        stage = by_name[stage.base]
        chain.append(stage)
    return chain


def effective(stages: list[Stage], target: str | None, keyword: str) -> str | None:
    """The last value of an inherited instruction (CMD, ENTRYPOINT, USER) for a target."""
    for stage in stage_chain(stages, target):
        values = [arguments for name, arguments in stage.instructions if name == keyword]
        if values:
            return values[-1]
    return None


def exec_form(arguments: str) -> list[str]:
    """CMD/ENTRYPOINT arguments as a list of words (JSON exec form or shell form)."""
    if arguments.startswith("["):
        words: list[str] = json.loads(arguments)
        assert all(isinstance(word, str) for word in words)
        return words
    return ["/bin/sh", "-c", arguments]


def container_command(
    dockerfile: Path,
    target: str | None,
    entrypoint: list[str] | None = None,
    command: list[str] | None = None,
) -> list[str]:
    """What a container of `target` runs: an entrypoint or command given by the deployment
    (compose's entrypoint/command, Kubernetes' command/args) over the image's own."""
    stages = parse_dockerfile(dockerfile)
    if entrypoint is None:
        image_entrypoint = effective(stages, target, "ENTRYPOINT")
        entrypoint = exec_form(image_entrypoint) if image_entrypoint else []
    if command is None:
        image_cmd = effective(stages, target, "CMD")
        command = exec_form(image_cmd) if image_cmd else []
    return entrypoint + command
