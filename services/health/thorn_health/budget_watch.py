"""Health's shell around `budget.py`: reads a window of failovers from the store and compares
them with the tenants' RC budgets, for the API and, every `refresh_seconds`, for the
per-tenant gauges.

Every replica computes the gauges from the same store, so they agree; a histogram would count
each failover once per replica (and again after each restart), so there is none.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import structlog

from thorn.health_records import FailoverQuery
from thorn.rcbudget import Tenancy, TenantBudgetSummary
from thorn.store import Store
from thorn_health.budget import export_metrics, summaries_of_traces

log = structlog.get_logger("thorn.health.budget")

WINDOW = timedelta(days=7)  # what the gauges cover: the newest `LIMIT` failovers of a week
LIMIT = 1000


class BudgetWatch:
    def __init__(
        self,
        store: Store,
        tenancy: Callable[[], Tenancy],
        *,
        refresh_seconds: float = 30.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.store = store
        self.tenancy = tenancy
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self._exported: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    async def summaries(
        self, since: datetime | None = None, limit: int = LIMIT, only: str | None = None
    ) -> list[TenantBudgetSummary]:
        """Each tenant (or `only`) against the newest `limit` failovers started since `since`
        (default: a week ago)."""
        start = since if since is not None else self.clock() - WINDOW
        _, traces = await self.store.failover_page(FailoverQuery(since=start, limit=limit))
        tenancy = self.tenancy()  # the topology now: one snapshot for the whole answer
        # Off the event loop: a thousand timelines must not hold up agents' reports.
        return await asyncio.to_thread(summaries_of_traces, traces, tenancy, only)

    async def refresh_metrics(self) -> None:
        self._exported = export_metrics(await self.summaries(), self._exported)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="health-rc-budget")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([self._task], timeout=5.0)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh_metrics()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the database away: the gauges wait, health serves
                log.warning("rc_budget_metrics_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(self.refresh_seconds)
