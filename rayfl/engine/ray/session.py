"""The Ray instance rayfl runs on: connect to one or start one, and shut down only the one rayfl started.

This module imports Ray and rayfl's config only (no torch), so that the CLI can start Ray before it imports the driver:
``prestart`` runs ``ray.init`` in the main thread (with signals held until it returns, ``engine/stop.py``'s
``hold_signals_during``) while a second thread imports the driver's modules and loads the data. ``ray.init`` spends most
of its seconds waiting for the processes it spawned to register (its own process is idle meanwhile), and torch's import
is the driver's largest start-up cost, so the two overlap on any machine with a second core."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

import ray

from rayfl.config.sections import BackendConfig
from rayfl.core.errors import ConfigError
from rayfl.engine.stop import hold_signals_during
from rayfl.experiment.schema import ExperimentConfig

if TYPE_CHECKING:
    from rayfl.data.federated import FederatedDataset

__all__ = ["Prestarted", "ensure_ray", "gcs_address", "prestart", "shutdown_ray"]

log = logging.getLogger(__name__)

_started_gcs: str | None = None  # the GCS address of the Ray instance rayfl started in this process, if any


def cluster_a_bare_init_joins() -> str | None:
    """The cluster ``ray.init()`` without an address would join instead of starting one: ``RAY_ADDRESS``, or the
    cluster the last ``ray start`` on this machine recorded (Ray's own lookup). Such a cluster is not rayfl's: it is
    never shut down, and ``ray.init`` refuses ``num_cpus`` and ``object_store_memory`` when joining it."""
    from ray._private.services import canonicalize_bootstrap_address  # Ray's lookup, so the two never disagree

    try:
        found = canonicalize_bootstrap_address(None)
    except Exception as err:  # a malformed RAY_ADDRESS: ray.init will say so itself
        log.debug("no cluster to join: %s", err)
        return None
    return str(found) if found else None


def init_kwargs(cfg: BackendConfig, *, joining: bool) -> dict[str, Any]:
    """``ray.init``'s arguments: sizes only for a Ray rayfl starts itself, an address only when the config names one."""
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
    if cfg.address:
        kwargs["address"] = cfg.address
    elif not joining:
        if cfg.num_cpus:
            kwargs["num_cpus"] = cfg.num_cpus
        if cfg.object_store_mb:
            kwargs["object_store_memory"] = cfg.object_store_mb << 20
    return kwargs


def gcs_address() -> str:
    """The address of the Ray instance this process is connected to (tells one Ray instance from the next)."""
    return str(ray.get_runtime_context().gcs_address)


def ensure_ray(cfg: BackendConfig) -> bool:
    """Connect to (or start) Ray; returns True when this call connected this process (started or joined a Ray).

    Without ``backend.address`` a cluster that a bare ``ray.init()`` would join (``RAY_ADDRESS``, or the last ``ray
    start`` on this machine) is joined as Ray itself would, without the sizes it refuses; otherwise a local Ray starts.

    A running Ray is reused, whoever started it: runs in one process (a sweep's trials, a notebook calling
    ``run_experiment`` twice) pay Ray's start once. Backends never shut Ray down; one rayfl started stays up until
    ``shutdown_ray`` or the end of the process (Ray's own exit hook), and one rayfl did not start is never shut down.
    """
    if cfg.address:  # an address named in the config must answer, even when some Ray is connected already
        _probe_address(cfg.address, cfg.start_timeout_s)
    if ray.is_initialized():
        log.debug("reusing the running Ray instance (backend.num_cpus and object_store_mb apply to a new one only)")
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    joining = cfg.address or cluster_a_bare_init_joins()
    quiet_token_auth_notice()
    if joining and not cfg.address:
        log.info(
            "joining the Ray cluster at %s (RAY_ADDRESS or the last `ray start` on this machine, as a bare "
            "ray.init() does); backend.num_cpus and object_store_mb apply to a Ray rayfl starts",
            joining,
        )

    def start() -> None:
        global _started_gcs
        with _ray_leaves_signals_alone():
            ray.init(**init_kwargs(cfg, joining=bool(joining)))
        _started_gcs = None if joining else gcs_address()

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        # what ray.init would have put in (a process with no SIGTERM handler of its own: a script, a notebook, a
        # sweep's driver): SIGTERM exits through SystemExit, so atexit hooks (Ray's shutdown) and finally blocks run
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # no signal handler's exception lands inside ray.init; a signal that arrives meanwhile is handled once it returns
    hold_signals_during(start)
    return True


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Ray's own SIGTERM handler, which ``_ray_leaves_signals_alone`` keeps ``ray.init`` from putting in."""
    sys.exit(signum)


class _TokenAuthNotice(logging.Filter):
    """Drops Ray's "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out."
    warning, which Ray (2.5x on) logs on every ``ray.init`` that starts a local instance or finds a token here.

    Nothing about authentication changes: Ray keeps the mode it chose (token authentication on, its token in
    ``~/.ray/auth_token``), which rayfl reports once at debug level. Saying the mode through ``RAY_AUTH_MODE`` instead
    would silence it too, but Ray reads that variable into its C++ config when it is imported, so setting it later
    leaves the driver without its token (measured: the driver then fails to authenticate to its own GCS)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Token authentication is enabled for this Ray cluster"):
            log.debug("Ray token authentication is on (RAY_AUTH_MODE=disabled turns it off)")
            return False
        return True


def quiet_token_auth_notice() -> None:
    """Install ``_TokenAuthNotice`` on Ray's authentication logger (once)."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _TokenAuthNotice) for f in logger.filters):
        logger.addFilter(_TokenAuthNotice())


@contextlib.contextmanager
def _ray_leaves_signals_alone() -> Iterator[None]:
    """Around ``ray.init`` in the main thread: Ray neither puts in its SIGTERM handler (``sys.exit(15)`` wherever the
    signal lands) nor absl's failure-signal handler in the driver's core worker (which catches SIGTERM too, and whose
    process then aborts, exit -6), so the handlers ``hold_signals_during`` put in stay in place through the start (a
    process without a SIGTERM handler of its own gets Ray's, ``_exit_on_sigterm``, from ``ensure_ray`` before it).

    Measured on Ray 2.60 (``tests/integration/test_early_stop.py``'s run, SIGTERM sent 0-0.4 s after "Started a local
    Ray instance", inside ``connect``): with Ray's handler the run hung for good in ``~GlobalStateAccessor`` (the
    ``SystemExit`` landed in ``connect``) or aborted in absl's handler; with neither, every delay exits 143. Both are
    Ray's private names (``ray._private.utils.set_sigterm_handler``, read at each ``ray.init``;
    ``ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER``, read when the core worker is made): a Ray without them is
    left as it is. The driver's crashes (SIGSEGV) then go without absl's C++ stack; Ray's workers keep the handler.
    Running ``ray.init`` in another thread instead is not an option: Ray's processes die with the thread that
    started them (``PR_SET_PDEATHSIG``), measured as a run that lost its GCS when that thread ended."""
    utils = ray._private.utils
    constants = ray._private.ray_constants
    patched = hasattr(utils, "set_sigterm_handler") and hasattr(constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER")
    if not patched:
        yield
        return
    saved = utils.set_sigterm_handler, constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    utils.set_sigterm_handler = lambda handler: None
    constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    try:
        yield
    finally:
        utils.set_sigterm_handler, constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = saved


@dataclass
class Prestarted:
    """What ``prestart`` made: the data set, and the wall seconds of its steps: ``ray_start_s`` (main thread) beside
    ``import_s`` then ``load_s`` (second thread), and ``pool_s`` (creating the actors once Ray was up)."""

    dataset: FederatedDataset | None
    startup_s: dict[str, float] = field(default_factory=dict)


def prestart(cfg: ExperimentConfig, modules: Sequence[str] = ()) -> Prestarted:
    """``rayfl run``'s start on the Ray backend, before the driver exists: Ray starts in this (main) thread while a
    second thread imports ``modules`` (and the actors' module) and then loads the data set; as soon as Ray is up and
    the imports are done, the run's actors are created and parked for the run to take (``ray_pool.prestart_pool``),
    so they start while the data is still loading. The data set is for ``run_experiment(dataset=...)`` (hand it over
    without keeping a reference: the run keeps only the object store's view of it). A load error is raised once Ray
    is up (which then stays for the next run), after the actors are released."""
    imported = threading.Event()
    timed: dict[str, float] = {}

    def work() -> FederatedDataset:
        began = time.perf_counter()
        for name in (*modules, "rayfl.engine.ray.pool"):
            importlib.import_module(name)
        imported.set()
        timed["import_s"] = time.perf_counter() - began
        from rayfl.data import build_federated_dataset

        began = time.perf_counter()
        dataset = build_federated_dataset(cfg.data, cfg.data_seed)
        timed["load_s"] = time.perf_counter() - began
        return dataset

    from rayfl.data.blas_threads import one_blas_thread

    # numpy's BLAS at one thread while ``ray.init`` forks beside the data's loading (``rayfl/data/blas_threads.py``)
    with one_blas_thread(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="rayfl-prestart") as threads:
        loading = threads.submit(work)
        began = time.perf_counter()
        ensure_ray(cfg.backend)
        timed["ray_start_s"] = time.perf_counter() - began
        while not imported.wait(0.05):  # the main thread imports nothing the other one is importing
            if loading.done():
                loading.result()  # an import error
        from rayfl.engine.ray.pool import prestart_pool, release_warm_pool

        began = time.perf_counter()
        prestart_pool(cfg.backend)
        timed["pool_s"] = time.perf_counter() - began
        try:
            return Prestarted(loading.result(), timed)
        except BaseException:
            release_warm_pool()
            raise


def shutdown_ray() -> bool:
    """Release rayfl's warm actors (``backend.keep_warm``), then shut down the Ray instance rayfl started in this
    process, if it still runs; returns whether it did. A Ray instance rayfl connected to but did not start is left
    alone (its warm actors are released all the same)."""
    global _started_gcs
    pools = sys.modules.get("rayfl.engine.ray.pool")  # not imported: no run has made a pool in this process
    if pools is not None and ray.is_initialized():
        pools.release_warm_pool()
    if _started_gcs is None or not ray.is_initialized() or gcs_address() != _started_gcs:
        return False
    ray.shutdown()
    _started_gcs = None
    return True


def _probe_address(address: str, timeout_s: float) -> None:
    """Fail within ``timeout_s`` when nothing listens at a ``host:port`` cluster address: ``ray.init`` itself keeps
    retrying an unreachable GCS for many minutes. ``auto`` (and addresses without a port) go to Ray as they are."""
    host, sep, port_text = address.removeprefix("ray://").rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host.strip("[]"), int(port_text)), timeout=max(left, 0.05)):
                return
        except OSError as err:
            if time.monotonic() + 0.25 >= deadline:
                raise ConfigError(
                    f"no Ray cluster answers at {address} within {timeout_s:g} s ({err.strerror or err}); start one "
                    "there (ray start --head --port=PORT), fix backend.address, or leave it unset for a local Ray",
                    "backend.address",
                ) from None
            time.sleep(0.25)
