"""The jobs' HTTP side, added to the app: the manager (its table under `<data dir>/jobs`),
`/v1/files`, `/v1/fine_tuning/jobs`, `/v1/jobs`, and the exclusive-job gate."""

from pathlib import Path
from typing import Any

from fastapi import FastAPI

from . import files_api, fine_tuning_api, jobs_api
from .gate import ExclusiveJobGate
from .manager import JobManager
from .publish import Publisher


def add_routes(app: FastAPI, state: Any) -> None:
    root = Path(state.config.data_dir) / "jobs"
    state.jobs = JobManager(root, state.provider.pool, Publisher(state.provider))
    files_api.add_routes(app)
    fine_tuning_api.add_routes(app)
    jobs_api.add_routes(app)
    app.add_middleware(ExclusiveJobGate, state=state)
