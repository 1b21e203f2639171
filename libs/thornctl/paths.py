"""thornctl paths and plan: a pair's red and blue routes, the plan's state, a forced
recompute, and what-ifs (pathcomp's API, through the one URL)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from thornctl.context import state_of
from thornctl.render import Out, spinner

plan_app = typer.Typer(
    help="The path plan: its state, a recompute, what-ifs.", no_args_is_help=True
)


def _route(route: dict[str, Any] | None) -> str:
    return " -> ".join(route["nodes"]) if route else "no path"


def paths(
    ctx: typer.Context,
    src: Annotated[str, typer.Argument(help="Source host.")],
    dst: Annotated[str, typer.Argument(help="Destination host.")],
) -> None:
    """The red and blue routes between two hosts, what they share, and the pair's status."""
    state = state_of(ctx)
    shown: dict[str, Any] = state.client.get("/paths", src=src, dst=dst)
    if state.out.data(shown):
        return
    out = state.out
    out.table(
        ["COLOUR", "HOPS", "EGRESS", "ROUTE"],
        ([c, (shown[c] or {}).get("hops"), shown["egress"].get(c), _route(shown[c])]
         for c in ("red", "blue")),
        title=f"{src} -> {dst}: {shown['status']} (plan {shown['plan_revision']})",
        no_wrap=3,
    )  # fmt: skip
    shared = shown["shared"]
    risks = [f"link {i}" for i in shared["links"]] + [f"switch {s}" for s in shared["switches"]]
    risks += [f"SRLG {s}" for s in shared["srlgs"]]
    out.line(f"shared: {', '.join(risks) if risks else 'nothing'}")


def _show_plan(out: Out, plan: dict[str, Any]) -> None:
    out.fields(
        [
            ("revision", f"{plan['revision']} (topology {plan['topology_revision']})"),
            ("last computed", f"{plan['kind']} in {plan['compute_seconds']:.3f} s, "
                              f"{plan['recomputed_groups']} groups, "
                              f"{plan['published_nodes']} nodes written"),
            ("hosts", f"{plan['hosts']} in {plan['groups']} attachment groups"),
            ("pairs", plan["pairs"]),
            ("protected", plan["protected_pairs"]),
            ("shared risk", plan["shared_risk_pairs"]),
            ("unprotected", f"{plan['unprotected_pairs']} ({plan['unreachable_pairs']} "
                            "unreachable)"),
            ("stretch", ", ".join(f"{c}: max {s['max']}, mean {s['mean']:.2f}"
                                  for c, s in plan["stretch"].items())),
        ],
        title="Plan",
    )  # fmt: skip


@plan_app.command("show")
def plan_show(ctx: typer.Context) -> None:
    """The plan's revision, timing and how every host pair is protected."""
    state = state_of(ctx)
    shown: dict[str, Any] = state.client.get("/plan")
    if not state.out.data(shown):
        _show_plan(state.out, shown)


@plan_app.command("recompute")
def plan_recompute(ctx: typer.Context) -> None:
    """Recompute the whole plan from the stored topology (admin role)."""
    state = state_of(ctx)
    with spinner(state.out, "recomputing the plan"):
        shown: dict[str, Any] = state.client.post("/plan/recompute")
    if not state.out.data(shown):
        _show_plan(state.out, shown)


@plan_app.command("what-if")
def plan_what_if(
    ctx: typer.Context,
    link: Annotated[
        list[int] | None, typer.Option("--link", "-l", min=0, help="A link id to fail (repeat).")
    ] = None,
    node: Annotated[
        list[str] | None, typer.Option("--node", "-n", help="A switch or host to fail (repeat).")
    ] = None,
) -> None:
    """What failing these links and nodes would do, simulated on a copy of the plan:
    nothing in the fabric changes."""
    state = state_of(ctx)
    if not link and not node:
        raise typer.BadParameter("name at least one --link or --node", param_hint="--link")
    with spinner(state.out, "simulating"):
        shown: dict[str, Any] = state.client.get(
            "/plan/what-if", link=[str(i) for i in link or []], node=list(node or [])
        )
    if state.out.data(shown):
        return
    out = state.out
    out.fields(
        [
            ("fails", f"{', '.join(shown['nodes']) or '-'}; links "
                      f"{', '.join(map(str, shown['links']))}"),
            ("flip", f"{shown['flip']} pairs: the active (red) path is cut, the source flips "
                     "to blue"),
            ("lose protection", f"{shown['lose_protection']} pairs: only the backup is cut"),
            ("cut", f"{shown['cut']} pairs: both paths are cut until re-protection"),
            ("after re-protection", ", ".join(f"{n} {k}" for k, n in shown["after"].items())
             or "-"),
            ("of", f"{shown['pairs']} pairs in plan {shown['plan_revision']}; simulated in "
                   f"{shown['compute_seconds'] * 1000:.0f} ms"),
        ],
        title="What if",
    )  # fmt: skip
    if shown["examples"]:
        out.line()
        out.table(
            ["FROM", "TO", "NOW", "AFTER RE-PROTECTION"],
            ([e["src"], e["dst"], e["verdict"], e["after"]] for e in shown["examples"]),
            caption="some affected pairs",
        )
