"""Bytes the parameter-server shards are sent per round (issue 32, finding 8), measured on Ray's object store.

Each round the driver puts the global tensors in the object store; every shard's ``reduce`` call names what it is
sent. Before issue 32 every shard was sent the whole model (one object), so S shards on S nodes pulled S models per
round; now each shard is sent only its own tensors (one object per shard), and a host maps all the parts. This puts
one round's tensors the way ``RayBackend._put`` does for a model (ResNet-18 at CIFAR size by default) and reads the
objects' sizes back from Ray (``ray.experimental.get_object_locations``):

    python benchmarks/shard_bytes.py                 # S = 1, 2, 4
    python benchmarks/shard_bytes.py --model cnn

Printed per S: the bytes every shard is sent per round before (S x the whole model) and after (the sum of the shards'
own objects), and the largest single shard's object.
"""

from __future__ import annotations

import argparse
import json

import ray

from rayfl.config.model import CNNConfig, ResNetConfig
from rayfl.engine.exec.param_server import plan_shards
from rayfl.models import InputSpec, build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["resnet18", "cnn"], default="resnet18")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    config = ResNetConfig() if args.model == "resnet18" else CNNConfig()
    model = build_model(config, InputSpec("image", 10, (3, 32, 32)))
    arrays = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    whole = ray.put(arrays)
    whole_bytes = ray.experimental.get_object_locations([whole])[whole]["object_size"]
    rows = []
    for s in args.shards:
        shard_of = plan_shards({k: tuple(v.shape) for k, v in arrays.items()}, s)
        parts = [ray.put({n: arrays[n] for n, k in shard_of.items() if k == shard}) for shard in range(s)]
        sizes = [ray.experimental.get_object_locations([p])[p]["object_size"] for p in parts]
        rows.append(
            {
                "shards": s,
                "before_bytes_per_round": s * whole_bytes,
                "after_bytes_per_round": sum(sizes),
                "largest_shard_object": max(sizes),
            }
        )
    ray.shutdown()
    print(json.dumps({"model": args.model, "model_object_bytes": whole_bytes, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
