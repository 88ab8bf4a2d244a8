"""``ClientHost``: runs the clients of one partition, one after another, and pre-aggregates their updates.

The same class serves both backends: the Ray backend wraps it in an actor (one per core or GPU share), the in-process
backend instantiates it directly. A host receives the whole data set once (a zero-copy view of Ray's object store)
and per round only task descriptions plus one reference to the global parameters.

Devices: a host computes on the device ``engine/exec/device.py`` chooses (the CPU unless it holds a GPU share). Its
models live there; global parameters arrive and updates leave as CPU tensors, so partial sums, compression, the shards
and everything after them are the same on every device. Algorithms put a batch where the model is.

Several global models: a task names its model's architecture (``TrainTask.model_config``); the host builds each
architecture once (kept by config), loads the model's own tensors from the flat parameter dict and names the update's
tensors back under the model's prefix (``fl/common/multimodel.py``), so the reduction is the same code for any model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rayfl.config.model import ModelConfig, as_model_config
from rayfl.config.sections import BackendConfig, CompressionConfig, host_gpu_shares
from rayfl.core.messages import Assignment, ClientOutcome, ClientUpdate, LinkDraw, TrainTask
from rayfl.core.reducers import Partial, as_arrays, params_bytes, split_partial
from rayfl.core.rng import derive_seed
from rayfl.data.federated import FederatedDataset
from rayfl.engine.exec.allocator import tune_allocator
from rayfl.engine.exec.client_state import ClientMemory, KeptUpload, keeps_state, own_global, padded_tensor
from rayfl.engine.exec.device import use_device
from rayfl.fl.api import capabilities
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.multimodel import model_key, model_params
from rayfl.models import InputSpec, build_model, to_input
from rayfl.models.elastic import ElasticFamily
from rayfl.models.elastic.family import gather
from rayfl.models.elastic.spec import first_k
from rayfl.models.families import FAMILIES, build_family
from rayfl.models.inputs import client_spec
from rayfl.system.compression import compress_update, upload_bytes
from rayfl.system.links import attempted, column_levels, delivered, level_ratio, restrict_update, slice_numel

__all__ = ["ClientHost", "EvalStats", "NumpyParams"]

NumpyParams = dict[str, np.ndarray]
_SUB_MODEL_CACHE = 8  # sub-model structures a host keeps built


@dataclass(frozen=True)
class EvalStats:
    """Per evaluation batch: summed loss, correct predictions and sample count (combined in batch order)."""

    batch_ids: np.ndarray
    loss_sum: np.ndarray
    correct: np.ndarray
    count: np.ndarray
    correct_mask: tuple[np.ndarray, ...] = ()  # per batch: which samples were predicted right (per-client accuracy)
    nonfinite: int = 0  # samples whose logits held a NaN or an infinity (the evaluation is then NaN, not 0 %)


def as_tensors(params: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """Wrap (possibly read-only, object-store backed) arrays as tensors without copying; callers must not write."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        return {k: torch.from_numpy(v) for k, v in params.items()}


@contextlib.contextmanager
def _seeded_rng(task: TrainTask, device: torch.device) -> Iterator[None]:
    """Torch's global generators (dropout, anything an algorithm draws without its own generator) seeded from
    ``(seed, "local", round, client)`` while a client trains, and restored afterwards: a client's training is the same
    on whichever host, backend or order it runs."""
    devices = [device] if device.type == "cuda" else []
    seed = derive_seed(task.seed, "local", task.round_idx, task.client_id)
    with torch.random.fork_rng(devices=devices):
        if devices:
            torch.manual_seed(seed)
        else:  # the CPU generator alone: torch.manual_seed also queues lazy seeds for CUDA, XPU and MTIA, recording
            # a formatted stack trace for each (2-3 ms a client); the CPU generator ends in the same state
            torch.default_generator.manual_seed(seed)
        yield


class ClientHost:
    """Hosts the virtual clients of one partition: trains them with the algorithm's hooks, pre-aggregates results."""

    def __init__(
        self,
        host_id: int,
        dataset: FederatedDataset,
        model_cfg: ModelConfig,
        algorithm: Algorithm,
        backend_cfg: BackendConfig,
        init_seed: int,
        compression: CompressionConfig | None = None,
    ) -> None:
        tune_allocator()  # before any training buffer is allocated; see engine/exec/allocator.py
        self.host_id = host_id
        self.dataset = dataset
        self.algorithm = algorithm
        self.torch_threads = backend_cfg.torch_threads
        gpu_share = host_gpu_shares(backend_cfg)[host_id]  # 0 for a mixed pool's CPU-only hosts
        self.device = use_device(backend_cfg.device, gpu_share, backend_cfg.gpu_memory_fraction, host_id=host_id)
        self.model_cfg = model_cfg
        self.compression = compression or CompressionConfig()  # upload compression of every client's update
        self.input_spec = InputSpec.of(dataset.input_kind, dataset.num_classes, dataset.x, dataset.meta)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(init_seed)  # the host's template; its weights are always overwritten before use
            self.model: nn.Module = build_model(model_cfg, self.input_spec).to(self.device)
        # sub-model assignments (``Assignment.units``) need the model's elastic family
        self.family: ElasticFamily | None = (
            build_family(model_cfg, self.input_spec) if type(model_cfg) in FAMILIES else None
        )
        algorithm.bind_client(self.family, self.input_spec)
        self.model_cfg = model_cfg
        self._sub_models: OrderedDict[tuple[ModelConfig | None, tuple[int, ...]], nn.Module] = OrderedDict()
        self._other_models: OrderedDict[ModelConfig, tuple[nn.Module, ElasticFamily | None]] = OrderedDict()
        self._eval_model: nn.Module | None = None  # the algorithm's evaluation model, built on first use
        # data.normalize=client: each client's own channel statistics, computed once on first use (a client's
        # training data never changes, so this is "before training starts" for that client)
        self._per_client_norm = dataset.meta.get("normalize") == "client" and dataset.input_kind != "tokens"
        self._client_specs: dict[int, InputSpec] = {}
        self.clients_trained = 0  # clients this host has run since it was built (work-conserving dispatch's share)
        # units of work finished (training forward passes, clients, test batches, uploads reduced): the progress the
        # Ray watchdog reads from a thread of its own, to tell a host blocked with the interpreter lock released
        # (engine/ray/watchdog.py)
        self.work_done = 0
        # backend.slow_hosts, the test and benchmark hook: this host takes ``slow_factor`` times as long per client
        slow = backend_cfg.slow_hosts
        self.slow_factor = slow[host_id] if host_id < len(slow) else 1.0

    def ready(self) -> int:
        """Round-trip used to wait for actor start-up."""
        return self.host_id

    def trained(self) -> int:
        """How many clients this host has run since it was built (``clients_trained``)."""
        return self.clients_trained

    def _load(self, params: Mapping[str, torch.Tensor], model: nn.Module | None = None) -> None:
        with torch.no_grad():
            for name, tensor in (self.model if model is None else model).state_dict().items():
                if name in params:
                    tensor.copy_(params[name])

    def _architecture(self, config: ModelConfig | None) -> tuple[nn.Module, ElasticFamily | None]:
        """The full model and elastic family of an architecture (the run's own for ``None`` or the run's config);
        other architectures are built once and kept while they recur (their weights are always overwritten)."""
        if config is None or config == self.model_cfg:
            return self.model, self.family
        built = self._other_models.pop(config, None)
        if built is None:
            with torch.device("meta"):
                module = build_model(config, self.input_spec)
            family = build_family(config, self.input_spec) if type(config) in FAMILIES else None
            built = (module.to_empty(device=self.device), family)
        self._other_models[config] = built
        while len(self._other_models) > _SUB_MODEL_CACHE:
            self._other_models.popitem(last=False)
        return built

    def _model_for(
        self, assignment: Assignment, base: Mapping[str, torch.Tensor], config: ModelConfig | None = None
    ) -> nn.Module:
        """The model a client trains, loaded with its part of the global weights: the global model itself, or a
        real, smaller sub-model built by the family (kept for reuse while the same structure recurs). ``base`` holds
        the model's tensors under their own names (``model_params`` of the flat dict)."""
        full, family = self._architecture(config)
        if assignment.units is None:
            self._load(base, full)
            return full
        if family is None:
            raise ValueError("a sub-model was assigned, but the model has no elastic family")
        key = (None if full is self.model else config, assignment.units)
        model = self._sub_models.pop(key, None)
        if model is None:
            with torch.device("meta"):
                model = family.build(assignment.units)  # no wasted random init: every tensor is loaded below
            model = model.to_empty(device=self.device)
        self._sub_models[key] = model
        while len(self._sub_models) > _SUB_MODEL_CACHE:
            self._sub_models.popitem(last=False)
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                tslice = assignment.slices.get(name)
                tensor.copy_(base[name] if tslice is None else gather(base[name], tslice))
        return model

    def run_round(
        self,
        tasks: Sequence[TrainTask],
        params: NumpyParams,
        shard_of: Mapping[str, int],
        num_shards: int,
        initial: NumpyParams | None,
        *memories: ClientMemory | None,
    ) -> tuple[object, ...]:
        """Train ``tasks`` in client-id order.

        Returns ``num_shards`` partial sums as numpy arrays (one per shard, so Ray can route each to its shard as its
        own object)
        followed by the list of per-client ``ClientOutcome``s. When the round's clients carry memories
        (``client_state.keeps_state``), ``memories`` holds each task's (aligned with ``tasks``, ``None`` for a client
        with none yet) and every task's next memory follows the outcomes, in the order of ``tasks``. ``initial`` is
        the run's initial value of every global tensor (``client_state.first_values``), what padding falls back to
        where a client's memory has nothing; it is needed only when a client pads.
        """
        partial: Partial = {}

        def reduce(_: int, update: ClientUpdate, shapes: Mapping[str, torch.Size]) -> None:
            self.algorithm.reducer.accumulate(partial, update, shapes)

        outcomes, after = self._train_all(tasks, params, initial, memories, reduce)
        shares = [as_arrays(p) for p in split_partial(partial, shard_of, num_shards)]  # numpy: shards load no torch
        return (*shares, outcomes, *after)

    def run_clients(
        self,
        tasks: Sequence[TrainTask],
        params: NumpyParams,
        initial: NumpyParams | None,
        *memories: ClientMemory | None,
    ) -> tuple[object, ...]:
        """Train ``tasks`` in client-id order, like ``run_round``, but keep every update apart instead of reducing:
        returns ``(uploads, outcomes)`` (each successful client's upload as the server receives it, by client id) and
        then, when the clients carry memories, every task's next memory in the order of ``tasks``. An asynchronous
        run's server applies each upload when it arrives in simulated time (``engine/policies/buffered.py``)."""
        uploads: dict[int, KeptUpload] = {}

        def keep(client_id: int, update: ClientUpdate, _: Mapping[str, torch.Size]) -> None:
            uploads[client_id] = KeptUpload.of(update)

        outcomes, after = self._train_all(tasks, params, initial, memories, keep)
        return ((uploads, outcomes), *after)

    def _train_all(
        self,
        tasks: Sequence[TrainTask],
        params: NumpyParams,
        initial: NumpyParams | None,
        memories: Sequence[ClientMemory | None],
        take: Callable[[int, ClientUpdate, Mapping[str, torch.Size]], None],
    ) -> tuple[list[ClientOutcome], list[ClientMemory | None]]:
        """Train ``tasks`` in client-id order, handing each successful update to ``take`` as it is made (with its
        client's id and the global tensors' shapes); returns every outcome and, when the clients carry memories,
        every task's next memory in the order of ``tasks`` (``run_round``, ``run_clients``)."""
        torch.set_num_threads(self.torch_threads)
        base = as_tensors(params)
        first = as_tensors(initial) if initial is not None else None
        shapes = {k: v.shape for k, v in base.items()}
        keep = keeps_state(self.algorithm, tasks)
        held = dict(zip((t.client_id for t in tasks), memories, strict=False)) if keep else {}
        outcomes: list[ClientOutcome] = []
        kept: dict[int, ClientMemory | None] = {}
        for task in sorted(tasks, key=lambda t: t.client_id):
            began = time.perf_counter()
            update, outcome, kept[task.client_id] = self._run_client(
                task, base, shapes, held.get(task.client_id), first
            )
            if update is not None and outcome.failure is None:
                take(task.client_id, update, shapes)
            outcomes.append(outcome)
            self.clients_trained += 1
            self.work_done += 1
            if self.slow_factor > 1.0:  # after the client's own timing: its outcome and records are unchanged
                time.sleep((self.slow_factor - 1.0) * (time.perf_counter() - began))
        return outcomes, [kept[t.client_id] for t in tasks] if keep else []

    def reduce_uploads(
        self, params: NumpyParams, shard_of: Mapping[str, int], num_shards: int, *memories: ClientMemory | None
    ) -> tuple[object, ...]:
        """The reducer's partial sums over the uploads that ``memories`` (clients in id order) kept, against the
        tensors of ``params``: ``num_shards`` partials as ``run_round`` returns them, then how many uploads they hold.
        The all-device model's half on the hosts (``Backend.reduce_uploads``); a memory without an upload adds
        nothing."""
        torch.set_num_threads(self.torch_threads)
        shapes = {k: torch.Size(v.shape) for k, v in params.items()}
        partial: Partial = {}
        count = 0
        for memory in memories:
            if memory is None or memory.upload is None:
                continue
            self.algorithm.reducer.accumulate(partial, memory.upload.as_update(-1, shapes), shapes)
            count += 1
            self.work_done += 1
        shares = [as_arrays(p) for p in split_partial(partial, shard_of, num_shards)]
        return (*shares, count)

    def _run_client(
        self,
        task: TrainTask,
        base: Mapping[str, torch.Tensor],
        shapes: Mapping[str, torch.Size],
        memory: ClientMemory | None,
        initial: Mapping[str, torch.Tensor] | None = None,
    ) -> tuple[ClientUpdate | None, ClientOutcome, ClientMemory | None]:
        """One client: receive (what the links deliver, padded), train, send (what the links deliver); returns the
        update to aggregate, the outcome and the client's next memory. Each step is a function of its own below."""
        began = time.perf_counter()
        own = _own_tensors(task, base, shapes, initial)
        if self.algorithm.train.noop:
            return self._noop_client(task, own, memory, began)
        down = _download(self.family, task.link, task.assignment, own.params)
        if down.trained == 0:  # nothing arrived and nothing to pad with
            return None, _lost_outcome(task, down), memory
        model = self._received_model(task, down, own, memory)
        bytes_down = down.bytes if down.bytes is not None else self._model_bytes(model)
        update, keeps_state = self._train(task, model, down.assignment, memory)
        train_wall_s = time.perf_counter() - began
        failure = None if _finite(update) else "nan_update"
        after = memory if failure else _next_memory(memory, update, model, down.assignment, task.link, keeps_state)
        up = _upload(self.family, task.link, update, down, own.shapes)
        failure = failure or ("link_up" if up.lost else None)
        received = _under_model(up.received if failure else self._compress(up.received, task, own), own.model_id)
        if failure is None:
            after = _with_upload(after, task, received)
        outcome = _outcome(
            task,
            received,
            bytes_down=bytes_down,
            bytes_up=self._bytes_up(up.sent),
            failure=failure,
            train_wall_s=train_wall_s,
            p_down=down.p_down,
            p_up=up.p_up,
        )
        return received, outcome, after

    def _noop_client(
        self, task: TrainTask, own: _OwnTensors, memory: ClientMemory | None, began: float
    ) -> tuple[ClientUpdate, ClientOutcome, ClientMemory | None]:
        """``train.noop``: the client sends back what it received, untrained (``_noop_update``); links and upload
        compression do not apply to it. ``_run_client``'s result for such a client."""
        update, bytes_down = self._noop_update(task, own.params)
        outcome = _outcome(
            task,
            update,
            bytes_down=bytes_down,
            bytes_up=self._bytes_up(update),
            failure=None,
            train_wall_s=time.perf_counter() - began,
        )
        received = _under_model(update, own.model_id)
        return received, outcome, _with_upload(memory, task, received)

    def _received_model(
        self, task: TrainTask, down: _Download, own: _OwnTensors, memory: ClientMemory | None
    ) -> nn.Module:
        """The model the client trains, loaded with what arrived; under padding, the positions of the levels that did
        not arrive take the client's own values (its memory where it has one, the run's initial values elsewhere)."""
        model = self._model_for(down.assignment, own.params, _architecture_of(task))
        if down.pads:
            if own.initial is None:
                raise RuntimeError("padding needs the run's initial global parameters (run_round's ``initial``)")
            filler = own_global(own.initial, memory, own.model_id)
            self._pad(model, down.assignment, down.arrived_level, own.params, filler)
        return model

    def _train(
        self, task: TrainTask, model: nn.Module, assignment: Assignment, memory: ClientMemory | None
    ) -> tuple[ClientUpdate, bool]:
        """Local training of ``model`` (the client's ``assignment``, its algorithm state from ``memory``) by the
        round's algorithm (a phased run's: that of the round's phase) under the client's seeded generators; returns
        the update, on the CPU, and whether that algorithm keeps per-client state."""
        run = dataclasses.replace(
            task, assignment=assignment, client_state=memory.algo_state if memory is not None else None
        )
        x, y = self.dataset.client_train(task.client_id)
        with _seeded_rng(task, self.device):
            algorithm = capabilities.for_round(self.algorithm, task.round_idx)
            ctx = ClientContext.of(run, model, self._spec_of(task.client_id, x))
            # every forward pass of the client's model is progress the watchdog sees, so a client that trains for
            # longer than the stall limit is not taken for a stuck host (the hook reads and changes nothing)
            counting = model.register_forward_pre_hook(self._count_step)
            try:
                update = _on_cpu(algorithm.local_train(ctx, x, y))
            finally:
                counting.remove()
        return update, algorithm.keeps_client_state

    def _count_step(self, module: nn.Module, args: object) -> None:
        self.work_done += 1

    def _compress(self, update: ClientUpdate, task: TrainTask, own: _OwnTensors) -> ClientUpdate:
        """The update as the server receives it under upload compression: what the client sent plus the dequantised
        update (``system/compression.py``); unchanged without compression."""
        if self.compression.kind == "none":
            return update
        return compress_update(update, own.params, self.compression, seed=task.seed, round_idx=task.round_idx)

    @staticmethod
    def _model_bytes(model: nn.Module) -> int:
        return params_bytes({k: v for k, v in model.state_dict().items() if v.is_floating_point()})

    @staticmethod
    def _pad(
        model: nn.Module,
        assignment: Assignment,
        arrived: Assignment | None,
        base: Mapping[str, torch.Tensor],
        own: Mapping[str, torch.Tensor],
    ) -> None:
        """Local model padding (Eq. 5): the positions that did not arrive take the client's own values (``own``:
        ``client_state.own_global``)."""
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                if name in base and name in own:
                    tensor.copy_(padded_tensor(name, base[name], own[name], assignment, arrived))

    def _noop_update(self, task: TrainTask, base: Mapping[str, torch.Tensor]) -> tuple[ClientUpdate, int]:
        """``train.noop``: the client returns the weights it received, untrained (the engine's own cost alone); a full
        model's are the global tensors themselves, not copied. Returns the update and the bytes downloaded."""
        if task.assignment.units is None:
            values: dict[str, torch.Tensor] = dict(base)
        else:
            model = self._model_for(task.assignment, base, _architecture_of(task))
            values = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}
        num_examples = self.dataset.num_examples(task.client_id)
        update = ClientUpdate(
            client_id=task.client_id,
            weight=capabilities.for_round(self.algorithm, task.round_idx).client_weight(num_examples),
            values=values,
            slices=dict(task.assignment.slices),
            num_examples=num_examples,
            train_loss=0.0,
            num_steps=0,
        )
        return update, params_bytes(values)

    def _spec_of(self, client_id: int, x: np.ndarray) -> InputSpec:
        """The input spec a client's training samples are converted with (its own statistics under
        ``data.normalize: client``)."""
        if not self._per_client_norm:
            return self.input_spec
        spec = self._client_specs.get(client_id)
        if spec is None:
            spec = self._client_specs[client_id] = client_spec(self.input_spec, x)
        return spec

    def _bytes_up(self, update: ClientUpdate) -> int:
        """Bytes the client uploads: its values as they are, or their compressed encoding."""
        if self.compression.kind == "none":
            return params_bytes(update.values)
        return upload_bytes((v.numel() for v in update.values.values()), self.compression)

    def evaluate(
        self,
        params: NumpyParams,
        batch_ids: Sequence[int],
        batch_size: int,
        units: tuple[int, ...] | None = None,
        model_config: ModelConfig | None = None,
    ) -> EvalStats:
        """Loss and accuracy of ``params`` on the given fixed-size batches of the test set; with ``units`` (the
        algorithm's ``eval_units``) on the first-k sub-model of that structure instead of the full model; with
        ``model_config`` as that architecture (one of several global models, ``params`` under its own names)."""
        torch.set_num_threads(self.torch_threads)
        if units is not None:
            family = self._architecture(model_config)[1]
            if family is None:
                raise ValueError("a sub-model was asked to be evaluated, but the model has no elastic family")
            sub = Assignment(slices=family.slices(first_k(units)), units=tuple(int(u) for u in units))
            model = self._model_for(sub, as_tensors(params), model_config)
        elif model_config is not None and model_config != self.model_cfg:
            model = self._architecture(model_config)[0]
            self._load(as_tensors(params), model)
        else:
            if self._eval_model is None:
                built = capabilities.eval_model(self.algorithm)
                self._eval_model = self.model if built is None else built.to(self.device)
            model = self._eval_model
            self._load(as_tensors(params), model)
        model.eval()
        ds = self.dataset
        n = len(batch_ids)
        loss_sum, correct, count = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        masks: list[np.ndarray] = []
        nonfinite = 0
        with torch.no_grad():
            for i, b in enumerate(batch_ids):
                lo, hi = b * batch_size, min((b + 1) * batch_size, len(ds.y_test))
                logits = model(to_input(ds.x_test[lo:hi], self.input_spec, self.device))
                labels = torch.from_numpy(np.asarray(ds.y_test[lo:hi], dtype=np.int64)).to(self.device)
                loss_sum[i] = float(nn.functional.cross_entropy(logits, labels, reduction="sum"))
                nonfinite += int((~torch.isfinite(logits).all(dim=1)).sum())
                right = logits.argmax(dim=1) == labels
                correct[i] = int(right.sum())
                count[i] = hi - lo
                masks.append(right.cpu().numpy())
                self.work_done += 1
        return EvalStats(
            batch_ids=np.asarray(batch_ids, dtype=np.int64),
            loss_sum=loss_sum,
            correct=correct,
            count=count,
            correct_mask=tuple(masks),
            nonfinite=nonfinite,
        )


@dataclass(frozen=True)
class _OwnTensors:
    """A task's model's part of the round's tensors, under the model's own names (``fl/common/multimodel.py``): the
    global tensors, their shapes and the run's initial values that padding falls back to (``None``: none sent)."""

    model_id: int
    params: Mapping[str, torch.Tensor]
    shapes: Mapping[str, torch.Size]
    initial: Mapping[str, torch.Tensor] | None


def _architecture_of(task: TrainTask) -> ModelConfig | None:
    """The architecture of the model ``task`` trains, as its config (``None``: the run's own)."""
    return None if task.model_config is None else as_model_config(task.model_config)


def _own_tensors(
    task: TrainTask,
    base: Mapping[str, torch.Tensor],
    shapes: Mapping[str, torch.Size],
    initial: Mapping[str, torch.Tensor] | None,
) -> _OwnTensors:
    """The tensors of the model ``task`` trains, taken from the flat dicts of every model; a single-model run's are
    the flat dicts themselves."""
    model_id = task.assignment.model_id
    if model_id == 0 and task.model_config is None:
        return _OwnTensors(model_id=model_id, params=base, shapes=shapes, initial=initial)
    params = model_params(base, model_id)
    return _OwnTensors(
        model_id=model_id,
        params=params,
        shapes={k: v.shape for k, v in params.items()},
        initial=None if initial is None else model_params(initial, model_id),
    )


@dataclass(frozen=True)
class _Download:
    """What a client's links deliver of the model sent down (``system/links.py``): the assignment's nested transfer
    levels (the assignment alone under perfect links), how many of them arrived, how many the client trains (all of
    them when it pads what was lost, else those that arrived), the width ratio that arrived (NaN: perfect links) and
    the bytes put on the wire (``None``: perfect links, where the trained model's own bytes count)."""

    levels: tuple[Assignment, ...]
    arrived: int
    trained: int
    p_down: float
    bytes: int | None

    @property
    def assignment(self) -> Assignment:
        """The part of the model the client trains (the last level it trains)."""
        return self.levels[self.trained - 1]

    @property
    def arrived_level(self) -> Assignment | None:
        """The largest level that arrived (``None``: none did)."""
        return self.levels[self.arrived - 1] if self.arrived else None

    @property
    def pads(self) -> bool:
        """Whether the client trains levels that did not arrive, filled from its own values."""
        return self.trained > self.arrived


def _download(
    family: ElasticFamily | None, link: LinkDraw | None, assignment: Assignment, params: Mapping[str, torch.Tensor]
) -> _Download:
    """What ``link`` delivers of ``assignment``'s part of ``params`` (the model's own global tensors)."""
    if link is None:
        return _Download(levels=(assignment,), arrived=1, trained=1, p_down=math.nan, bytes=None)
    levels = tuple(column_levels(family, assignment, link.column_ratio))
    arrived = delivered(link.down_run, len(levels))
    return _Download(
        levels=levels,
        arrived=arrived,
        trained=len(levels) if link.padding else arrived,
        p_down=level_ratio(family, levels, arrived),
        bytes=_level_bytes(params, levels[attempted(link.down_run, len(levels)) - 1]),
    )


def _level_bytes(base: Mapping[str, torch.Tensor], level: Assignment) -> int:
    """Bytes of the global tensors' part that a transfer level moves."""
    shapes = {k: tuple(v.shape) for k, v in base.items()}
    size = {k: v.element_size() for k, v in base.items()}
    return sum(slice_numel({k: shapes[k]}, level) * size[k] for k in shapes)


@dataclass(frozen=True)
class _Upload:
    """What a client's links deliver of its trained update: the part the server receives, the part put on the wire
    (what arrived plus the level that was lost; its bytes are the upload's), the width ratio that arrived (NaN:
    perfect links) and whether nothing did."""

    received: ClientUpdate
    sent: ClientUpdate
    p_up: float
    lost: bool


def _upload(
    family: ElasticFamily | None,
    link: LinkDraw | None,
    update: ClientUpdate,
    down: _Download,
    shapes: Mapping[str, torch.Size],
) -> _Upload:
    """What ``link`` delivers of ``update``, trained on ``down.trained`` levels (``shapes``: the model's global
    tensors' shapes)."""
    if link is None:
        return _Upload(received=update, sent=update, p_up=math.nan, lost=False)
    arrived = delivered(link.up_run, down.trained)
    return _Upload(
        received=_cut(update, down.levels, arrived, down.trained, shapes),
        sent=_cut(update, down.levels, attempted(link.up_run, down.trained), down.trained, shapes),
        p_up=level_ratio(family, down.levels, arrived),
        lost=arrived == 0,
    )


def _next_memory(
    memory: ClientMemory | None,
    update: ClientUpdate,
    model: nn.Module,
    assignment: Assignment,
    link: LinkDraw | None,
    keeps_state: bool,
) -> ClientMemory | None:
    """A client's memory after it trained ``assignment`` of ``model`` successfully: the algorithm's state of it
    (when the algorithm ``keeps_state``) and, when its links pad, its trained parameters (at the links'
    ``memory_dtype``) with their slices; its kept upload carries over. Unchanged when it needs neither."""
    padding = link if link is not None and link.padding else None
    if not keeps_state and padding is None:
        return memory
    return ClientMemory(
        params=None if padding is None else _float_state(model, padding.memory_dtype),
        slices=None if padding is None else dict(assignment.slices),
        algo_state=update.client_state,
        model_id=assignment.model_id,
        upload=memory.upload if memory is not None else None,
    )


def _outcome(
    task: TrainTask,
    update: ClientUpdate,
    *,
    bytes_down: int,
    bytes_up: int,
    failure: str | None,
    train_wall_s: float,
    p_down: float = math.nan,
    p_up: float = math.nan,
) -> ClientOutcome:
    """What the driver hears of a client that trained: ``update``'s numbers (as the server receives it) and metrics,
    the bytes moved, the failure if any, the training time and the width ratios that arrived (NaN: perfect links)."""
    return ClientOutcome(
        client_id=task.client_id,
        num_examples=update.num_examples,
        train_loss=update.train_loss,
        num_steps=update.num_steps,
        bytes_down=bytes_down,
        bytes_up=bytes_up,
        failure=failure,
        train_wall_s=train_wall_s,
        p_down=p_down,
        p_up=p_up,
        model_id=task.assignment.model_id,
        metrics=dict(update.metrics),
    )


def _lost_outcome(task: TrainTask, down: _Download) -> ClientOutcome:
    """What the driver hears of a client whose download lost every level it would train (``link_down``): no update,
    no training, the bytes put on the wire down and none up."""
    return ClientOutcome(
        client_id=task.client_id,
        num_examples=0,
        train_loss=math.nan,
        num_steps=0,
        bytes_down=down.bytes or 0,
        bytes_up=0,
        failure="link_down",
        train_wall_s=0.0,
        p_down=down.p_down,
        p_up=0.0,
        model_id=task.assignment.model_id,
    )


def _on_cpu(update: ClientUpdate) -> ClientUpdate:
    """The update with its values on the CPU (unchanged, not copied, when they are there already)."""
    if all(v.device.type == "cpu" for v in update.values.values()):
        return update
    return dataclasses.replace(update, values={k: v.cpu() for k, v in update.values.items()})


def _with_upload(memory: ClientMemory | None, task: TrainTask, update: ClientUpdate) -> ClientMemory | None:
    """``memory`` with ``update`` (as the server receives it) as the client's kept upload, when the task asks."""
    if not task.keep_upload:
        return memory
    return dataclasses.replace(memory or ClientMemory(), upload=KeptUpload.of(update))


def _float_state(model: nn.Module, dtype: str = "float32") -> dict[str, np.ndarray]:
    """A copy of the model's floating tensors, on the CPU (a client's memory): as they are, or rounded to half
    precision for ``float16`` (padding casts them back to the model's dtype)."""
    half = dtype == "float16"
    return {
        k: (v.detach().half() if half else v.detach()).cpu().numpy().copy()
        for k, v in model.state_dict().items()
        if v.is_floating_point()
    }


def _cut(
    update: ClientUpdate, levels: Sequence[Assignment], count: int, trained: int, shapes: Mapping[str, torch.Size]
) -> ClientUpdate:
    """The part of ``update`` (trained at level ``trained``) within its first ``count`` transfer levels."""
    if count >= trained or count == 0:
        return update if count >= trained else dataclasses.replace(update, values={}, slices={})
    return restrict_update(update, levels[count - 1], shapes)


def _under_model(update: ClientUpdate, model_id: int) -> ClientUpdate:
    """The update with its tensors and slices named as model ``model_id``'s entries of the flat parameter dict."""
    if model_id == 0:
        return update
    return dataclasses.replace(
        update,
        values={model_key(model_id, k): v for k, v in update.values.items()},
        slices={model_key(model_id, k): v for k, v in update.slices.items()},
    )


def _finite(update: ClientUpdate) -> bool:
    return math.isfinite(update.train_loss) and all(bool(torch.isfinite(v).all()) for v in update.values.values())
