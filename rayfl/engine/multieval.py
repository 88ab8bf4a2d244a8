"""Evaluation and record columns of runs that hold several global models (``ServerState.models``).

Each model is scored on the whole test set (its test accuracy), and, where the data set splits its test set by client,
every client's test rows are scored on the model the algorithm would assign it (``capabilities.client_model``, which
sees the client's budgets at the evaluated round's end); the mean of those per-client accuracies is paper 002's
"average client accuracy", and each client's own figure is recorded (``client_accs.csv``, the report's box plot).
Single-model runs get the average client accuracy too (on the one evaluated model) and keep every other column as
before.

The device average (``device_accuracy``) needs no per-client test data: every device of the run is scored by the
whole-test-set accuracy of the evaluation that scores its model (``Algorithm.device_evals``), so a model counts as
often as devices use it.

The all-device model (``evaluate_all_devices``, ``eval_all_devices``) is what paper 001 reports ("Reporting Results":
the server models averaged over all devices, not only the round's active ones, for reporting alone; training is
unchanged). It is the algorithm's own reducer applied to every client's last upload that reached the server (kept in
the client's memory, ``engine/exec/client_state.py``), elements no upload covers keeping the global values; FedHeN's
simple part is then the mean over all devices, its deep part the mean over all complex devices, and Decouple's two
models the means over all simple and all complex devices. Every evaluation of the round is repeated on it: the main
one (``all_devices_acc``), each structure and further model (``all_devices/<name>`` rows in evals.csv) and the device
average (``all_devices_device_acc``). Choices where the paper is silent: a device that never trained has no model
and is left out (the paper's runs are long enough that every device has trained), and a device's model is its last
upload as the server received it (after link cuts and compression), the only version a server could average.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rayfl.config.model import as_model_config
from rayfl.core.messages import ClientOutcome, ClientView, ServerState
from rayfl.data.federated import FederatedDataset
from rayfl.engine.exec.backend import Backend, EvalResult
from rayfl.engine.persist.records import ClientAccRecord, EvalRecord
from rayfl.fl.api import capabilities
from rayfl.fl.api.algorithm import MAIN_EVAL, Algorithm
from rayfl.fl.common.multimodel import model_params
from rayfl.models.elastic.spec import SubModelSpec

if TYPE_CHECKING:
    from rayfl.models.elastic import ElasticFamily

__all__ = [
    "ALL_DEVICES",
    "client_accuracies",
    "device_accuracy",
    "evaluate_all_devices",
    "evaluate_models",
    "model_fields",
    "named_accuracies",
    "named_evaluations",
    "uniform_device_accuracy",
    "uniform_device_eval",
    "width_structures",
]


def evaluate_models(backend: Backend, algorithm: Algorithm, state: ServerState, first: EvalResult) -> list[EvalResult]:
    """Every global model's evaluation in id order. ``first`` is model 0's (the engine's usual evaluation of
    ``eval_params``/``eval_units``); models ``k > 0`` are scored as their own architecture on ``eval_params``'s
    tensors of that model."""
    if len(state.models) <= 1:
        return [first]
    params = capabilities.eval_params(algorithm, state)
    results = [first]
    for model_id in range(1, len(state.models)):
        results.append(backend.evaluate(model_params(params, model_id), None, as_model_config(state.models[model_id])))
    return results


def width_structures(family: ElasticFamily | None, widths: Sequence[float]) -> dict[str, tuple[int, ...]]:
    """The first-k uniform sub-model at each width ratio (``eval_widths``), named ``x{p}``."""
    if not widths:
        return {}
    if family is None:
        raise ValueError("eval_widths: the model has no elastic family, so it has no x p sub-models to evaluate")
    space = family.space
    return {f"x{p:g}": space.units(SubModelSpec.uniform(space, float(p)).ratios) for p in widths}


def named_evaluations(
    algorithm: Algorithm, state: ServerState, evals: Sequence[EvalResult], structures: Mapping[str, EvalResult]
) -> dict[str, EvalResult]:
    """Every evaluation of a round by name: the main one (``MAIN_EVAL``), each structure of
    ``capabilities.eval_structures`` and each global model after the first (``model_names``)."""
    named = {MAIN_EVAL: evals[0], **structures}
    names = algorithm.model_names(state)
    if len(names) != len(evals):
        raise ValueError(f"{algorithm.name}: model_names gives {len(names)} names for {len(evals)} global models")
    named.update(zip(names[1:], evals[1:], strict=True))
    return named


def named_accuracies(
    algorithm: Algorithm, state: ServerState, evals: Sequence[EvalResult], structures: Mapping[str, EvalResult]
) -> dict[str, float]:
    """The accuracy of every evaluation of ``named_evaluations``."""
    return {name: e.accuracy for name, e in named_evaluations(algorithm, state, evals, structures).items()}


def device_accuracy(
    accs: Mapping[str, float], algorithm: Algorithm, state: ServerState, views: Sequence[ClientView]
) -> float:
    """The mean over the devices ``views`` of the accuracy of the evaluation each device's model has."""
    names = algorithm.device_evals(state, views)
    if not names:
        return math.nan
    unknown = sorted(set(names) - set(accs))
    if unknown:
        raise ValueError(f"{algorithm.name}: device_evals names {unknown}, not one of the evaluations {sorted(accs)}")
    return float(np.mean([accs[name] for name in names]))


def uniform_device_accuracy(accuracy: float, num_devices: int) -> float:
    """``device_accuracy`` when every one of ``num_devices`` devices is scored by one evaluation of ``accuracy``: the
    same mean of as many equal values, bit for bit, without a view of any device."""
    return float(np.mean(np.full(num_devices, accuracy)))


def uniform_device_eval(algorithm: Algorithm, state: ServerState) -> str | None:
    """The evaluation that scores every device when no device's budgets can change it (one global model and the
    default ``Algorithm.device_evals``: every device uses that model), else ``None``. The device average is then that
    evaluation's accuracy, and the engine spares itself a check-in of every client of the run each evaluated round."""
    names = algorithm.model_names(state)
    if len(names) != 1 or type(algorithm).device_evals is not Algorithm.device_evals:
        return None
    return names[0]


ALL_DEVICES = "all_devices"  # prefix of the all-device model's evals.csv rows and its record columns


def evaluate_all_devices(
    backend: Backend,
    algorithm: Algorithm,
    state: ServerState,
    structures: Mapping[str, tuple[int, ...] | None],
    views: Sequence[ClientView] | int,
    round_idx: int,
) -> tuple[dict[str, float], list[EvalRecord]]:
    """The all-device model's record fields (its main evaluation's accuracy and loss, the device average on it) and
    its evals.csv rows (each of ``structures`` and each further global model), after the round's state ``state``;
    NaN and no rows while no client has uploaded. ``views``: every device with its budgets now, or only their number
    where one evaluation scores every device (``uniform_device_eval``)."""
    aggregate = backend.reduce_uploads(state.params)
    if aggregate.num_clients == 0:
        return {}, []
    report = dataclasses.replace(state, params=aggregate.params)
    params = capabilities.eval_params(algorithm, report)
    main = backend.evaluate(params, algorithm.eval_units(report))
    evals = evaluate_models(backend, algorithm, report, main)
    scored = {name: backend.evaluate(params, units) for name, units in structures.items()}
    accs = named_accuracies(algorithm, report, evals, scored)
    named = [*scored.items(), *zip(algorithm.model_names(report)[1:], evals[1:], strict=True)]
    fields = {
        f"{ALL_DEVICES}_acc": main.accuracy,
        f"{ALL_DEVICES}_loss": main.loss,
        f"{ALL_DEVICES}_device_acc": _device_accuracy(accs, algorithm, report, views),
    }
    return fields, [EvalRecord(round_idx, f"{ALL_DEVICES}/{n}", e.accuracy, e.loss) for n, e in named]


def _device_accuracy(
    accs: Mapping[str, float], algorithm: Algorithm, state: ServerState, views: Sequence[ClientView] | int
) -> float:
    """``device_accuracy`` over ``views``, or over their number of devices all scored by ``uniform_device_eval``."""
    if not isinstance(views, int):
        return device_accuracy(accs, algorithm, state, views)
    uniform = uniform_device_eval(algorithm, state)
    if uniform is None or uniform not in accs:
        raise ValueError(f"{algorithm.name}: the device average needs every device's view")
    return uniform_device_accuracy(accs[uniform], views)


def client_accuracies(
    dataset: FederatedDataset,
    named: Mapping[str, EvalResult],
    algorithm: Algorithm,
    state: ServerState,
    views: Sequence[ClientView],
    round_idx: int,
) -> list[ClientAccRecord]:
    """Each client with test data (``views``: every client of the run, in id order, with its budgets now): the accuracy
    of its test rows on the model it uses, the evaluation of ``named`` that ``Algorithm.device_evals`` gives it (by
    default the global model ``capabilities.client_model`` picks). Empty when the test set is not split by client or an
    evaluation carries no per-sample results."""
    offsets = dataset.test_offsets
    if offsets is None:
        return []
    names = algorithm.device_evals(state, views)
    if any(named[name].correct_mask is None for name in set(names)):
        return []
    rows: list[ClientAccRecord] = []
    model_ids = capabilities.client_models(algorithm, state, views)
    for view, name, model_id in zip(views, names, model_ids, strict=True):
        lo, hi = int(offsets[view.client_id]), int(offsets[view.client_id + 1])
        if hi == lo:
            continue
        mask = named[name].correct_mask
        assert mask is not None
        rows.append(ClientAccRecord(round_idx, view.client_id, model_id, name, float(np.mean(mask[lo:hi])), hi - lo))
    return rows


def model_fields(
    evals: Sequence[EvalResult] | None,
    state: ServerState,
    outcomes: Sequence[ClientOutcome],
    client_accs: Sequence[ClientAccRecord] = (),
) -> dict[str, Any]:
    """A round record's multi-model columns; ``evals`` is ``None`` in a round without evaluation. The average client
    accuracy is the mean of ``client_accs`` (NaN without per-client test data)."""
    count = max(1, len(state.models))
    fields: dict[str, Any] = {"num_models": count}
    if count > 1:
        trained = np.bincount([o.model_id for o in outcomes if o.failure is None], minlength=count)
        fields["clients_per_model"] = " ".join(str(int(n)) for n in trained)
    if evals is not None:
        if count > 1:
            fields["model_accs"] = " ".join(str(e.accuracy) for e in evals)
        fields["client_acc"] = float(np.mean([r.test_acc for r in client_accs])) if client_accs else math.nan
    return fields
