"""Where a run or sweep launched by ``ray job submit`` writes: somewhere that outlives the job.

Ray runs a job's entry point in the job's working directory, which with ``--working-dir`` is an extracted copy under
the node's Ray session folder (``.../session_*/runtime_resources/working_dir_files/_ray_pkg_*``): Ray garbage-collects
it when no job uses it, and ``ray down`` deletes the node. A relative ``output_dir`` (the default ``runs``) would put
the results there. So under a Ray job (Ray sets ``RAY_JOB_CONFIG_JSON_ENV_VAR`` for a job's entry point) a relative
``output_dir`` is resolved against ``$RAYFL_OUTPUT_ROOT`` when set (point it at storage every node mounts, in the
job's ``--runtime-env-json`` env_vars or the cluster's setup), else against ``~/rayfl-runs`` on the driver's node,
and the command says where at start; an absolute ``output_dir`` inside Ray's session folder is refused in one line.
Outside a job, and for a storage URI (``s3://``, ``gs://``), nothing changes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from rayfl.core.errors import ConfigError
from rayfl.core.files import is_storage_uri

__all__ = ["DEFAULT_JOB_ROOT", "JOB_ENV", "ROOT_ENV", "job_output_dir"]

JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray's job supervisor for the entry point (ray job submit)
ROOT_ENV = "RAYFL_OUTPUT_ROOT"
DEFAULT_JOB_ROOT = "~/rayfl-runs"
_EPHEMERAL = "runtime_resources"  # the session folder's cache of jobs' working directories and packages


def _inside_ray_cache(path: Path) -> bool:
    return _EPHEMERAL in path.parts and any(part.startswith("session_") for part in path.parts)


def job_output_dir(output_dir: str, env: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """The ``output_dir`` to write to, and the line to say at start (None when it is used as given)."""
    env = os.environ if env is None else env
    if JOB_ENV not in env or is_storage_uri(output_dir):  # a storage URI outlives any job as it is
        return output_dir, None
    given = Path(output_dir).expanduser()
    if given.is_absolute():
        if _inside_ray_cache(given.resolve()):
            raise ConfigError(
                f"{output_dir} is inside Ray's session folder, which Ray deletes after the job: give a folder outside "
                f"it (storage every node mounts, or set {ROOT_ENV} and a relative output_dir)",
                "output_dir",
            )
        return output_dir, None
    root_text = env.get(ROOT_ENV) or DEFAULT_JOB_ROOT
    root = Path(root_text).expanduser()
    if not root.is_absolute():
        raise ConfigError(f"{ROOT_ENV}={root_text!r} must be an absolute path", "output_dir")
    if _inside_ray_cache(root.resolve()):
        raise ConfigError(f"{ROOT_ENV}={root_text!r} is inside Ray's session folder, which Ray deletes", "output_dir")
    resolved = str(root / given)
    source = f"${ROOT_ENV}" if env.get(ROOT_ENV) else DEFAULT_JOB_ROOT
    note = (
        f"rayfl: running as a Ray job: output_dir {output_dir!r} resolved against {source}, to {resolved} (a job's "
        f"working directory is deleted with it; set {ROOT_ENV} to shared storage, or an absolute output_dir)"
    )
    return resolved, note
