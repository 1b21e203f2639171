"""thornctl cabling and mismatches: what the agents registered beside what is declared."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from thornctl.context import state_of

commands = typer.Typer()  # its top-level commands, added to thornctl's root by main.py


# --- registrations: observed beside declared -------------------------------------------------


class CablingState(StrEnum):
    verified = "verified"
    unverified = "unverified"
    miscabled = "miscabled"


@commands.command()
def cabling(
    ctx: typer.Context,
    only: Annotated[CablingState | None, typer.Option("--state", case_sensitive=False,
                                                      help="Only links in this state.")] = None,
) -> None:  # fmt: skip
    """Each link's cabling as the agents' LLDP probes hear it; a miscabled link is out of
    the paths until it is heard cabled as declared."""
    state = state_of(ctx)
    body = state.client.get("/cabling", state=only.value if only else None)
    if state.out.data(body):
        return
    state.out.table(
        ["LINK", "A", "B", "CABLING", "OUT OF PATHS", "HEARD", "REASON"],
        ([lk["link_id"], lk["a"], lk["b"], lk["state"], "yes" if lk["out_of_service"] else "no",
          "; ".join(lk["heard"]) or "-", lk["reason"] or "-"] for lk in body["links"]),
        caption=f"{body['verified']} verified, {body['unverified']} unverified, "
        f"{body['miscabled']} miscabled; {body['out_of_service']} out of the paths",
    )  # fmt: skip


@commands.command()
def mismatches(ctx: typer.Context) -> None:
    """Where the nodes, as their agents registered them, differ from their declaration."""
    state = state_of(ctx)
    body = state.client.get("/mismatches")
    if state.out.data(body):
        return
    state.out.table(
        ["NODE", "KIND", "SUBJECT", "DECLARED", "OBSERVED", "MESSAGE"],
        ([m["node"], m["kind"], m["subject"], m["declared"] or "-", m["observed"] or "-",
          m["message"]] for m in body["mismatches"]),
        caption=f"{body['registered']} node(s) registered, {len(body['unregistered'])} not",
        no_wrap=2,
    )  # fmt: skip
