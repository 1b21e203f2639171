"""`thornctl lab`: the fabric lab, a fabric emulated in network namespaces on this machine.

Commands (all but `list` and `where` need root)
    up        build the lab, or repair it (idempotent); the fabric comes from --file,
              --generate NAME --set k=v, --from-store, or the lab's own description
    down      remove every namespace of the lab and its state (idempotent)
    status    nodes, links (both ends), workloads and faults; -o json for scripts
    list      the labs on this machine
    where     the namespace of a node or workload (and a port's interface name)
    fail      inject a failure: link, carrier, node, drop, loss
    restore   undo one failure (by id, link or node) or --all
    traffic   run a UDP or RoCEv2-shaped stream between two endpoints and meter it

Each command takes --prefix (env THORN_LAB_PREFIX, default "thorn"). Exit codes are
thornctl's: 1 for an unknown lab, node, link, workload or fault and for a conflict, 2 for
usage errors, 65 for a fabric that cannot be laid out, 69 when the kernel refuses, 77 when
not run as root. See docs/lab.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, Protocol, cast

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from thorn_lab.names import DEFAULT_PREFIX
from thornctl.errors import CliError, ExitCode
from thornctl.render import Out, OutputFormat

if TYPE_CHECKING:
    from thorn.model import FabricDocument
    from thorn_lab.faults import Direction
    from thorn_lab.handle import Lab
    from thorn_lab.state import FaultRecord
    from thorn_lab.status import EndStatus
    from thornctl.client import Client

__all__ = ["lab_app"]

lab_app = typer.Typer(
    help="The fabric lab: a fabric emulated in network namespaces (root).",
    no_args_is_help=True,
)
fail_app = typer.Typer(
    help="Inject a failure (recorded; `lab restore` undoes it).", no_args_is_help=True
)
lab_app.add_typer(fail_app, name="fail")

Prefix = Annotated[
    str,
    typer.Option(
        "--prefix", envvar="THORN_LAB_PREFIX", help="Lab name: its namespaces are PREFIX-*."
    ),
]


class _Session(Protocol):
    """What thornctl's main callback leaves in ctx.obj (thornctl.context.State)."""

    out: Out

    @property
    def client(self) -> Client: ...


def _out(ctx: typer.Context) -> Out:
    session = cast("_Session | None", ctx.obj)
    return session.out if session is not None else Out(OutputFormat.table)


def _need_root() -> None:
    if os.geteuid() != 0:
        raise CliError(
            "the lab needs root (network namespaces, netlink, BPF): run thornctl as root",
            ExitCode.NOPERM,
        )


@contextmanager
def _lab_errors() -> Iterator[None]:
    """The lab library's exceptions as thornctl exit codes."""
    from thorn_lab.blueprint import PlanError
    from thorn_lab.build import LabConflict
    from thorn_lab.faults import FaultConflict
    from thorn_lab.handle import LabNotFound, UnknownName

    try:
        yield
    except (LabNotFound, UnknownName, LabConflict, FaultConflict) as exc:
        raise CliError(str(exc), ExitCode.REFUSED) from None
    except PlanError as exc:
        raise CliError(str(exc), ExitCode.DATAERR) from None
    except ValueError as exc:  # bad parameters (pydantic's ValidationError is one)
        raise CliError(_one_line(exc), ExitCode.USAGE) from None
    except OSError as exc:
        raise CliError(f"the kernel refused: {exc}", ExitCode.UNAVAILABLE) from None


def _one_line(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
        )
    return str(exc)


def _open(prefix: str) -> Lab:
    from thorn_lab.handle import Lab

    return Lab.open(prefix)


# --- up / down / status ------------------------------------------------------------------


def _fabric(
    ctx: typer.Context,
    file: str | None,
    generator: str | None,
    sets: list[str] | None,
    from_store: bool,
) -> FabricDocument | None:
    from thorn.model import FabricDocument

    chosen = [x for x in (file is not None, generator is not None, from_store) if x]
    if len(chosen) > 1:
        raise CliError("give one of --file, --generate and --from-store", ExitCode.USAGE)
    if sets and generator is None:
        raise CliError("--set needs --generate", ExitCode.USAGE)
    if file is not None:
        return _from_file(file)
    if generator is not None:
        from thorn.generators import generate
        from thornctl.fabric import parse_sets  # the same KEY=VALUE rules as `generate`

        try:
            return generate(generator.replace("-", "_"), parse_sets(sets or []))
        except ValueError as exc:
            raise CliError(_one_line(exc), ExitCode.USAGE) from None
    if from_store:
        session = cast("_Session", ctx.obj)
        data: dict[str, Any] = session.client.get("/fabric")
        try:
            return FabricDocument.model_validate(data)
        except ValidationError as exc:
            raise CliError(f"the store's fabric: {_one_line(exc)}", ExitCode.PROTOCOL) from None
    return None


def _from_file(path: str) -> FabricDocument:
    import json

    from thorn.clab import ClabError, parse_clab
    from thorn.model import FabricDocument
    from thornctl.files import InputFormat, load_document

    doc = load_document(path, InputFormat.auto)
    try:
        if doc.kind is InputFormat.clab:
            return parse_clab(doc.body).document
        return FabricDocument.model_validate(json.loads(doc.body))
    except (ValidationError, ClabError) as exc:
        raise CliError(f"{doc.name}: {_one_line(exc)}", ExitCode.DATAERR) from None


@contextmanager
def _progress(out: Out) -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar per phase on a terminal; silent otherwise."""
    if not out.stderr_is_terminal:
        yield lambda phase, done, total: None
        return
    columns = (
        TextColumn("{task.description:<24}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=out.err, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def report(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)

        yield report


@lab_app.command()
def up(
    ctx: typer.Context,
    prefix: Prefix = DEFAULT_PREFIX,
    file: Annotated[
        str | None, typer.Option("--file", "-f", help="A fabric document or .clab.yml file.")
    ] = None,
    generator: Annotated[
        str | None, typer.Option("--generate", "-g", help="A generator, e.g. leaf-spine.")
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", metavar="KEY=VALUE", help="A generator parameter."),
    ] = None,
    from_store: Annotated[
        bool, typer.Option("--from-store", help="Export the fabric from the running API.")
    ] = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="Rebuild a lab that has another fabric.")
    ] = False,
) -> None:
    """Build the lab, or repair it: only what is missing or wrong is made."""
    from thorn_lab import build

    out = _out(ctx)
    doc = _fabric(ctx, file, generator, sets, from_store)
    _need_root()
    with _lab_errors():
        if doc is None:  # re-up (repair) with the fabric the lab was built from
            doc = _open(prefix).fabric
        with _progress(out) as progress:
            result = build.up(doc, prefix, replace=replace, progress=progress)
    if out.data(dataclasses.asdict(result)):
        return
    verb = "repaired" if result.repairs else "already up" if result.existed else "up"
    out.fields(
        [
            ("namespaces", f"{result.namespaces} ({result.created_namespaces} created)"),
            ("veth pairs", f"{result.veths} ({result.created_veths} created)"),
            ("repairs", _some(result.repairs)),
            ("held down by faults", result.held_down or None),
            ("not operationally up", _some(result.not_up)),
            ("ports without a link", _some(result.unlinked_ports)),
            ("seconds", f"{result.seconds:.2f}"),
        ],
        title=f"Lab '{prefix}' {verb}",
    )
    if result.not_up:
        out.warn(f"{len(result.not_up)} interface(s) did not come up: see thornctl lab status")


def _some(items: list[str], most: int = 5) -> str | None:
    if not items:
        return None
    more = f" (+{len(items) - most} more)" if len(items) > most else ""
    return ", ".join(items[:most]) + more


@lab_app.command()
def down(ctx: typer.Context, prefix: Prefix = DEFAULT_PREFIX) -> None:
    """Remove the lab completely (namespaces, veths, state). A missing lab is fine."""
    from thorn_lab import build

    out = _out(ctx)
    _need_root()
    with _lab_errors():
        result = build.down(prefix)
    if out.data(dataclasses.asdict(result)):
        return
    if not result.namespaces and not result.state_removed:
        out.line(f"No lab '{prefix}': nothing to remove")
        return
    out.line(
        f"Lab '{prefix}' down: {result.namespaces} namespaces removed in {result.seconds:.2f} s"
    )
    if result.held_by:
        out.warn(
            f"processes {', '.join(map(str, result.held_by))} still run in removed namespaces; "
            "those namespaces (and their veths) go when the processes exit"
        )


def _state(end: EndStatus) -> str:
    if not end.present:
        return "ABSENT"
    admin = "up" if end.admin_up else "ADMIN-DOWN"
    carrier = "" if end.carrier or not end.admin_up else " NO-CARRIER"
    return f"{end.operstate} ({admin}{carrier})"


@lab_app.command()
def status(ctx: typer.Context, prefix: Prefix = DEFAULT_PREFIX) -> None:
    """Nodes, links with the state of each end, workloads and recorded faults."""
    from thorn_lab.status import collect

    out = _out(ctx)
    _need_root()
    with _lab_errors():
        report = collect(_open(prefix))
    if out.data(report.model_dump(mode="json")):
        return
    health = "healthy" if report.healthy else "DEGRADED (something is missing or down)"
    out.line(f"Lab '{report.prefix}', created {report.created_at}: {health}")
    out.line()
    out.table(
        ["NODE", "ROLE", "NAMESPACE", "PRESENT", "TEPS (lo)"],
        ([n.name, n.role, n.namespace, n.present, n.teps] for n in report.nodes),
        caption=f"{len(report.nodes)} nodes",
    )
    out.line()
    out.table(
        ["LINK", "A", "B", "DROPS A/B", "FAULTS"],
        (
            [
                lk.name,
                _state(lk.a),
                _state(lk.b),
                f"{lk.a.ingress_drops}/{lk.b.ingress_drops}",
                lk.faults,
            ]
            for lk in report.links
        ),
        caption=f"{len(report.links)} links",
    )
    out.line()
    out.table(
        ["WORKLOAD", "NODE", "NAMESPACE", "IP", "VF", "REP"],
        (
            [w.name, w.node, w.namespace, w.ip, _state(w.vf), f"{w.rep.ifname} {_state(w.rep)}"]
            for w in report.workloads
        ),
        caption=f"{len(report.workloads)} workloads",
    )
    if report.faults:
        out.line()
        _fault_table(out, report.faults)


def _fault_table(out: Out, records: list[FaultRecord]) -> None:
    out.table(
        ["FAULT", "KIND", "TARGET", "SINCE", "WHAT EACH SIDE SEES"],
        (
            [
                f.id,
                f.kind.value + (f" {f.percent:g}%" if f.percent is not None else ""),
                f.target,
                f.created_at,
                "; ".join(f"{k}: {v}" for k, v in f.sees.items()),
            ]
            for f in records
        ),
        caption=f"{len(records)} faults (thornctl lab restore ID|--all)",
    )


@lab_app.command("list")
def list_(ctx: typer.Context) -> None:
    """The labs described on this machine (/run/thorn-lab)."""
    from thorn_lab import state

    out = _out(ctx)
    rows = []
    for prefix in state.list_labs():
        description = state.load_description(prefix)
        if description is None:
            continue
        rows.append(
            {
                "prefix": prefix,
                "created_at": description.created_at,
                "namespaces": len(description.plan.namespaces),
                "links": len(description.plan.links()),
                "workloads": len(description.plan.workloads),
                "faults": len(state.load_faults(prefix).faults),
            }
        )
    if out.data(rows):
        return
    out.table(
        ["PREFIX", "CREATED", "NAMESPACES", "LINKS", "WORKLOADS", "FAULTS"],
        ([list(r.values()) for r in rows]),
        caption=f"{len(rows)} labs",
    )


@lab_app.command()
def where(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="A node or workload.")],
    port: Annotated[str | None, typer.Argument(help="A port of the node.")] = None,
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """Print the namespace of NAME (and PORT's interface name): ip netns exec $(...)."""
    out = _out(ctx)
    with _lab_errors():
        lab = _open(prefix)
        found = {"namespace": lab.namespace(name)}
        if port is not None:
            found["ifname"] = lab.ifname(name, port)
    if not out.data(found):
        out.line(" ".join(found.values()))


# --- failures ----------------------------------------------------------------------------


def _inject(ctx: typer.Context, prefix: str, act: Callable[[Lab], FaultRecord]) -> None:
    out = _out(ctx)
    _need_root()
    with _lab_errors():
        record = act(_open(prefix))
    if out.data(record.model_dump(mode="json")):
        return
    out.fields(
        [(side, sees) for side, sees in record.sees.items()],
        title=f"Fault {record.id}: {record.kind.value} {record.target}",
    )
    out.note(f"undo with: thornctl lab restore {record.id} --prefix {prefix}")


LinkArg = Annotated[
    str, typer.Argument(metavar="LINK", help="node:port (either end), nodeA--nodeB, or a:p--b:q.")
]


@fail_app.command("link")
def fail_link(ctx: typer.Context, link: LinkArg, prefix: Prefix = DEFAULT_PREFIX) -> None:
    """Both ends admin down (each side sees admin down; its routes are deleted)."""
    from thorn_lab import faults

    _inject(ctx, prefix, lambda lab: faults.link_down(lab, link))


@fail_app.command("carrier")
def fail_carrier(
    ctx: typer.Context,
    end: Annotated[str, typer.Argument(metavar="NODE:PORT", help="The end that loses carrier.")],
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """NODE:PORT loses carrier (its peer goes admin down); routes at NODE:PORT stay."""
    from thorn_lab import faults

    _inject(ctx, prefix, lambda lab: faults.carrier_loss(lab, end))


@fail_app.command("node")
def fail_node(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="A node: all its ports go admin down.")],
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """Every port of NODE admin down: its neighbours see carrier loss."""
    from thorn_lab import faults

    _inject(ctx, prefix, lambda lab: faults.node_down(lab, node))


DirectionOpt = Annotated[
    str,
    typer.Option("--direction", "-d", help="both, in (arriving at the first-named end) or out."),
]


@fail_app.command("drop")
def fail_drop(
    ctx: typer.Context,
    link: LinkArg,
    direction: DirectionOpt = "both",
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """Silent drop: every packet vanishes, carrier and admin state stay up."""
    from thorn_lab import faults

    way = _direction(direction)
    _inject(ctx, prefix, lambda lab: faults.silent_drop(lab, link, way))


@fail_app.command("loss")
def fail_loss(
    ctx: typer.Context,
    link: LinkArg,
    percent: Annotated[
        float, typer.Option("--percent", "-p", min=0.001, max=99.999, help="Packets lost, %.")
    ],
    direction: DirectionOpt = "both",
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """Random packet loss at PERCENT; carrier and admin state stay up."""
    from thorn_lab import faults

    way = _direction(direction)
    _inject(ctx, prefix, lambda lab: faults.packet_loss(lab, link, percent, way))


def _direction(text: str) -> Direction:
    from thorn_lab.faults import Direction

    try:
        return Direction(text)
    except ValueError:
        raise CliError(
            f"--direction must be both, in or out, not '{text}'", ExitCode.USAGE
        ) from None


@lab_app.command()
def restore(
    ctx: typer.Context,
    fault: Annotated[
        str | None, typer.Argument(metavar="FAULT", help="A fault id, link or node.")
    ] = None,
    everything: Annotated[bool, typer.Option("--all", help="Undo every recorded fault.")] = False,
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """Undo a recorded failure (or --all)."""
    from thorn_lab import faults

    out = _out(ctx)
    if (fault is None) == (not everything):
        raise CliError("give a FAULT or --all (not both)", ExitCode.USAGE)
    _need_root()
    with _lab_errors():
        undone = faults.restore(_open(prefix), fault)
    if out.data([f.model_dump(mode="json") for f in undone]):
        return
    if not undone:
        out.line(f"Lab '{prefix}' has no recorded faults")
        return
    for record in undone:
        out.line(f"Restored {record.id}: {record.kind.value} {record.target}")


# --- traffic -------------------------------------------------------------------------------


@lab_app.command()
def traffic(
    ctx: typer.Context,
    src: Annotated[str, typer.Argument(help="Workload, node, or NAME@ADDRESS.")],
    dst: Annotated[str, typer.Argument(help="Workload, node, or NAME@ADDRESS.")],
    rate: Annotated[int, typer.Option("--rate", "-r", help="Packets per second.")] = 1000,
    count: Annotated[int, typer.Option("--count", "-n", help="Packets at most.")] = 1000,
    duration: Annotated[float, typer.Option("--duration", help="Seconds at most.")] = 10.0,
    size: Annotated[int, typer.Option("--size", help="UDP payload bytes.")] = 64,
    port: Annotated[int, typer.Option("--port", help="UDP destination port.")] = 5000,
    roce: Annotated[
        bool, typer.Option("--roce", help="RoCEv2-shaped: port 4791, BTH header with a PSN.")
    ] = False,
    qp: Annotated[int, typer.Option("--qp", help="RoCE destination QP number.")] = 0x11,
    linger: Annotated[
        float, typer.Option("--linger", help="Seconds to wait for stragglers.")
    ] = 0.5,
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """Send a paced stream from SRC to DST and report loss, reordering and the longest gap."""
    from thorn_lab import traffic as gen

    out = _out(ctx)
    _need_root()
    with _lab_errors():
        spec = gen.StreamSpec(
            src=src,
            dst=dst,
            kind="roce" if roce else "udp",
            rate_pps=rate,
            count=count,
            duration_s=duration,
            size=size,
            port=port,
            qp=qp,
            linger_s=linger,
        )
        lab = _open(prefix)
        with _spinner(out, f"{spec.packets} packets at {rate}/s from {src} to {dst}"):
            report = gen.run(lab, spec)
    if out.data(report.model_dump(mode="json")):
        return
    out.fields(
        [
            ("from", f"{report.src_ip} ({report.src_namespace})"),
            ("to", f"{report.dst_ip}:{report.dst_port} ({report.dst_namespace})"),
            (
                "sent",
                f"{report.sent} at {report.send_rate_pps:g}/s"
                + (f", {report.send_errors} refused by the kernel" if report.send_errors else ""),
            ),
            ("received", report.received),
            ("lost", f"{report.lost} ({report.loss_pct:g} %)"),
            ("reordered", report.reordered),
            ("duplicates", report.duplicates),
            (
                "longest gap",
                f"{report.max_gap_ms:g} ms"
                + (
                    f" after seq {report.max_gap_before_seq}, {report.max_gap_offset_ms:g} ms "
                    f"into the stream ({report.max_gap_at})"
                    if report.max_gap_at
                    else ""
                ),
            ),
            (
                "longest loss",
                f"{report.max_loss_ms:g} ms, packets {report.max_loss_range[0]}-"
                f"{report.max_loss_range[1]} (sent from {report.max_loss_at})"
                if report.max_loss_ms is not None and report.max_loss_range is not None
                else "none",
            ),
        ],
        title=f"{spec.kind} stream {src} -> {dst}",
    )


@contextmanager
def _spinner(out: Out, message: str) -> Iterator[None]:
    if not out.stderr_is_terminal:
        yield
        return
    with out.err.status(message):
        yield
