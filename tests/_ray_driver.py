"""Run by tests/test_ray_train.py: Ray Train's ``TorchTrainer`` on two ``jax`` workers, as
Ray's docs show it for a GPU, with the one setting ``TorchConfig(backend="jax")`` (NOTE
[Ray Train on jax]). Ray runs on this machine's loopback only; each worker writes what it
saw and its trained parameters to the folder given, which the test compares with one CPU
process. Prints ``ray driver ok`` when Ray has stopped."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

STEPS, BATCH = 3, 4  # (each worker's batch: the CPU reference takes both workers' at once)


def make_model_and_data():
    """The model and data both sides start from (seeded on the CPU)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2 * STEPS * BATCH, 5, generator=g)
    y = torch.randn(2 * STEPS * BATCH, 3, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    return model, x, y


def make_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_loop_per_worker(config):
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    model, x, y = make_model_and_data()
    shift = config["shift"]  # (a jax tensor made in the driver, unpickled before the group exists)
    device = ray.train.torch.get_device()
    model = ray.train.torch.prepare_model(model)
    optimizer = make_optimizer(model)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    loader = ray.train.torch.prepare_data_loader(loader)
    seen = set()
    for xb, yb in loader:
        seen.add(str(xb.device))
        loss = torch.nn.functional.mse_loss(model(xb), yb + shift.to(xb.device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    context = ray.train.get_context()
    rank = context.get_world_rank()
    record = {
        "rank": rank,
        "local_rank": context.get_local_rank(),
        "device": str(device),
        "current": str(torch.ones(1, device="jax").device),
        "config": str(shift.device),
        "batches": sorted(seen),
        "parameters": sorted({str(p.device) for p in model.parameters()}),
        "model": type(model).__name__,
        "backend": dist.get_backend(),
        "accelerate": os.environ.get("ACCELERATE_TORCH_DEVICE"),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "node_ip": ray.util.get_node_ip_address(),
    }
    state = {k: v.cpu() for k, v in model.module.state_dict().items()}
    torch.save(state, os.path.join(config["out"], f"rank{rank}.pt"))
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)


def main(out: str) -> None:
    import ray
    from ray.air._internal.device_manager import get_torch_device_manager_by_context
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    ray.init(
        _node_ip_address="127.0.0.1",
        _temp_dir=os.environ["TORCH_JAX_RAY_TEMP"],
        include_dashboard=False,
        num_cpus=2,
        log_to_driver=False,
    )
    try:
        # (a process outside a jax group keeps Ray's own manager)
        driver = type(get_torch_device_manager_by_context()).__name__
        with open(os.path.join(out, "driver.json"), "w") as f:
            json.dump({"manager": driver}, f)
        trainer = TorchTrainer(
            train_loop_per_worker,
            # (zeros: the CPU reference has no shift)
            train_loop_config={"out": out, "shift": torch.zeros(3, device="jax")},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            torch_config=TorchConfig(backend="jax"),
            run_config=RunConfig(storage_path=os.path.join(out, "runs"), name="jax"),
        )
        trainer.fit()
    finally:
        ray.shutdown()
    print("ray driver ok")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
