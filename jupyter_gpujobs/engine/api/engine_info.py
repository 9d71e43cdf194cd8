"""Handlers that say what this engine is: its GPUs (`gpus`), the caller (`whoami`), what is
in force for `jupyter gpujobs doctor` (`info`), and the OpenAPI spec (`openapi.json`).

May call: `base`, the JobService's views, `connections` and `store.report` (for `info`)."""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from .base import API, SPEC_PATH, GPUJobsHandler, engine_notice


class GPUsHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        out: dict[str, Any] = {"gpus": self.service.access.gpu_views_for(self.service.gpu_views(), self.owner),
                               "backend": self.service.gpus.name,
                               "isolation": self.service.isolation,
                               "share_enforcement": self.service.shares.describe(self.service.inventory),
                               "share_mode": self.service.shares.mode()}
        fleet = getattr(self.service.gpus, "fleet", None)
        if fleet and self.service.gpus.name == "fake":  # what a kernel puts in GPUJOBS_FAKE_FLEET
            out["fake_fleet"] = fleet
        notice = engine_notice(self.service)
        if notice:
            out["notice"] = notice
        self.reply(out)



class WhoAmIHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        user = self.owner
        out: dict[str, Any] = {"user": user, "admin": self.service.is_admin(user)}
        notice = engine_notice(self.service)
        if notice:
            out["notice"] = notice
        self.reply(out)


class InfoHandler(GPUJobsHandler):
    """What is in force in this engine, for `jupyter gpujobs doctor`: its version, the GPU
    backend and GPUs, the store (kind and size; its URL for admins), the isolation of jobs,
    and who the caller is."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        from ... import __version__
        from ..connections import open_files_report
        from ..store.report import store_report

        user = self.owner
        admin = self.service.is_admin(user)
        gpus = self.service.access.gpu_views_for(self.service.gpu_views(), user)
        store = store_report(self.service.store)
        if not admin:
            store.pop("url")
        self.reply({
            "version": __version__,
            "open_files": open_files_report(),
            "user": user,
            "admin": admin,
            "identity": self.settings.get("gpujobs_identity", "unix"),
            "backend": self.service.gpus.name,
            "runner": self.service.runner.name,
            "gpus": len(gpus),
            "gpu_models": sorted({g["name"] for g in gpus}),
            "store": store,
            "isolation": self.service.isolation,
            "share_enforcement": self.service.shares.describe(self.service.inventory),
            "share_mode": self.service.shares.mode(),
            # on fake GPUs: the name a process puts in GPUJOBS_FAKE_FLEET to be on this engine's
            # GPUs only (engine/gpus/fake.py); a demo's hand-made "rogue" uses it
            "fake_fleet": getattr(self.service.gpus, "fleet", None),
            # jobs in container images (docs/containers.md): {"ready", "text", "default_image"}
            "containers": self.service.state.containers.describe(
                bool(getattr(self.service.runner, "runs_containers", False)), self.service.runner.name),
        })



class OpenAPIHandler(GPUJobsHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        spec = json.loads(SPEC_PATH.read_text())
        spec["servers"] = [{"url": self.base_url.rstrip("/") + "/" + API}]
        self.reply(spec)
